// SPDX-License-Identifier: AGPL-3.0-or-later
// The viewer's frame rate and memory in real headless Chromium: node frames.mjs URL SECONDS SHOT
// A world of a thousand objects, all in view: frames a second (requestAnimationFrame), the
// time each frame's drawing takes, and the page's memory (JS heap after a forced garbage
// collection, DOM nodes, listeners) sampled over SECONDS. Prints the figures; fails when fewer
// than 1,000 objects were drawn, the rate is under 55 frames a second or the memory grew.
import { enter, launch } from "./browser.mjs";

const [url, seconds, shot] = process.argv.slice(2);
const browser = await launch();
const fail = (why) => { throw new Error(why); };
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  await enter(page, url, "watcher");
  await page.waitForFunction(() => window.metatopiaFrames().drawn >= 1000, null, { timeout: 30000 });

  // Frames a second over 10 s, and the drawing time of each.
  const rate = await page.evaluate(() => new Promise((done) => {
    let n = 0, least = Infinity;
    const t0 = performance.now();
    const frame = () => {
      n += 1;
      least = Math.min(least, window.metatopiaFrames().drawn);
      if (performance.now() - t0 < 10000) requestAnimationFrame(frame);
      else done({ fps: (n - 1) / ((performance.now() - t0) / 1000), least, ms: window.metatopiaFrames().ms });
    };
    requestAnimationFrame(frame);
  }));
  const ms = rate.ms.slice().sort((a, b) => a - b), q = (p) => ms[Math.floor((ms.length - 1) * p)];
  console.log(`frames: ${rate.fps.toFixed(1)} a second with ${rate.least} or more objects drawn in each; drawing p50 ${q(0.5).toFixed(2)} ms, p99 ${q(0.99).toFixed(2)} ms a frame`);
  await page.screenshot({ path: shot });

  // Memory over time: sampled every 30 s (10 s for short runs) after a forced collection.
  const cdp = await context.newCDPSession(page);
  await cdp.send("Performance.enable");
  const sample = async () => {
    await cdp.send("HeapProfiler.collectGarbage");
    const m = Object.fromEntries((await cdp.send("Performance.getMetrics")).metrics.map((x) => [x.name, x.value]));
    return { heap: m.JSHeapUsedSize, nodes: m.Nodes, listeners: m.JSEventListeners, ticks: await page.evaluate(() => window.metatopiaTicksSeen()) };
  };
  const every = +seconds >= 120 ? 30 : 10, samples = [await sample()];
  for (let t = every; t <= +seconds; t += every) {
    await page.waitForTimeout(every * 1000);
    samples.push(await sample());
    const s = samples[samples.length - 1];
    console.log(`memory at ${t} s: heap ${(s.heap / 1e6).toFixed(2)} MB, ${s.nodes} DOM nodes, ${s.listeners} listeners, ${s.ticks} tick messages`);
  }
  // After the first sample (the page settled): the heap's largest later sample against it.
  const first = samples[1] || samples[0], last = samples[samples.length - 1];
  const most = Math.max(...samples.slice(1).map((s) => s.heap));
  console.log(`memory: heap ${(first.heap / 1e6).toFixed(2)} MB → ${(last.heap / 1e6).toFixed(2)} MB (largest ${(most / 1e6).toFixed(2)} MB), DOM nodes ${first.nodes} → ${last.nodes}, over ${seconds} s`);
  if (rate.least < 1000) fail(`only ${rate.least} objects drawn`);
  if (rate.fps < 55) fail(`${rate.fps.toFixed(1)} frames a second`);
  if (last.ticks <= samples[0].ticks) fail("no tick messages came while memory was sampled");
  if (most > first.heap * 1.25 + 2e6 || last.nodes > first.nodes * 1.1 + 50) fail("the page's memory grew");
  console.log("viewer frames passed");
} finally {
  await browser.close();
}
