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
