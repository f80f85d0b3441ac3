// playground.mjs - the playground page (GET /) in a real browser: Debian's
// Chromium, headless, driven by puppeteer-core, against a running llmserve
// started with --api-key KEY and --lora ADAPTER=... on stories260K.
//
// Every expected value comes from outside the page: the text of a reply is
// compared with the server's own answer to the same greedy request, sent by
// this script with fetch (not by the page); the error shown with the server's
// 400 message for the same bad request; the status panel's KV block count
// with /metrics; the Markdown renderer's output with HTML written by hand.
// Exits 0 when every check passes; saves OUT_DIR/playground-failure.png (and
// prints what failed) otherwise, and OUT_DIR/playground.png at the end.
//
// usage: PUPPETEER_MODULE_DIR=<npm --prefix dir> node playground.mjs BASE_URL KEY ADAPTER OUT_DIR
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const [baseURL, apiKey, adapter, outDir] = process.argv.slice(2);
const require = createRequire(path.join(process.env.PUPPETEER_MODULE_DIR, 'node_modules', 'x.js'));
const puppeteer = require('puppeteer-core');

const WAIT = { timeout: 20000 };  // a bound on each wait, not a measurement
const MESSAGE = 'Tell me a story about a cat.';

let browser = null;
let page = null;

async function fail(what) {
  console.error(`FAIL: ${what}`);
  if (page) {
    try {
      await page.screenshot({ path: path.join(outDir, 'playground-failure.png'), fullPage: true });
      console.error(`screenshot: ${path.join(outDir, 'playground-failure.png')}`);
    } catch (e) { console.error(`no screenshot: ${e.message}`); }
  }
  if (browser) await browser.close();
  process.exit(1);
}

async function check(cond, what) {
  if (!cond) await fail(what);
  console.log(`ok: ${what}`);
}

// The server's own answer, asked by this script.
async function api(route, body) {
  const r = await fetch(baseURL + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json() };
}

async function setParam(name, value) {
  await page.$eval(`#p-${name}`, (el, v) => { el.value = v; }, String(value));
}

// Sends text from the chat box and waits for the reply to end; returns its
// data-* fields.
async function chat(text, wantState) {
  const n = await page.$$eval('.msg.assistant', (els) => els.length);
  await page.$eval('#chat-input', (el, t) => { el.value = t; }, text);
  // Every change of a reply's data-raw and data-state, in order, with the
  // value each replaced (MutationObserver hands records over in batches).
  await page.evaluate(() => {
    window.__changes = [];
    if (window.__observer) window.__observer.disconnect();
    window.__observer = new MutationObserver((recs) => {
      for (const r of recs) {
        if (r.target.classList.contains('assistant')) window.__changes.push([r.attributeName, r.oldValue]);
      }
    });
    window.__observer.observe(document.getElementById('messages'), {
      subtree: true, attributes: true, attributeOldValue: true,
      attributeFilter: ['data-raw', 'data-state'],
    });
  });
  await page.click('#chat-send');
  await page.waitForFunction((k) => {
    const els = document.querySelectorAll('.msg.assistant');
    return els.length === k && els[k - 1].dataset.state !== 'streaming';
  }, WAIT, n + 1);
  const r = await page.evaluate(() => {
    const els = document.querySelectorAll('.msg.assistant');
    const el = els[els.length - 1];
    return { ...el.dataset, shown: el.querySelector('.body').innerText,
             meta: el.querySelector('.meta').textContent };
  });
  await check(r.state === wantState, `reply state ${r.state} (want ${wantState}; ${r.meta})`);
  // The texts shown one after another: each value data-raw had, and whether
  // the reply was still streaming when it was set.
  const changes = await page.evaluate(() => window.__changes);
  // A record holds the value before the change: the value after it is the
  // old value of the next change of the same attribute, or the final one.
  const raws = changes.filter(([a]) => a === 'data-raw').map(([, old]) => old).slice(1);
  raws.push(r.raw);
  r.shownSteps = [];
  let streaming = false;
  for (const [attr, old] of changes) {
    if (attr === 'data-state') streaming = old === null;  // null -> streaming -> the end
    else r.shownSteps.push({ text: raws[r.shownSteps.length], streaming });
  }
  return r;
}

process.on('unhandledRejection', (e) => fail(`unexpected: ${e && e.stack || e}`));

const userDataDir = fs.mkdtempSync(path.join(outDir, 'chromium-profile-'));
browser = await puppeteer.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  userDataDir,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync',
         '--window-size=1280,800'],
});
page = await browser.newPage();
await page.setViewport({ width: 1280, height: 800 });
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(e.message));
page.on('console', (m) => { if (m.type() === 'error') pageErrors.push(m.text()); });
await page.evaluateOnNewDocument(() => {
  window.__csp = [];
  document.addEventListener('securitypolicyviolation',
    (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
});

// 1. The page loads without the key and asks for it; the key is kept.
const resp = await page.goto(baseURL + '/', { waitUntil: 'domcontentloaded' });
await check(resp.status() === 200, 'GET / without a key: 200');
await page.waitForSelector('#key-dialog[open]', WAIT);
await check(true, 'the page asks for the API key (/v1/models answered 401)');
await page.type('#key-input', apiKey);
await page.click('#key-save');
await page.waitForSelector('body[data-models="loaded"]', WAIT);
const models = await page.$$eval('#model option', (os) => os.map((o) => o.value));
const listed = await (await fetch(baseURL + '/v1/models',
  { headers: { Authorization: `Bearer ${apiKey}` } })).json();
await check(JSON.stringify(models) === JSON.stringify(listed.data.map((m) => m.id)),
  `the picker lists /v1/models: ${models.join(', ')}`);
await check(models.includes(adapter), `the adapter ${adapter} is in the picker`);
await page.reload({ waitUntil: 'domcontentloaded' });
await page.waitForSelector('body[data-models="loaded"]', WAIT);
await check(!(await page.$eval('#key-dialog', (d) => d.open)),
  'after a reload the kept key is used (no dialog)');
await check(await page.evaluate(() => localStorage.getItem('llmserve.apiKey')) === apiKey,
  'the key is in localStorage');

// 2. The Markdown renderer: HTML in a reply stays text; expectations by hand.
const md = [
  ['<script>alert(1)</script>', '<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>'],
  ['<img src=x onerror=alert(1)>', '<p>&lt;img src=x onerror=alert(1)&gt;</p>'],
  ['**bold** and *it* and `a<b`', '<p><strong>bold</strong> and <em>it</em> and <code>a&lt;b</code></p>'],
  ['# Title\n\n- one\n- two', '<h1>Title</h1><ul><li>one</li><li>two</li></ul>'],
  ['```c\nint x = 1 < 2;\n```', '<pre><code class="lang-c">int x = 1 &lt; 2;</code></pre>'],
  ['```\nunclosed', '<pre><code>unclosed</code></pre>'],
  ['[x](javascript:alert(1))', '<p>[x](javascript:alert(1))</p>'],
  ['[ok](https://example.org/a?b=1&c=2)',
   '<p><a href="https://example.org/a?b=1&amp;c=2" rel="noopener noreferrer nofollow" target="_blank">ok</a></p>'],
  ['line one\nline two\n\n> quoted', '<p>line one<br>line two</p><blockquote>quoted</blockquote>'],
  ['3. c\n4. d', '<ol start="3"><li>c</li><li>d</li></ol>'],
];
for (const [src, want] of md) {
  const got = await page.evaluate((s) => renderMarkdown(s), src);
  await check(got === want, `markdown ${JSON.stringify(src)} -> ${got}`);
}

// 3. A greedy chat reply streams in and equals the API's answer.
await setParam('temperature', 0);
await setParam('max_tokens', 24);
const greedy = { messages: [{ role: 'user', content: MESSAGE }], temperature: 0, max_tokens: 24 };
const base = await api('/v1/chat/completions', greedy);
await check(base.status === 200, 'the API answers the greedy chat request');
const r1 = await chat(MESSAGE, 'done');
// The server decides how many tokens go into one chunk (all of them, when the
// tokens come faster than the connection is written): what must hold is that
// each chunk was shown as it came, while the reply was still streaming, each
// text extending the one before.
await check(r1.shownSteps.length === Number(r1.chunks) && r1.shownSteps.length >= 1,
  `each of the ${r1.chunks} chunks was shown as it came`);
await check(r1.shownSteps.every((st) => st.streaming), 'text was shown while the reply streamed');
await check(r1.shownSteps.every((st, i) => i === 0 || st.text.startsWith(r1.shownSteps[i - 1].text)),
  'each text shown extends the one before');
await check(r1.raw === base.json.choices[0].message.content,
  `page reply == API reply: ${JSON.stringify(r1.raw)}`);
await check(r1.shown.trim().length > 0, 'the reply is shown');
await check(/TTFT \d+ ms/.test(r1.meta) && /24 tokens/.test(r1.meta),
  `TTFT and the token count are shown: ${r1.meta}`);
await check(r1.model === listed.data[0].id, `answered by the base model ${r1.model}`);

// 4. The adapter: the same request under it answers as the API does under it.
await page.click('#chat-clear');
await page.select('#model', adapter);
const under = await api('/v1/chat/completions', { ...greedy, model: adapter });
await check(under.status === 200, `the API answers under ${adapter}`);
await check(under.json.choices[0].message.content !== base.json.choices[0].message.content,
  'the adapter changes the greedy reply');
const r2 = await chat(MESSAGE, 'done');
await check(r2.raw === under.json.choices[0].message.content,
  `page reply under ${adapter} == API reply: ${JSON.stringify(r2.raw)}`);
await check(r2.model === adapter, `answered as ${adapter}`);

// 5. A bad parameter: the server's 400 message is shown.
await page.click('#chat-clear');
await setParam('temperature', -1);
const bad = await api('/v1/chat/completions', { ...greedy, model: adapter, temperature: -1 });
await check(bad.status === 400, `the API refuses temperature -1: ${bad.json.error.message}`);
const r3 = await chat(MESSAGE, 'error');
await check(r3.error === `HTTP 400: ${bad.json.error.message}`, `the page shows: ${r3.error}`);
await check(await page.$eval('#chat-input', (el) => el.value) === MESSAGE,
  'the failed message is back in the input');
await setParam('temperature', 0);

// 6. Stop: a request stopped before its answer ends as "stopped", and the
// page is ready for the next one.
await page.evaluate(() => {
  document.getElementById('chat-send').click();
  document.getElementById('chat-stop').click();
});
await page.waitForSelector('.msg.assistant[data-state="stopped"]', WAIT);
await check(!(await page.$eval('#chat-send', (b) => b.disabled)) &&
            await page.$eval('#chat-stop', (b) => b.disabled), 'after stop: send on, stop off');

// 7. The raw completion view streams POST /v1/completions.
await page.click('#tab-complete');
await page.select('#model', listed.data[0].id);
await setParam('max_tokens', 16);
const prompt = 'Once upon a time';
await page.$eval('#prompt', (el, t) => { el.value = t; }, prompt);
const comp = await api('/v1/completions', { prompt, temperature: 0, max_tokens: 16 });
await page.click('#complete-send');
await page.waitForSelector('#completion[data-state="done"], #completion[data-state="error"]', WAIT);
const c = await page.$eval('#completion', (el) => ({ ...el.dataset }));
await check(c.raw === comp.json.choices[0].text, `completion == API: ${JSON.stringify(c.raw)}`);

// 8. The status panel reads /metrics.
await page.waitForFunction(() => document.getElementById('st-spark-line')
  .getAttribute('points').split(' ').length >= 2, WAIT);
const metrics = await (await fetch(baseURL + '/metrics')).text();
const kvTotal = /^llmserve_kv_blocks_total (\d+)$/m.exec(metrics)[1];
const kvShown = await page.$eval('#st-kv', (el) => el.textContent);
await check(kvShown.endsWith(`/ ${kvTotal}`), `KV blocks shown "${kvShown}", /metrics total ${kvTotal}`);
await check(/^\d+(\.\d)?%$/.test(await page.$eval('#st-hit', (el) => el.textContent)),
  'the prefix-cache hit rate is shown');

// 9. Nothing was blocked by the page's own policy, and no script failed.
const csp = await page.evaluate(() => window.__csp);
await check(csp.length === 0, `no CSP violations ${JSON.stringify(csp)}`);
// The one console error expected: the 400 of step 5 and the 401 of step 1,
// which Chromium logs as failed resource loads.
const unexpected = pageErrors.filter((e) => !/status of (400|401)/.test(e));
await check(unexpected.length === 0, `no script errors ${JSON.stringify(unexpected)}`);

// A picture of the chat view for the README.
await page.click('#tab-chat');
await page.click('#chat-clear');
await setParam('temperature', 0);
await setParam('max_tokens', 48);
await chat('Once upon a time, there was a little fox.', 'done');
await page.screenshot({ path: path.join(outDir, 'playground.png') });
await browser.close();
fs.rmSync(userDataDir, { recursive: true, force: true });
console.log('playground: all checks passed');
