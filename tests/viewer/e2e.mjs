// SPDX-License-Identifier: AGPL-3.0-or-later
// The viewer end to end in real headless Chromium: node e2e.mjs URL SCREENSHOT
import { chromium } from "playwright-core";

const [url, shot] = process.argv.slice(2);
const step = (what) => console.log(`- ${what}`);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("console", (m) => console.log(`  [browser] ${m.text()}`));
  page.on("pageerror", (e) => console.log(`  [page error] ${e.message}`));
  await page.goto(url);
  step("objects appear");
  await page.waitForSelector('#objects li[data-name="door"]', { timeout: 30000 });
  await page.waitForFunction(() => Number(document.body.dataset.tick) > 0, null, { timeout: 30000 });
  step("a new visitor chooses a name, and enters with a browser-made key");
  await page.waitForSelector("#name-form:not([hidden])", { timeout: 30000 });
  await page.fill("#name-input", "ada");
  await page.click("#name-form button");
  await page.waitForSelector('#me[data-logged-in="true"]', { timeout: 30000 });
  if (!(await page.textContent("#me")).startsWith("ada (")) throw new Error(`not named: ${await page.textContent("#me")}`);
  await page.waitForSelector('#objects li[data-name="ada"]', { timeout: 30000 });
  step("the own avatar moves on the key press, before its input is agreed, and settles where the sim put it");
  await page.waitForFunction(() => window.metatopiaOwn()?.drawn, null, { timeout: 15000 });
  const start = await page.evaluate(() => window.metatopiaOwn().committed);
  await page.focus("#map");
  for (let i = 0; i < 6; i++) {
    await page.keyboard.down("ArrowRight");
    await page.waitForTimeout(200);
    await page.keyboard.up("ArrowRight");
    await page.waitForTimeout(300);
  }
  const lat = (await page.evaluate(() => window.metatopiaMoveLatency.slice())).sort((a, b) => a - b);
  if (lat.length < 6) throw new Error(`the avatar moved at once for ${lat.length} of 6 key presses`);
  const p50 = lat[Math.floor((lat.length - 1) / 2)];
  console.log(`  key press to the avatar's first move on screen: p50 ${p50.toFixed(1)} ms (${lat.map((x) => x.toFixed(0)).join(", ")})`);
  if (p50 > 50) throw new Error(`key press to first move: p50 ${p50.toFixed(1)} ms`);
  await page.waitForFunction(() => {
    const o = window.metatopiaOwn();
    return o && !o.predicting && Math.hypot(o.drawn[0] - o.committed[0], o.drawn[1] - o.committed[1]) < 0.01;
  }, null, { timeout: 20000 });
  const end = await page.evaluate(() => window.metatopiaOwn().committed);
  if (!(end[0] - start[0] > 1)) throw new Error(`the walk was not executed: from ${start} to ${end}`);
  step("chat, and the echo bot's reply");
  await page.fill("#chat-input", "hello from the browser");
  await page.press("#chat-input", "Enter");
  await page.waitForFunction(
    () => [...document.querySelectorAll("#chat-log li")].some((li) => li.textContent.includes("echo: hello from the browser")),
    null, { timeout: 30000 });
  step("the door's script source");
  await page.click('#objects li[data-name="door"]');
  await page.waitForFunction(() => document.querySelector("#script pre")?.textContent.includes("fn on_touch"), null, { timeout: 15000 });
  const meta = await page.textContent("#script p");
  if (!meta.includes("AGPL-3.0-or-later")) throw new Error(`no licence shown: ${meta}`);
  step("touch opens the door");
  await page.click("#touch");
  await page.waitForFunction(
    () => document.querySelector('#objects li[data-name="door"]')?.dataset.text === "door: open", null, { timeout: 30000 });
  await page.waitForFunction(
    () => [...document.querySelectorAll("#chat-log li")].some((li) => li.textContent.includes("The door opens.")),
    null, { timeout: 30000 });
  step("build: rez an object of my own beside me");
  await page.fill("#rez-name", "my lamp");
  await page.click("#rez-form button");
  await page.waitForSelector('#objects li[data-name="my lamp"]', { timeout: 30000 });
  step("edit it: a floating text");
  await page.click('#objects li[data-name="my lamp"]');
  await page.waitForSelector("#edit-form:not([hidden])", { timeout: 15000 });
  await page.fill("#edit-text", "unlit");
  await page.click("#edit-form button");
  await page.waitForFunction(
    () => document.querySelector('#objects li[data-name="my lamp"]')?.dataset.text === "unlit", null, { timeout: 30000 });
  step("drag it to move it");
  const lampId = await page.getAttribute('#objects li[data-name="my lamp"]', "data-id");
  const before = await page.getAttribute('#objects li[data-name="my lamp"]', "data-at");
  const [sx, sy] = await page.evaluate((id) => window.metatopiaScreenOf(id), lampId);
  await page.mouse.move(sx, sy);
  await page.mouse.down();
  await page.mouse.move(sx, sy + 40, { steps: 5 });
  await page.mouse.up();
  await page.waitForFunction(([id, was]) => {
    const li = document.querySelector(`#objects li[data-id="${id}"]`);
    return li && li.dataset.at !== was;
  }, [lampId, before], { timeout: 30000 });
  console.log(`  moved from ${before} to ${await page.getAttribute('#objects li[data-name="my lamp"]', "data-at")}`);
  step("fork the door's script, edit it and deploy it to my lamp");
  await page.click('#objects li[data-name="door"]');
  await page.waitForSelector("#fork:not([hidden])", { timeout: 15000 });
  await page.click("#fork");
  await page.waitForSelector("#editor:not([hidden])", { timeout: 15000 });
  const forked = await page.inputValue("#ed-source");
  if (!forked.startsWith("// metatopia: derived from script ")) throw new Error(`no fork header: ${forked.slice(0, 80)}`);
  const header = forked.split("\n")[0];
  await page.fill("#ed-source", `${header}\nfn on_touch(who) {\n    set_text("lamp lit");\n}\n`);
  await page.selectOption("#ed-target", { label: await page.evaluate(() => [...document.querySelectorAll("#ed-target option")].find((o) => o.textContent.startsWith("my lamp")).textContent) });
  await page.click("#ed-deploy");
  await page.waitForFunction(() => document.querySelector("#ed-error").textContent.startsWith("deployed"), null, { timeout: 30000 });
  step("its provenance, and the effect of a touch");
  await page.waitForFunction(() => document.querySelector("#script p")?.textContent.includes("derived from"), null, { timeout: 15000 });
  await page.waitForFunction(() => document.querySelector("#script p.provenance")?.textContent.endsWith("the original"), null, { timeout: 15000 });
  console.log(`  ${await page.textContent("#script p.provenance")}`);
  await page.click("#touch");
  await page.waitForFunction(
    () => document.querySelector('#objects li[data-name="my lamp"]')?.dataset.text === "lamp lit", null, { timeout: 30000 });
  step("a compile error is shown at its line");
  await page.fill("#ed-source", `${header}\nfn on_touch(who) {\n    set_text("x") ; ;\n}}\n`);
  await page.click("#ed-deploy");
  await page.waitForFunction(() => document.querySelector("#ed-error").dataset.line != null, null, { timeout: 30000 });
  const err = await page.textContent("#ed-error");
  if (!err.includes("does not compile")) throw new Error(`not a compile error: ${err}`);
  const line = await page.getAttribute("#ed-error", "data-line");
  const at = await page.evaluate(() => { const t = document.querySelector("#ed-source"); return t.value.slice(0, t.selectionStart).split("\n").length; });
  if (String(at) !== line) throw new Error(`the editor selects line ${at}, the error names line ${line}`);
  console.log(`  compile error shown and selected: ${err} (line ${line})`);
  await page.screenshot({ path: shot });
  step(`screenshot ${shot}`);
  if ((await page.getAttribute("#me", "data-signer")) !== "webcrypto") throw new Error("expected WebCrypto's Ed25519 in Chromium");

  step("a browser without WebCrypto Ed25519 signs with the shipped TweetNaCl");
  const plain = await browser.newContext();
  await plain.addInitScript(() => {
    const subtle = crypto.subtle;
    for (const f of ["generateKey", "importKey"]) {
      const orig = subtle[f].bind(subtle);
      subtle[f] = (...a) => JSON.stringify(a).includes("Ed25519") ? Promise.reject(new Error("no Ed25519 here")) : orig(...a);
    }
  });
  const old = await plain.newPage();
  old.on("pageerror", (e) => console.log(`  [page error] ${e.message}`));
  await old.goto(url);
  await old.waitForSelector("#name-form:not([hidden])", { timeout: 30000 });
  await old.fill("#name-input", "old-browser");
  await old.press("#name-input", "Enter");
  await old.waitForSelector('#me[data-logged-in="true"]', { timeout: 30000 });
  if ((await old.getAttribute("#me", "data-signer")) !== "tweetnacl") throw new Error("expected the TweetNaCl fallback");
  step("another player walking is drawn moving at the display's frame rate, between ticks");
  await page.waitForSelector('#objects li[data-name="old-browser"]', { timeout: 30000 });
  const otherId = await page.getAttribute('#objects li[data-name="old-browser"]', "data-id");
  await old.focus("#map");
  await old.keyboard.down("ArrowUp");
  await page.waitForFunction((id) => {
    const a = window.metatopiaDrawnOf(id);
    window.__firstAt = window.__firstAt || a;
    return a && window.__firstAt && a[1] > window.__firstAt[1] + 0.3;
  }, otherId, { timeout: 30000 });
  const smooth = await page.evaluate((id) => new Promise((done) => {
    const seen = new Set(), t0 = performance.now(), ticks0 = window.metatopiaTicksSeen();
    const frame = () => {
      const a = window.metatopiaDrawnOf(id);
      if (a) seen.add(a.join(","));
      if (performance.now() - t0 < 1000) requestAnimationFrame(frame);
      else done({ positions: seen.size, ticks: window.metatopiaTicksSeen() - ticks0 });
    };
    requestAnimationFrame(frame);
  }), otherId);
  await old.keyboard.up("ArrowUp");
  console.log(`  a walking player drawn at ${smooth.positions} positions in a second, from ${smooth.ticks} tick messages`);
  if (!(smooth.positions >= 30 && smooth.positions > 1.5 * smooth.ticks)) {
    throw new Error(`not smooth: ${smooth.positions} positions from ${smooth.ticks} tick messages in a second`);
  }
  await old.fill("#chat-input", "signed by tweetnacl");
  await old.press("#chat-input", "Enter");
  await old.waitForFunction(
    () => [...document.querySelectorAll("#chat-log li")].some((li) => li.textContent.includes("echo: signed by tweetnacl")),
    null, { timeout: 30000 });
  step("log out: the avatar leaves at once");
  await old.waitForSelector('#objects li[data-name="old-browser"]', { timeout: 30000 });
  await old.click("#logout");
  await old.waitForSelector('#me[data-logged-in="false"]', { timeout: 30000 });
  await old.waitForSelector('#objects li[data-name="old-browser"]', { state: "detached", timeout: 30000 });
  await old.waitForSelector("#name-form:not([hidden])", { timeout: 5000 });
  step("a returning visitor enters with the name kept with its key");
  await page.reload();
  await page.waitForSelector('#me[data-logged-in="true"]', { timeout: 30000 });
  if (!(await page.textContent("#me")).startsWith("ada (")) throw new Error("the name was not kept");
  console.log("viewer e2e passed");
} finally {
  await browser.close();
}
