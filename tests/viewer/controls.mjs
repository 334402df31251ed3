// SPDX-License-Identifier: AGPL-3.0-or-later
// A player's controls in real headless Chromium: node controls.mjs URL WIDE_SHOT PHONE_SHOT
// On a desktop-sized page: the place (sim and owner) and the minimap, keys that walk wherever
// the focus is (but not while typing), whisper / say / shout, a script's error as a private
// line for its owner, the objects list grouped and searchable, ids shortened with a copy
// button. Then on a phone-sized page (390×844, touch): map, pad, chat and list reachable, the
// pad walks, two fingers pinch-zoom, a tap selects.
import { enter as enterAt, launch } from "./browser.mjs";

const [url, wideShot, phoneShot] = process.argv.slice(2);
const step = (what) => console.log(`- ${what}`);
const browser = await launch();
const fail = (why) => { throw new Error(why); };
const chatHas = (page, sel, text) => page.waitForFunction(([s, t]) =>
  [...document.querySelectorAll(s)].some((li) => li.textContent.includes(t)), [sel, text], { timeout: 30000 });

const enter = (page, name) => enterAt(page, url, name);

// Walks while `hold` runs; resolves once the sim executed the walk (at rest again): how far.
async function walked(page, hold) {
  const from = await page.evaluate(() => window.metatopiaOwn().committed);
  await hold();
  await page.waitForFunction((f) => {
    const o = window.metatopiaOwn();
    return !o.predicting && Math.hypot(o.committed[0] - f[0], o.committed[1] - f[1]) > 0.5;
  }, from, { timeout: 30000 });
  const to = await page.evaluate(() => window.metatopiaOwn().committed);
  return [to[0] - from[0], to[1] - from[1]];
}

try {
  const wide = await browser.newContext({ viewport: { width: 1280, height: 800 }, permissions: ["clipboard-read", "clipboard-write"] });
  const page = await wide.newPage();
  await enter(page, "bea");

  step("the place: the sim and who owns it, in the header and on the map; the minimap");
  await page.waitForFunction(() => /^owned by \S/.test(document.querySelector("#st-owner").textContent), null, { timeout: 30000 });
  console.log(`  ${await page.textContent("#st-sim")} ${await page.textContent("#st-owner")}`);
  const mm = await page.$eval("#minimap", (c) => { const r = c.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; });
  await page.mouse.click(mm[0] + mm[2] * 0.1, mm[1] + mm[3] * 0.9);
  const looked = await page.evaluate(() => window.metatopiaView());
  if (looked.follow || !(looked.x < 16 && looked.y < 16)) fail(`the minimap's corner did not move the map there: ${JSON.stringify(looked)}`);
  await page.check("#follow");

  step("arrow keys and WASD walk wherever the focus is, but not while typing");
  await page.click("#objects-pane h2");
  if (await page.evaluate(() => document.activeElement.id === "map")) fail("the map has the focus already");
  const east = await walked(page, async () => { await page.keyboard.down("ArrowRight"); await page.waitForTimeout(600); await page.keyboard.up("ArrowRight"); });
  if (!(east[0] > 1)) fail(`ArrowRight (focus on the list) walked ${east}`);
  // Held 1.2 s (3.6 m): the walk lasts from the press's execution to the release's, and on a
  // loaded machine the press may be agreed a few hundred ms later than the release is.
  const north = await walked(page, async () => { await page.keyboard.down("w"); await page.waitForTimeout(1200); await page.keyboard.up("w"); });
  if (!(north[1] > 1)) fail(`w walked ${north}`);
  await page.click("#chat-input");
  await page.keyboard.type("wasd");
  if (await page.evaluate(() => window.metatopiaOwn().predicting)) fail("typing in the chat box walked");
  if ((await page.inputValue("#chat-input")) !== "wasd") fail("the chat box did not get the keys");
  await page.keyboard.press("Escape");
  if (!(await page.evaluate(() => document.activeElement.id === "map"))) fail("Escape did not leave the chat box for the map");
  await page.keyboard.press("Enter");
  if (!(await page.evaluate(() => document.activeElement.id === "chat-input"))) fail("Enter did not go to the chat box");
  await page.fill("#chat-input", "");

  step("whisper, say, shout and a channel");
  await page.fill("#chat-input", "/w psst");
  await page.press("#chat-input", "Enter");
  await chatHas(page, '#chat-log li[data-range="whisper"]', "whispers: psst");
  await page.selectOption("#chat-range", "2");
  await page.fill("#chat-input", "can anyone hear me");
  await page.press("#chat-input", "Enter");
  await chatHas(page, '#chat-log li[data-range="shout"]', "shouts: can anyone hear me");
  await page.selectOption("#chat-range", "1");
  await page.fill("#chat-input", "just saying");
  await page.press("#chat-input", "Enter");
  await chatHas(page, '#chat-log li[data-range="say"]', "bea: just saying");
  await page.fill("#chat-input", "/7 on channel seven");
  await page.press("#chat-input", "Enter");
  await chatHas(page, "#chat-log li", "[7] bea: on channel seven");

  step("a script's error: a private line for its owner");
  await page.fill("#rez-name", "fuse");
  await page.click("#rez-form button");
  await page.waitForSelector('#objects ul[data-group="mine"] li[data-name="fuse"]', { timeout: 30000 });
  await page.click('#objects li[data-name="fuse"]');
  await page.waitForSelector("#new-script:not([hidden])", { timeout: 15000 });
  await page.click("#new-script");
  await page.fill("#ed-source", 'fn on_touch(who) {\n    throw "the fuse blew";\n}\n');
  await page.click("#ed-deploy");
  await page.waitForFunction(() => document.querySelector("#ed-error").textContent.startsWith("deployed"), null, { timeout: 30000 });
  await page.click("#ed-close");
  await page.click("#touch");
  await chatHas(page, "#chat-log li.private", "the fuse blew");
  console.log(`  ${await page.evaluate(() => [...document.querySelectorAll("#chat-log li.private")].pop().textContent)}`);

  step("the objects list: grouped and searchable");
  for (const [group, name] of [["avatars", "bea"], ["mine", "fuse"], ["scripted", "door"], ["scripted", "echo bot"]]) {
    await page.waitForSelector(`#objects ul[data-group="${group}"] li[data-name="${name}"]`, { timeout: 15000 });
  }
  const heads = await page.$$eval("#objects h3:not([hidden])", (hs) => hs.map((h) => h.textContent));
  if (!heads.some((h) => /^avatars \(\d+\)$/.test(h)) || !heads.some((h) => /^scripted \(\d+\)$/.test(h))) fail(`group headings: ${heads}`);
  console.log(`  ${heads.join(", ")}`);
  await page.fill("#obj-search", "DOOR");
  await page.waitForFunction(() => {
    const shown = [...document.querySelectorAll("#objects li:not(.more)")];
    return shown.length >= 1 && shown.every((li) => (li.dataset.name + li.dataset.text).toLowerCase().includes("door"));
  }, null, { timeout: 5000 });
  console.log(`  searching "DOOR": ${await page.textContent("#obj-count")} objects`);
  await page.fill("#obj-search", "");

  step("ids shortened, with a copy button");
  await page.click('#objects li[data-name="door"]');
  await page.waitForFunction(() => document.querySelector("#sel-name").textContent === "door", null, { timeout: 15000 });
  const meta = await page.textContent("#sel-meta");
  if (/[0-9a-f]{40}/.test(meta) || !meta.includes("…")) fail(`the owner is not shortened: ${meta}`);
  await page.click("#sel-meta .copy");
  await page.waitForSelector('#sel-meta .copy[data-copied="true"]', { timeout: 5000 });
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  if (!/^[0-9a-f]{64}$/.test(copied) || !meta.includes(copied.slice(0, 8))) fail(`copied ${copied} for ${meta}`);
  await page.screenshot({ path: wideShot });
  step(`screenshot ${wideShot}`);

  step("a phone (390×844, touch): the map, the pad, the chat and the list are reachable");
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
  const mobile = await phone.newPage();
  await enter(mobile, "cy");
  const rect = (sel) => mobile.$eval(sel, (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; });
  const map = await rect("#map");
  if (!(map[0] >= 0 && map[0] + map[2] <= 390 && map[3] >= 300)) fail(`the map on a phone: ${map}`);
  const pad = await rect('#pad button[data-dir="0,1"]');
  if (!(pad[2] >= 40 && pad[1] + pad[3] <= map[1] + map[3])) fail(`the pad: ${pad} on the map ${map}`);
  await mobile.tap("#chat-input");
  await mobile.keyboard.type("from my phone");
  await mobile.keyboard.press("Enter");
  await chatHas(mobile, "#chat-log li", "cy: from my phone");
  const list = await rect("#obj-search");
  if (!(list[0] >= 0 && list[0] + list[2] <= 390)) fail(`the object search on a phone: ${list}`);

  step("the pad walks while a finger holds it");
  const cdp = await phone.newCDPSession(mobile);
  const touch = (type, points) => cdp.send("Input.dispatchTouchEvent", { type, touchPoints: points.map(([x, y], id) => ({ x, y, id })) });
  const up = await rect('#pad button[data-dir="0,1"]');
  const moved = await walked(mobile, async () => {
    await touch("touchStart", [[up[0] + up[2] / 2, up[1] + up[3] / 2]]);
    await mobile.waitForTimeout(700);
    await touch("touchEnd", []);
  });
  if (!(moved[1] > 1)) fail(`the pad's ▲ walked ${moved}`);
  console.log(`  ▲ held 0.7 s: walked ${moved.map((v) => v.toFixed(2))} m`);

  step("two fingers pinch to zoom; a tap selects");
  const before = (await mobile.evaluate(() => window.metatopiaView())).scale;
  const [cx, cy] = [map[0] + map[2] / 2, map[1] + map[3] / 2];
  await touch("touchStart", [[cx - 20, cy], [cx + 20, cy]]);
  for (let d = 30; d <= 80; d += 10) await touch("touchMove", [[cx - d, cy], [cx + d, cy]]);
  await touch("touchEnd", []);
  const after = (await mobile.evaluate(() => window.metatopiaView())).scale;
  if (!(after > before * 3)) fail(`pinching out zoomed ${before} → ${after}`);
  console.log(`  pinch: zoom ${before.toFixed(1)} → ${after.toFixed(1)} px/m`);
  const doorId = await mobile.getAttribute('#objects li[data-name="door"]', "data-id");
  const at = await mobile.evaluate((id) => window.metatopiaScreenOf(id), doorId);
  if (!(at[0] > map[0] && at[0] < map[0] + map[2] && at[1] > map[1] && at[1] < map[1] + map[3])) fail(`the door is off the map at ${at}`);
  await mobile.touchscreen.tap(at[0], at[1]);
  await mobile.waitForFunction(() => document.querySelector("#sel-name").textContent === "door", null, { timeout: 15000 });
  await mobile.evaluate(() => window.scrollTo(0, 0));
  await mobile.screenshot({ path: phoneShot });
  step(`screenshot ${phoneShot}`);
  console.log("viewer controls passed");
} finally {
  await browser.close();
}
