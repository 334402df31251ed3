// SPDX-License-Identifier: AGPL-3.0-or-later
// One world, not one sim, in real headless Chromium: node crossing.mjs URL SHOT SIM2_NODES…
// The page comes from a node of sim 1 (x 0–32 m); sim 2 (x 32–64 m) lies east of it. The map
// draws sim 2 around sim 1; the avatar walks east across the border; every frame is recorded:
// both sims' ground drawn, the own avatar drawn (never missing, never jumping), and at the end
// the viewer is on a node of sim 2 and the avatar walks there.
import { enter, launch } from "./browser.mjs";

const [url, shot, ...sim2] = process.argv.slice(2);
const step = (what) => console.log(`- ${what}`);
const fail = (why) => { throw new Error(why); };
const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await enter(page, url, "dee");
  if ((await page.evaluate(() => window.metatopiaWorld().sim)) !== 1) fail("not in sim 1");

  step("sim 2 drawn beside sim 1");
  await page.waitForFunction(() => window.metatopiaWorld().neighbours.some((n) => n.sim === 2 && n.ground), null, { timeout: 30000 });
  console.log(`  neighbours: ${JSON.stringify(await page.evaluate(() => window.metatopiaWorld().neighbours))}`);

  step("walk east across the border, every frame recorded");
  await page.evaluate(() => {
    window.__frames = [];
    const frame = () => {
      const own = window.metatopiaOwn();
      window.__frames.push({ ...window.metatopiaFrames().last, at: own && own.drawn && own.drawn.slice(), drawnTime: own && own.drawnTime, committed: own && own.committed, predicting: own && own.predicting, t: performance.now(), sim: window.metatopiaWorld().sim });
      if (!window.__stop) requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  });
  await page.focus("#map");
  await page.keyboard.down("ArrowRight");
  await page.waitForFunction(() => window.metatopiaWorld().sim === 2, null, { timeout: 30000 });
  await page.waitForTimeout(1500);
  await page.keyboard.up("ArrowRight");
  await page.waitForTimeout(1000);
  const frames = await page.evaluate(() => { window.__stop = true; return window.__frames; });
  const blank = frames.filter((f) => !f.sims || f.drawn === 0).length;
  const one = frames.filter((f) => f.sims < 2).length;
  const missing = frames.filter((f) => !f.own).length;
  // A jump: a step between two drawn frames longer than twice the walk (3 m/s) over the time
  // between them, and than 0.5 m (on a loaded machine a frame may come 300 ms after the one
  // before, and the avatar walked 0.9 m in it; a snap at the border is metres). The time is the
  // one each frame was drawn for: this recorder runs in its own animation callback, which may
  // come before the viewer's in a frame and read the frame before's position.
  let jump = 0;
  let jumped = null;
  for (let i = 1; i < frames.length; i++) {
    const [a, b] = [frames[i - 1].at, frames[i].at];
    if (!a || !b || frames[i].drawnTime === frames[i - 1].drawnTime) continue;
    const d = Math.hypot(b[0] - a[0], b[1] - a[1]);
    const dt = (frames[i].drawnTime - frames[i - 1].drawnTime) / 1000;
    jump = Math.max(jump, d);
    if (d > Math.max(0.5, 2 * 3 * dt) && !jumped) jumped = { d, dt, frame: i };
  }
  const crossedAt = frames.findIndex((f) => f.sim === 2);
  console.log(`  ${frames.length} frames, the crossing at frame ${crossedAt}: ${blank} without the world drawn, ${one} with one sim drawn, ${missing} without the own avatar, largest step ${jump.toFixed(3)} m`);
  if (crossedAt < 1) fail("the crossing was not recorded");
  if (blank || one || missing) fail("frames without the world or the avatar drawn");
  if (jumped) {
    // The frames around it, for a look: when, where drawn, where committed, predicting or not.
    for (const f of frames.slice(Math.max(0, jumped.frame - 5), jumped.frame + 3)) {
      console.log(`  ${(f.drawnTime ?? 0).toFixed(0)} ms (recorded at ${f.t.toFixed(0)}) sim ${f.sim}: drawn ${f.at && f.at.map((v) => v.toFixed(2))}, committed ${f.committed && f.committed.map((v) => v.toFixed(2))}${f.predicting ? ", predicting" : ""}`);
    }
    fail(`the avatar jumped ${jumped.d} m in ${(jumped.dt * 1000).toFixed(0)} ms at frame ${jumped.frame}`);
  }
  await page.screenshot({ path: shot });
  step(`screenshot ${shot}`);

  step("on a node of sim 2, and the avatar walks there");
  const node = await page.evaluate(() => document.body.dataset.node);
  if (!sim2.includes(node)) fail(`the viewer uses ${node}, not a node of sim 2 (${sim2})`);
  if (!(await page.textContent("#st-sim")).includes("sim 2")) fail(`the header says ${await page.textContent("#st-sim")}`);
  const from = await page.evaluate(() => window.metatopiaOwn().committed);
  if (!(from[0] > 32)) fail(`the avatar is at ${from}, not in sim 2`);
  await page.keyboard.down("ArrowUp");
  await page.waitForTimeout(600);
  await page.keyboard.up("ArrowUp");
  await page.waitForFunction((f) => { const o = window.metatopiaOwn(); return o && !o.predicting && o.committed[1] > f[1] + 1; }, from, { timeout: 30000 });
  console.log(`  walked north in sim 2 from ${from.map((v) => v.toFixed(1))} to ${(await page.evaluate(() => window.metatopiaOwn().committed)).map((v) => v.toFixed(1))}`);
  console.log("viewer crossing passed");
} finally {
  await browser.close();
}
