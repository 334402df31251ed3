// SPDX-License-Identifier: AGPL-3.0-or-later
// The viewer on the nearest node, in real headless Chromium: node nearest.mjs URL NEAREST NEXT
// The page comes from one node; the paths to the sim's nodes differ in length (the test's delay
// stage on the network path, tests/node/delay.rs). The viewer must move to NEAREST (host:port of
// its HTTP); the test then kills that node once this prints "on the nearest node", and the
// viewer must go on from NEXT, the next nearest.
import { openPage } from "./browser.mjs";

const [url, nearest, next] = process.argv.slice(2);
const { browser, page } = await openPage(url);
try {
  await page.waitForFunction((n) => document.body.dataset.node === n, nearest, { timeout: 30000 });
  await page.waitForFunction(() => Number(document.body.dataset.tick) > 0 && !document.body.dataset.banner, null, { timeout: 30000 });
  const rtts = await page.evaluate(() => window.metatopiaRoundTrips.map((r) => (r === null ? null : Math.round(r))));
  console.log(`on the nearest node ${nearest}: round trips ${JSON.stringify(rtts)} ms`);
  // Its node dies: the next nearest, and the world goes on there.
  await page.waitForFunction((n) => document.body.dataset.node === n, next, { timeout: 30000 });
  const tick = Number(await page.evaluate(() => document.body.dataset.tick));
  await page.waitForFunction((t) => Number(document.body.dataset.tick) > t + 20 && !document.body.dataset.banner, tick, { timeout: 30000 });
  console.log(`moved to the next nearest node ${next}`);
  console.log("viewer nearest passed");
} finally {
  await browser.close();
}
