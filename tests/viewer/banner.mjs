// SPDX-License-Identifier: AGPL-3.0-or-later
// The viewer's banners in real headless Chromium: node banner.mjs URL SCREENSHOT
// The test kills two of the sim's four validators before this runs, and the node serving the
// page once this prints "paused banner seen".
import { chromium } from "playwright-core";

const [url, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", (e) => console.log(`  [page error] ${e.message}`));
  await page.goto(url);
  // Two of four validators gone: no quorum, the sim pauses, and the player is told why.
  // First "no tick for N s", then, once the node finds the two gone (their connections miss
  // their pings), why: too few validators.
  await page.waitForSelector('body[data-banner="paused"]', { timeout: 30000 });
  console.log(`paused: ${await page.textContent("#banner")}`);
  await page.waitForFunction(() => /2 of its 4 validators .* needs 3/.test(document.querySelector("#banner").textContent),
    null, { timeout: 30000 });
  const paused = await page.textContent("#banner");
  // A page opened while the sim is paused still shows the world as it stands.
  await page.waitForSelector('#objects li[data-name="door"]', { timeout: 15000 });
  const box = await page.$eval("#banner", (b) => { const r = b.getBoundingClientRect(); return [r.top, r.height]; });
  const mapTop = await page.$eval("#map", (m) => m.getBoundingClientRect().top);
  if (!(box[1] > 0 && box[0] >= mapTop)) throw new Error(`the banner is not over the map: ${box} vs ${mapTop}`);
  await page.screenshot({ path: shot });
  console.log(`paused banner seen: ${paused}`);
  // The node serving the page dies: the viewer says so and keeps trying.
  await page.waitForSelector('body[data-banner="unreachable"]', { timeout: 30000 });
  await page.waitForFunction(() => /attempt [2-9]/.test(document.querySelector("#banner").textContent), null, { timeout: 30000 });
  console.log(`unreachable banner seen: ${await page.textContent("#banner")}`);
  console.log("viewer banners passed");
} finally {
  await browser.close();
}
