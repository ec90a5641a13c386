// mlxcel-server against the faults a hostile-input campaign found, each reproduced as it was
// found: a model name that is not UTF-8, an empty key, work in progress at a stop signal,
// connection hogs, error messages that are not UTF-8, half-closed clients, cross-site pages,
// oversized prompts, and requests whose framing is in doubt. Each server runs on a free
// loopback port; a watchdog bounds the run.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { BIN, MODEL } from '../node/setup.mjs';
import { rawHttp } from '../node/rawhttp.mjs';

// Sanitizer builds are several times slower; this stretches the clients' patience only.
const TIME_SCALE = Number(process.env.MLXCEL_TEST_TIME_SCALE ?? 1);

const h = harness({ bin: BIN, label: 'hardening', timeoutMs: 150_000 * TIME_SCALE });
const { check, fail, startServer, stopServer, finish } = h;
const { buildRequest, exchange } = rawHttp({ key: null, timeoutMs: 30_000 * TIME_SCALE });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const call = (port, method, route, body, extra, opts) => exchange(port, buildRequest(method, route, body, extra), opts);
const msgs = [{ role: 'user', content: 'Tell me about the king.' }];

function errorBody(r, status) {
  if (r.status !== status) return false;
  try {
    const e = JSON.parse(r.body).error;
    return typeof e.message === 'string' && e.message.length > 0 && e.code === status;
  } catch {
    return false;
  }
}

const sseData = (body) => (body ?? '').split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));

// Runs mlxcel-server expecting it to exit by itself; resolves with { code, log }.
// 1. A model name that is not valid UTF-8 (the folder's name, or --alias): every route
// answers, the stream included, and the name comes out with U+FFFD for the stray byte.
async function badNamePart() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-name-'));
  execFileSync('/bin/sh', ['-c', 'cp -r "$0" "$(printf "%s/demo\\351" "$1")"', MODEL, dir]);
  const runs = [['the folder\'s name', 'exec "$0" -m "$(printf "%s/demo\\351" "$1")" --port 0 -t 2 -c 256 -np 1', [dir]],
    ['--alias', 'exec "$0" -m "$1" --alias "$(printf "demo\\351")" --port 0 -t 2 -c 256 -np 1', [MODEL]]];
  try {
    for (const [what, script, args] of runs) {
      const s = await startServer(args, {}, { shell: script });
      let r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 4, stream: true });
      const ev = sseData(r.body);
      check(r.status === 200 && ev.at(-1) === '[DONE]', `1 (${what}): a stream completes (${r.status ?? r.error})`);
      const first = ev.length > 1 ? JSON.parse(ev[0]) : {};
      check(first.model === 'demo\ufffd', `1 (${what}): the stream names the model 'demo\\ufffd' (${JSON.stringify(first.model)})`);
      r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 4 });
      check(r.status === 200 && JSON.parse(r.body).model === 'demo\ufffd', `1 (${what}): a whole response too (${r.status ?? r.error})`);
      r = await call(s.port, 'GET', '/v1/models');
      check(r.status === 200 && JSON.parse(r.body).data[0].id === 'demo\ufffd', `1 (${what}): /v1/models too (${r.status ?? r.error})`);
      check((await stopServer(s)) === 0, `1 (${what}): the server stops cleanly`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// 3. An empty key is refused, not taken for "no key".
async function emptyKeyPart() {
  let r = await h.runToExit(['-m', MODEL, '--api-key', ''], {}, 20_000 * TIME_SCALE);
  check(r.code === 2 && /--api-key: the key is empty/.test(r.log), `3: --api-key '' exits 2 with a reason (${r.code}: ${r.log.trim()})`);
  r = await h.runToExit(['-m', MODEL], { LLAMA_ARG_API_KEY: '' }, 20_000 * TIME_SCALE);
  check(r.code === 2 && /--api-key: the key is empty/.test(r.log), `3: LLAMA_ARG_API_KEY= exits 2 with a reason (${r.code}: ${r.log.trim()})`);
}

// 4 and 11 (SIGHUP). The stop signals: what runs finishes within --shutdown-timeout, what
// waits gets a 503, what is still running then ends with finish_reason "abort" and [DONE].
async function shutdownPart() {
  // idle: SIGHUP takes the graceful path too, and nothing was cut
  let s = await startServer(['-m', MODEL, '-c', '256', '-np', '1']);
  s.child.removeAllListeners('exit');
  let exited = new Promise((res) => s.child.on('exit', (code) => res(code)));
  s.child.kill('SIGHUP');
  check((await exited) === 0, '4: SIGHUP on an idle server exits 0');

  // a short request finishes inside the timeout: answered whole, exit 0
  s = await startServer(['-m', MODEL, '-c', '256', '-np', '1', '--shutdown-timeout', '30']);
  const short = call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 24, temperature: 0 });
  await sleep(100);
  s.child.removeAllListeners('exit');
  exited = new Promise((res) => s.child.on('exit', (code) => res(code)));
  s.child.kill('SIGTERM');
  let r = await short;
  check(r.status === 200 && ['stop', 'length'].includes(JSON.parse(r.body).choices[0].finish_reason), `4: a request running at SIGTERM finishes (${r.status ?? r.error})`);
  check((await exited) === 0, '4: and the server exits 0, nothing cut');

  // one long stream running, a whole request and a stream queued behind it (-np 1)
  s = await startServer(['-m', MODEL, '-c', '512', '-np', '1', '--shutdown-timeout', '0']);
  const long = { prompt: 'Once upon a time', n_predict: 450, ignore_eos: true, temperature: 0 };
  const running = call(s.port, 'POST', '/v1/completions', { ...long, stream: true });
  await sleep(300);
  const queuedWhole = call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 8 });
  const queuedStream = call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 8, stream: true });
  await sleep(200);
  s.child.removeAllListeners('exit');
  exited = new Promise((res) => s.child.on('exit', (code) => res(code)));
  const t0 = Date.now();
  s.child.kill('SIGTERM');
  r = await running;
  const ev = sseData(r.body);
  const last = ev.length > 1 ? JSON.parse(ev.at(-2)) : {};
  check(r.status === 200 && ev.at(-1) === '[DONE]' && last.choices?.[0]?.finish_reason === 'abort',
    `4: the running stream ends with finish_reason "abort" and [DONE] (${r.status ?? r.error}, ${JSON.stringify(last).slice(0, 120)})`);
  check(Date.now() - t0 < 4000 * TIME_SCALE, `4: after about --shutdown-timeout 1 (${Date.now() - t0} ms)`);
  for (const [what, p] of [['whole', queuedWhole], ['streamed', queuedStream]]) {
    r = await p;
    check(errorBody(r, 503), `4: the queued ${what} request gets a 503 (${r.status ?? r.error} ${r.body?.slice(0, 100)})`);
  }
  check((await exited) === 1, '4: the server exits 1: work was cut');

  // a second signal ends the running request at once, however long the timeout
  s = await startServer(['-m', MODEL, '-c', '512', '-np', '1', '--shutdown-timeout', '300']);
  const whole = call(s.port, 'POST', '/v1/completions', long);
  await sleep(300);
  s.child.removeAllListeners('exit');
  exited = new Promise((res) => s.child.on('exit', (code) => res(code)));
  s.child.kill('SIGINT');
  await sleep(300);
  const t1 = Date.now();
  s.child.kill('SIGINT');
  r = await whole;
  const body = r.status === 200 ? JSON.parse(r.body) : {};
  check(body.choices?.[0]?.finish_reason === 'abort' && body.choices[0].text.length > 0,
    `4: a second signal ends a whole request with what it had and "abort" (${r.status ?? r.error} ${r.body?.slice(0, 100)})`);
  check(Date.now() - t1 < 3000 * TIME_SCALE, `4: at once (${Date.now() - t1} ms)`);
  check((await exited) === 1, '4: the server exits 1');
}

// 5. One client cannot take every connection, nor lock its own address out.
async function connectionsPart() {
  const s = await startServer(['-m', MODEL, '-c', '256', '-np', '2', '--max-queue', '8', '--metrics',
    '--max-connections', '48', '--max-connections-per-ip', '16', '--read-timeout', '20']);
  // slow-header connections from one address, more than its limit
  const slowHead = Buffer.from('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' + 'X-Slow: yes\r\n'.repeat(400));
  const drip = Array.from(slowHead, (b) => Buffer.from([b]));
  const slow = Array.from({ length: 24 }, () => exchange(s.port, drip, { gapMs: 50, localAddress: '127.0.0.2', timeoutMs: 30_000 }));
  await sleep(1500);
  let r = await call(s.port, 'GET', '/health', undefined, {}, { localAddress: '127.0.0.2', timeoutMs: 5000 });
  check(r.status === 200, `5: the slow clients' own address still gets /health through (${r.status ?? r.error})`);
  r = await call(s.port, 'GET', '/health', undefined, {}, { timeoutMs: 5000 });
  check(r.status === 200, `5: another address gets /health (${r.status ?? r.error})`);
  r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 4 }, {}, { localAddress: '127.0.0.2' });
  check(r.status === 200, `5: and a chat from the slow clients' address is answered (${r.status ?? r.error})`);
  // over capacity from one address: every request is answered, 200 or 503, none just closed
  const flood = await Promise.all(Array.from({ length: 120 }, () =>
    call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 2 }, {}, { localAddress: '127.0.0.4', timeoutMs: 60_000 * TIME_SCALE })));
  const tally = {};
  for (const x of flood) tally[x.status ?? x.error] = (tally[x.status ?? x.error] ?? 0) + 1;
  check(flood.every((x) => x.status === 200 || errorBody(x, 503)), `5: 120 simultaneous chats all answered, 200 or 503 (${JSON.stringify(tally)})`);
  check(flood.some((x) => x.status === 200), `5: some of them served (${JSON.stringify(tally)})`);
  const m = (await call(s.port, 'GET', '/metrics', undefined)).body ?? '';
  check(/^mlxcel_http_connections_replaced_total [1-9]/m.test(m), '5: /metrics counts the replaced slow connections');
  for (const p of slow) p.catch(() => {});
  check((await stopServer(s)) === 0, '5: the server stops cleanly');
  await Promise.all(slow);
}

// 6, 7, 8, 9, 11 on one server.
async function requestsPart() {
  const s = await startServer(['-m', MODEL, '-c', '512', '-np', '2', '--metrics', '--cors', 'https://app.example']);
  // 6: error messages that would not be UTF-8
  let r = await exchange(s.port, Buffer.from('GET /%ff HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n'));
  check(errorBody(r, 404), `6: GET /%ff gets a 404 with a JSON error (${r.status ?? r.error})`);
  const bias = { ['é'.repeat(600)]: 1 };
  r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, logit_bias: bias });
  check(errorBody(r, 400), `6: a logit_bias key of 600 'é' gets its 400 (${r.status ?? r.error})`);

  // 7: a whole request, then the client shuts down its sending side
  for (const stream of [false, true]) {
    r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 6, stream }, {}, { halfClose: true });
    const ok = stream ? sseData(r.body).at(-1) === '[DONE]' : r.status === 200 && JSON.parse(r.body).choices[0].message.content.length > 0;
    check(r.status === 200 && ok, `7: a half-closed client gets its ${stream ? 'stream' : 'response'} (${r.status ?? r.error})`);
    check(r.interim === 1, `7: after one interim 100 Continue, which finds out it still reads (${r.interim})`);
  }

  // 7: but a client that closed its socket while its whole response was being made is found
  // out, and its request cancelled
  const cancelled = async () => Number(((await call(s.port, 'GET', '/metrics')).body ?? '').match(/^mlxcel_requests_cancelled_total (\S+)$/m)?.[1]);
  const before = await cancelled();
  r = await call(s.port, 'POST', '/v1/completions', { prompt: 'Once', n_predict: 400, ignore_eos: true }, {}, { abortMs: 300 });
  let after = before;
  for (let i = 0; i < 40 && after === before; i++) {
    await sleep(50);
    after = await cancelled();
  }
  check(r.aborted && after === before + 1, `7: a whole request whose client closed is cancelled (${before} -> ${after})`);

  // 8: pages of other sites, and names that are not this machine's
  const plain = { 'Content-Type': 'text/plain' };
  r = await call(s.port, 'POST', '/v1/chat/completions', JSON.stringify({ messages: msgs, max_tokens: 2 }), { ...plain, Origin: 'https://evil.example' });
  check(errorBody(r, 403), `8: a text/plain POST from another site's page gets 403 (${r.status ?? r.error})`);
  r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 2 }, { Host: 'rebind.evil.example:8080' });
  check(errorBody(r, 403), `8: a Host that is not this machine's gets 403 (${r.status ?? r.error})`);
  r = await call(s.port, 'OPTIONS', '/v1/chat/completions', undefined, { Origin: 'https://evil.example', 'Access-Control-Request-Method': 'POST' });
  check(r.status === 403, `8: so does another site's preflight (${r.status ?? r.error})`);
  for (const [what, extra] of [['the --cors origin', { Origin: 'https://app.example' }],
    ['the server\'s own origin', { Host: `localhost:${s.port}`, Origin: `http://localhost:${s.port}` }],
    ['no Origin (not a browser)', {}], ['Host localhost', { Host: `localhost:${s.port}` }], ['Host [::1]', { Host: `[::1]:${s.port}` }]]) {
    r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 2 }, extra);
    check(r.status === 200, `8: ${what} is served (${r.status ?? r.error})`);
  }
  r = await call(s.port, 'OPTIONS', '/v1/chat/completions', undefined,
    { Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, x-stainless-os' });
  check(r.status === 204 && /x-stainless-os/.test(r.headers['access-control-allow-headers'] ?? ''), `8: the --cors preflight allows the headers asked for (${r.status ?? r.error})`);

  // 9: an oversized prompt is refused before it is tokenized
  const big = 'word '.repeat(1_400_000);
  let t0 = Date.now();
  r = await call(s.port, 'POST', '/v1/completions', { prompt: big, max_tokens: 1 });
  const ms = Date.now() - t0;
  check(errorBody(r, 400) && /bytes/.test(r.body), `9: a 7 MB prompt gets its 400 (${r.status ?? r.error})`);
  check(ms < 1500 * TIME_SCALE, `9: fast (${ms} ms; tokenizing it all takes seconds)`);
  t0 = Date.now();
  r = await call(s.port, 'POST', '/v1/chat/completions', { messages: [{ role: 'user', content: big }] });
  check(errorBody(r, 400) && Date.now() - t0 < 1500 * TIME_SCALE, `9: a 7 MB chat message too (${r.status ?? r.error}, ${Date.now() - t0} ms)`);

  // 11: framing
  const body = JSON.stringify({ content: 'hello' });
  r = await exchange(s.port, Buffer.from(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nContent-Length: 5\r\n\r\n${body}`));
  check(errorBody(r, 400) && /Content-Length/.test(r.body), `11: Content-Length headers that disagree get 400 (${r.status ?? r.error})`);
  r = await exchange(s.port, Buffer.from(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: ${body.length}\r\nContent-Length: ${body.length}\r\n\r\n${body}`));
  check(r.status === 200, `11: identical duplicates are read as one (${r.status ?? r.error})`);
  const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
  r = await exchange(s.port, Buffer.from(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`));
  check(errorBody(r, 400) && r.headers.connection === 'close', `11: Content-Length with chunked gets 400 and the connection closed (${r.status ?? r.error} ${r.headers?.connection})`);
  check(!/\{"status":"ok"\}/.test(r.body ?? ''), '11: and the bytes after it are not read as a request');
  r = await exchange(s.port, Buffer.from(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\n${body}`));
  check(errorBody(r, 501), `11: Transfer-Encoding gzip gets 501 (${r.status ?? r.error})`);
  r = await exchange(s.port, Buffer.from('HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n'));
  check(r.status === 200 && r.body === '', `11: HEAD /health is 200 without a body (${r.status ?? r.error})`);
  check((await stopServer(s)) === 0, 'the server stops cleanly');
}

try {
  await emptyKeyPart();
  await badNamePart();
  await requestsPart();
  await connectionsPart();
  await shutdownPart();
} catch (e) {
  fail(e);
}
finish('hardening: ');
