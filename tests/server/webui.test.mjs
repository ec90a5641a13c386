// The chat page in a real browser: mlxcel-server on the demo model with an API key, headless
// Chromium driven through the Chrome DevTools Protocol (over --remote-debugging-pipe: no port
// to pick and no WebSocket client needed). The page must ask for the key, take it and a
// max_tokens in its settings, send a typed message with Enter, stream the answer into the
// page (the same text the API gives for the same request, as the server's seed is fixed), show
// tokens/s, stop a reply with its button, render markdown safely, and keep the conversation across a reload. The screenshot goes to
// webui_chat.png in the build directory. Exits 77 (skipped) where there is no Chromium.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { BIN, MODEL } from '../node/setup.mjs';

const SCREENSHOT = path.resolve('webui_chat.png');
const KEY = 'page-key';
const MESSAGE = 'Tell me about the king';
const SCALE = Number(process.env.MLXCEL_TEST_TIME_SCALE ?? 1);

function findChromium() {
  const candidates = [process.env.MLXCEL_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser',
                      '/usr/bin/google-chrome'];
  return candidates.find((c) => c && existsSync(c));
}
const CHROMIUM = findChromium();
if (!CHROMIUM) {
  console.log('skipped: no Chromium (apt-get install chromium, or set MLXCEL_CHROMIUM)');
  process.exit(77);
}

const h = harness({ bin: BIN, label: 'web page test', timeoutMs: 100_000 * SCALE });
const { check, fail, own, startServer, stopServer, finish } = h;

// A CDP connection over the pipe: JSON messages ended by NUL, fd 3 to the browser, fd 4 back.
function launch(profile) {
  const args = ['--headless=new', '--remote-debugging-pipe', `--user-data-dir=${profile}`,
                '--no-first-run', '--no-default-browser-check', '--disable-gpu',
                '--disable-dev-shm-usage', '--disable-extensions', '--window-size=1000,760',
                'about:blank'];
  // Chromium's sandbox needs user namespaces, which a root shell in a container lacks
  if (process.getuid?.() === 0) args.unshift('--no-sandbox');
  const child = own(spawn(CHROMIUM, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] }));
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  let next = 1, buf = '';
  const waiting = new Map(), listeners = [];
  child.stdio[4].on('data', (d) => {
    buf += d;
    let k;
    while ((k = buf.indexOf('\0')) >= 0) {
      const msg = JSON.parse(buf.slice(0, k));
      buf = buf.slice(k + 1);
      if (msg.id && waiting.has(msg.id)) {
        const { resolve, reject, method } = waiting.get(msg.id);
        waiting.delete(msg.id);
        if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
        else resolve(msg.result);
      } else if (msg.method) {
        for (const l of listeners) l(msg);
      }
    }
  });
  child.on('exit', (code) => {
    for (const { reject } of waiting.values()) reject(new Error(`chromium exited ${code}: ${stderr}`));
  });
  const send = (method, params = {}, sessionId) => new Promise((resolve, reject) => {
    const id = next++;
    waiting.set(id, { resolve, reject, method });
    child.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + '\0');
  });
  const once = (method) => new Promise((resolve) => {
    const l = (msg) => {
      if (msg.method !== method) return;
      listeners.splice(listeners.indexOf(l), 1);
      resolve(msg.params);
    };
    listeners.push(l);
  });
  return { child, send, once };
}

// A page session: evaluate expressions, wait for conditions, type.
async function openPage(cdp) {
  const { targetInfos } = await cdp.send('Target.getTargets');
  const target = targetInfos.find((t) => t.type === 'page');
  const { sessionId } = await cdp.send('Target.attachToTarget', { targetId: target.targetId, flatten: true });
  const send = (method, params) => cdp.send(method, params, sessionId);
  await send('Page.enable');
  await send('Runtime.enable');
  const evaluate = async (expression) => {
    const r = await send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value;
  };
  const waitFor = async (expression, what, ms = 30_000 * SCALE) => {
    const end = Date.now() + ms;
    for (;;) {
      const v = await evaluate(expression);
      if (v) return v;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  const navigate = async (url) => {
    const loaded = cdp.once('Page.loadEventFired');
    await send('Page.navigate', { url });
    await loaded;
  };
  const type = async (selector, text) => {
    await evaluate(`document.querySelector(${JSON.stringify(selector)}).focus()`);
    await send('Input.insertText', { text });
  };
  const key = async (k, code) => {
    for (const type of ['keyDown', 'keyUp'])
      await send('Input.dispatchKeyEvent', { type, key: k, code, windowsVirtualKeyCode: 13, text: type === 'keyDown' ? '\r' : undefined });
  };
  return { send, evaluate, waitFor, navigate, type, key };
}

async function pageChecks(url) {
  const profile = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-webui-'));
  const cdp = launch(profile);
  try {
    const page = await openPage(cdp);
    await page.navigate(`${url}/`);
    // the models request got a 401, so the settings dialog asks for the key
    const note = await page.waitFor(`document.getElementById('settings').open && document.getElementById('settings-note').textContent`, 'the key prompt');
    check(/API key/.test(note), `the page asks for the API key (${note})`);
    await page.evaluate(`document.getElementById('max-tokens').value = ''`);
    await page.type('#max-tokens', '24');
    await page.type('#api-key', KEY);
    await page.evaluate(`document.getElementById('save-settings').click()`);
    const model = await page.waitFor(`document.getElementById('model').textContent`, 'the model name');
    check(model === 'demo', `the header names the model (${model})`);

    await page.type('#input', MESSAGE);
    await page.key('Enter', 'Enter');
    await page.waitFor(`document.getElementById('send').textContent === 'Stop'`, 'the stop button while streaming', 5000 * SCALE).catch(() => {});
    await page.waitFor(`document.getElementById('send').textContent === 'Send' && document.querySelectorAll('.msg.assistant').length === 1`, 'the end of the answer');
    const shown = await page.evaluate(`document.querySelector('.msg.assistant').innerText`);
    const stored = await page.evaluate(`JSON.parse(localStorage.getItem('mlxcel.messages'))`);
    const reply = stored?.[1];
    check(reply?.role === 'assistant' && reply.content.trim().length > 0 && !reply.error,
      `the streamed answer is kept (${JSON.stringify(reply)})`);
    check(/\d+ tokens, [\d.]+ tok\/s/.test(shown), `tokens/s is shown (${JSON.stringify(shown)})`);

    // the same request straight to the API gives the same text: the page shows what streamed
    const r = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: MESSAGE }], temperature: 0.8, top_p: 0.95, max_tokens: 24 }),
    });
    const direct = (await r.json()).choices?.[0]?.message?.content;
    check(reply?.content === direct, `the page's answer is the API's (${JSON.stringify(reply?.content)} vs ${JSON.stringify(direct)})`);
    const firstWords = (direct ?? '').trim().split(/\s+/).slice(0, 3).join(' ');
    check(firstWords && shown.replace(/\s+/g, ' ').includes(firstWords), `the answer appears in the page (${JSON.stringify(shown)})`);

    // the renderer: model text never becomes markup, and the markdown it does render
    const md = (src) => page.evaluate(`markdown(${JSON.stringify(src)})`);
    const img = await md('<img src=x onerror="alert(1)"> & <script>x</script>');
    check(!/<img|<script/.test(img) && img.includes('&lt;img'), `HTML in an answer is escaped (${img})`);
    const code = await md('Look:\n```js\nlet a = "<b>";\n```\n**bold** and `x < y`');
    check(code.includes('<pre data-lang="js"><code>let a = &quot;&lt;b&gt;&quot;;</code></pre>') &&
          code.includes('<strong>bold</strong>') && code.includes('<code>x &lt; y</code>'),
      `code blocks, bold and inline code render (${code})`);
    const link = await md('[a](javascript:alert(1)) [b](https://example.com/x)');
    check(!link.includes('javascript:"') && !link.includes('href="javascript') &&
          link.includes('<a href="https://example.com/x" target="_blank" rel="noopener noreferrer">b</a>'),
      `only http(s) links become links (${link})`);
    const thought = await page.evaluate(`bubbleHtml({ role: 'assistant', content: 'yes', reasoning: 'hmm' }, false)`);
    check(/<details class="reasoning"><summary>Reasoning<\/summary><p>hmm<\/p><\/details><p>yes<\/p>/.test(thought),
      `reasoning is a collapsed block before the answer (${thought})`);

    // Stop: with the network slowed to a trickle the answer streams for seconds; the button
    // aborts it, the part that came is kept, and the page is ready for the next message
    await page.send('Network.enable');
    await page.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: 300, uploadThroughput: -1 });
    await page.evaluate(`settings.max_tokens = 400`);
    await page.type('#input', 'And then?');
    await page.key('Enter', 'Enter');
    await page.waitFor(`document.getElementById('send').textContent === 'Stop' && /[1-9]\\d* tokens?/.test(document.querySelectorAll('.msg.assistant')[1]?.innerText)`, 'the second answer to start');
    await page.evaluate(`document.getElementById('send').click()`);
    await page.waitFor(`document.getElementById('send').textContent === 'Send'`, 'the stop to take effect', 10_000 * SCALE);
    await page.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
    const stopped = (await page.evaluate(`JSON.parse(localStorage.getItem('mlxcel.messages'))`))?.[3];
    check(stopped?.error === 'stopped' && stopped.content.length > 0,
      `Stop ends the answer, keeps what came and says so (${JSON.stringify(stopped)})`);
    await page.evaluate(`settings.max_tokens = 24`);

    const shot = await page.send('Page.captureScreenshot', { format: 'png' });
    writeFileSync(SCREENSHOT, Buffer.from(shot.data, 'base64'));
    console.log(`screenshot: ${SCREENSHOT}`);

    // a reload keeps the conversation (localStorage) and the key
    await page.navigate(`${url}/`);
    const kept = await page.waitFor(`document.querySelectorAll('.msg').length === 4 && document.getElementById('model').textContent`, 'the conversation after a reload');
    check(kept === 'demo', 'the conversation and the key survive a reload');
  } finally {
    // the profile goes once the browser has stopped writing to it; its helper processes
    // outlive the main one for a moment (under load a file appeared during the removal:
    // ENOTEMPTY), so the removal retries
    const gone = new Promise((resolve) => (cdp.child.exitCode !== null ? resolve() : cdp.child.once('exit', resolve)));
    cdp.child.kill('SIGKILL');
    await gone;
    rmSync(profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
  }
}

try {
  const s = await startServer(['-m', MODEL, '--api-key', KEY, '--seed', '7']);
  const r = await fetch(`${s.url}/`);
  check(r.status === 200 && r.headers.get('content-type')?.startsWith('text/html') &&
        /frame-ancestors 'none'/.test(r.headers.get('content-security-policy') ?? ''),
    `GET / serves the page without the key, confined by its CSP (${r.status})`);
  await r.arrayBuffer();
  await pageChecks(s.url);
  await stopServer(s);

  const off = await startServer(['-m', MODEL, '--no-webui']);
  const r2 = await fetch(`${off.url}/`);
  check(r2.status === 404, `--no-webui: GET / is a 404 (${r2.status})`);
  await r2.arrayBuffer();
  await stopServer(off);
} catch (e) {
  fail(e);
}
finish('web page: ');
