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
  step("logged in with a browser-made key");
  await page.waitForSelector('#me[data-logged-in="true"]', { timeout: 30000 });
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
  console.log("viewer e2e passed");
} finally {
  await browser.close();
}
