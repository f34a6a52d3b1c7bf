// Opens the web page (examples/web, served on localhost by scripts/browser-check.sh) in
// headless Chromium with WebGPU, waits for its forward+backward check against the f64
// reference, prints what the page shows and saves a screenshot. Exit 1 unless the page says
// ok. Usage: node browser-check.mjs <url> <screenshot.png>
import { chromium } from 'playwright-core';

const [url, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: [
    '--no-sandbox', '--enable-unsafe-webgpu', '--enable-features=Vulkan',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--no-first-run',
  ],
});
let ok = false;
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  page.on('console', (m) => { if (m.type() === 'error') console.error(`page: ${m.text()}`); });
  await page.goto(url);
  // the title turns to ok or FAILED when the check ends (pipelines compile on the CPU: slow)
  await page.waitForFunction(() => !document.title.endsWith('running'), null, { timeout: 600_000 });
  const status = await page.textContent('#status');
  console.log(`${status}\n${await page.textContent('#result')}`);
  await page.screenshot({ path: shot });
  // the screenshot check: the status line is drawn, in the page's green, and the image holds it
  const color = await page.$eval('#status', (e) => getComputedStyle(e).color);
  const box = await page.locator('#status').boundingBox();
  ok = (await page.title()).endsWith(': ok') && color === 'rgb(23, 97, 23)' && box?.height > 0;
  const { size } = await import('node:fs').then((fs) => fs.statSync(shot));
  console.log(`screenshot ${shot}: ${size} bytes, status colour ${color}`);
  ok &&= size > 10_000;
} finally {
  await browser.close();
}
process.exit(ok ? 0 : 1);
