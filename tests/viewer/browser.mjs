// SPDX-License-Identifier: AGPL-3.0-or-later
// Headless Chromium on a page of the viewer, for the short browser scripts of the tests.
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
}

export async function openPage(url) {
  const browser = await launch();
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", (e) => console.log(`  [page error] ${e.message}`));
  await page.goto(url);
  return { browser, page };
}

// A new visitor on `url`: chooses `name`, enters, and waits until its avatar is drawn.
export async function enter(page, url, name) {
  page.on("pageerror", (e) => console.log(`  [page error] ${e.message}`));
  await page.goto(url);
  await page.waitForSelector("#name-form:not([hidden])", { timeout: 30000 });
  await page.fill("#name-input", name);
  await page.click("#name-form button");
  await page.waitForSelector('#me[data-logged-in="true"]', { timeout: 30000 });
  await page.waitForFunction(() => window.metatopiaOwn()?.drawn, null, { timeout: 30000 });
}
