// A person finishing a URL-mode authorization in a browser (tests/downstream.rs, docs/DOWNSTREAM.md): Debian's
// Chromium, headless, driven by puppeteer-core. It opens the start URL the client was given, signs in to the
// fleet's sign-in as --as (the dev sign-in's form, or the issuer's own login page), and, when the fleet sends it
// on, signs in to the third party (oidc-provider's own login page, as --third-party-login) and gives consent. It
// prints one line of JSON: where the browser ended, the page's title and message, the status of the last
// navigation, the paths it went through.
//
//   node consent.mjs --url START_URL --as NAME [--third-party-login NAME]

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { importPkg } from '../interop/node/lib.mjs';

const { values } = parseArgs({
  options: { url: { type: 'string' }, as: { type: 'string' }, 'third-party-login': { type: 'string' } },
});
const dir = mkdtempSync(path.join(os.tmpdir(), 'mcpfleet-consent-'));
const puppeteer = await importPkg('puppeteer-core');
const browser = await (puppeteer.default ?? puppeteer).launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check'],
  userDataDir: path.join(dir, 'profile'),
});
const steps = [];
let last;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(20000);
  const go = async (action) => {
    const [response] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), action()]);
    last = response?.status() ?? last;
    steps.push(new URL(page.url()).pathname);
  };
  last = (await page.goto(values.url, { waitUntil: 'load' }))?.status();
  steps.push(new URL(page.url()).pathname);
  // The fleet's dev sign-in: the name to sign in as.
  if (await page.$('#login')) {
    await page.type('#login', values.as);
    await go(() => page.click('#signin'));
  }
  // oidc-provider's own login and consent pages: the fleet's issuer's (with a configured sign-in), then the third
  // party's. The first login is --as, the next --third-party-login (or --as).
  let logins = 0;
  for (let i = 0; i < 6; i += 1) {
    if (await page.$('input[name=login]')) {
      const login = logins === 0 ? values.as : (values['third-party-login'] ?? values.as);
      logins += 1;
      await page.type('input[name=login]', login);
      await page.type('input[name=password]', 'any');
      await go(() => page.click('button[type=submit]'));
    } else if (await page.$('button.login-submit')) {
      await go(() => page.click('button.login-submit'));
    } else {
      break;
    }
  }
  const title = await page.title();
  const message = await page.$eval('#m', (e) => e.textContent).catch(() => null);
  console.log(JSON.stringify({ consent: true, url: page.url(), status: last, title, message, steps }));
} catch (e) {
  console.log(JSON.stringify({ consent: true, error: String(e), steps }));
} finally {
  await browser.close();
  rmSync(dir, { recursive: true, force: true });
}
