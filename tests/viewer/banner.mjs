// SPDX-License-Identifier: AGPL-3.0-or-later
// The viewer's banners in real headless Chromium: node banner.mjs URL SCREENSHOT
// The test kills two of the sim's four validators before this runs, and the node the viewer
// uses (named in the line "paused banner seen on HOST:PORT") once this prints it.
import { openPage } from "./browser.mjs";

const [url, shot] = process.argv.slice(2);
const { browser, page } = await openPage(url);
try {
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
  const node = await page.evaluate(() => document.body.dataset.node);
  console.log(`paused banner seen on ${node}: ${paused}`);
  // The node the viewer uses dies: it says so and moves to another node of the sim.
  await page.waitForSelector('body[data-banner="unreachable"]', { timeout: 30000 });
  console.log(`unreachable banner seen: ${await page.textContent("#banner")}`);
  await page.waitForFunction((n) => document.body.dataset.node !== n && document.body.dataset.banner === "paused", node, { timeout: 30000 });
  console.log(`moved to ${await page.evaluate(() => document.body.dataset.node)}, still paused`);
  console.log("viewer banners passed");
} finally {
  await browser.close();
}
