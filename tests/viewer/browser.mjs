// SPDX-License-Identifier: AGPL-3.0-or-later
// Headless Chromium on a page of the viewer, for the short browser scripts of the tests.
import { chromium } from "playwright-core";

export async function openPage(url) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", (e) => console.log(`  [page error] ${e.message}`));
  await page.goto(url);
  return { browser, page };
}
