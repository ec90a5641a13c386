// Fault and load test of mlxcel-server on the demo model, over loopback only.
//
// One server with a KV pool smaller than its -np sequences need (so that sequences are
// preempted) takes a few hundred requests from dozens of concurrent clients: well-formed
// requests of every route, streamed and not, mixed with aborts mid-stream and mid-body,
// malformed, oversize and unauthorized bodies, prompts longer than the context and odd fields.
// Meanwhile slow clients send their headers or bodies a byte at a time from other loopback
// addresses: the per-address limit refuses some (closed within a second), the read deadline
// drops the rest, and well-formed requests keep completing while they hold their connections.
// Before it, a burst of simultaneous requests over the server's capacity: each is answered,
// 200 or 503. Every well-formed request of the load must complete (200 and a whole response); every
// other one must get its 4xx with an OpenAI-shaped error or be dropped. At the end the server
// is alive, no KV block is referenced, free + cached blocks make up the pool, and its resident
// memory is within 10% of what it was after a warm-up.
//
// Before the load a table of odd bodies runs one by one, each followed by /health; after it a
// second server checks the global connection limit, the header limit flag and CORS.
//
// Randomness is seeded: MLXCEL_SOAK_SEED=N replays a run's choices (timing still varies).
// MLXCEL_SOAK_REQUESTS sets the number of requests (default 400).
import { readFileSync } from 'node:fs';

import { harness } from '../node/harness.mjs';
import { rawHttp } from '../node/rawhttp.mjs';
import { BIN, MODEL } from '../node/setup.mjs';

const KEY = 'soak-key-0123456789';
const SEED = Number(process.env.MLXCEL_SOAK_SEED ?? Math.floor(Math.random() * 2 ** 32));
const N_REQUESTS = Number(process.env.MLXCEL_SOAK_REQUESTS ?? 400);
const N_CLIENTS = 32;
// Sanitizer builds run several times slower: their tests.cmake sets this factor, which
// stretches the time the load may take and the per-request patience, never the server's own
// deadlines (read timeout, slow-client drop) that the checks measure.
const TIME_SCALE = Number(process.env.MLXCEL_TEST_TIME_SCALE ?? 1);
const LOAD_S = 60 * TIME_SCALE; // no new requests after this; a healthy run needs about half of it
const REQUEST_TIMEOUT_MS = 30_000 * TIME_SCALE;
const MAX_BODY = 65536;
const READ_TIMEOUT_S = 2;
const PER_IP = 48;
const REFUSED_S = 1; // a connection refused by a limit must send its request within this
const N_SLOW_HEADERS = 64; // from 127.0.0.2: PER_IP of them are let in
const N_SLOW_BODIES = 8; // from 127.0.0.3
const N_BURST = 160; // from 127.0.0.5, past PER_IP and MAX_QUEUE
const MAX_QUEUE = 40; // more than N_CLIENTS: the load itself is never refused
const N_WARMUP = 150; // requests of the load after which the server's memory is its baseline
const CTX = 256;
// 16 blocks of 32 tokens: two full sequences, while -np 4 runs four at once
const KV_BUDGET = 16 * 196608;

console.log(`soak: seed ${SEED} (replay with MLXCEL_SOAK_SEED=${SEED}), ${N_REQUESTS} requests from ${N_CLIENTS} clients`);

// mulberry32: small, seedable, good enough to pick test cases
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = prng(SEED);
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (arr) => arr[Math.floor(rand() * arr.length)];

const h = harness({ bin: BIN, label: 'soak', timeoutMs: 115_000 * TIME_SCALE });
const { check, stopServer } = h;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const startServer = (args, env) => h.startServer(['-m', MODEL, '--metrics', '--api-key', KEY, ...args], env);

const { buildRequest, exchange } = rawHttp({ key: KEY, timeoutMs: REQUEST_TIMEOUT_MS });

const call = (port, method, route, body, extra, opts) => exchange(port, buildRequest(method, route, body, extra), opts);

function openaiError(r, status) {
  if (r.status !== status) return false;
  try {
    const e = JSON.parse(r.body).error;
    return typeof e.message === 'string' && e.message.length > 0 && typeof e.type === 'string' && e.code === status;
  } catch {
    return false;
  }
}

async function metrics(port) {
  const r = await call(port, 'GET', '/metrics');
  const get = (name) => Number(r.body?.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1]);
  return {
    capacity: get('mlxcel_kv_blocks_capacity'), free: get('mlxcel_kv_blocks_free'), cached: get('mlxcel_kv_blocks_cached'),
    referenced: get('mlxcel_kv_blocks_referenced'), preemptions: get('mlxcel_preemptions_total'),
    cancelled: get('mlxcel_requests_cancelled_total'), finished: get('mlxcel_requests_finished_total'),
    readTimeouts: get('mlxcel_http_read_timeouts_total'), processing: get('mlxcel_requests_processing'),
    waiting: get('mlxcel_requests_deferred'),
  };
}

async function alive(port, what) {
  const r = await call(port, 'GET', '/health', undefined, {}, { timeoutMs: 10_000 * TIME_SCALE });
  check(r.status === 200, `${what}: the server answers /health afterwards (${r.status ?? r.error})`);
}

// ---- well-formed requests and what a complete answer looks like ----

const WORDS = 'the sea ship wind storm island captain map gold night star river forest king queen dragon castle road rain sun'.split(' ');
const words = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');

function sseEvents(body) {
  return body.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
}

function validChat(r, stream, maxTokens) {
  if (r.status !== 200 || !r.complete) return `status ${r.status ?? r.error}`;
  if (!stream) {
    const j = JSON.parse(r.body);
    const c = j.choices?.[0];
    if (typeof c?.message?.content !== 'string' || !['stop', 'length'].includes(c.finish_reason)) return `bad body ${r.body.slice(0, 200)}`;
    if (!(j.usage.completion_tokens <= maxTokens)) return `usage ${JSON.stringify(j.usage)} over ${maxTokens}`;
    return null;
  }
  const ev = sseEvents(r.body);
  if (ev.at(-1) !== '[DONE]') return `stream did not end with [DONE]: ${r.body.slice(-200)}`;
  const chunks = ev.slice(0, -1).map((e) => JSON.parse(e));
  if (chunks.some((c) => c.error)) return `error event ${r.body.slice(-200)}`;
  if (!chunks.some((c) => ['stop', 'length'].includes(c.choices?.[0]?.finish_reason))) return 'no finish_reason';
  return null;
}

function validLlama(r, stream) {
  if (r.status !== 200 || !r.complete) return `status ${r.status ?? r.error}`;
  const last = stream ? JSON.parse(sseEvents(r.body).at(-1)) : JSON.parse(r.body);
  if (last.stop !== true || typeof last.content !== 'string') return `last event ${JSON.stringify(last).slice(0, 200)}`;
  return null;
}

const stats = { requests: 0, completed: 0, aborted: 0, byKind: {}, errors: {}, completedWhileSlowHeld: 0, slowestMs: 0 };
const slow = { held: 0, refused: 0, dropped: 0, answered: 0, lateMs: [] };

function tally(kind, r) {
  stats.byKind[kind] = (stats.byKind[kind] ?? 0) + 1;
  const key = r.aborted ? 'aborted by client' : r.status ? String(r.status) : r.error;
  stats.errors[key] = (stats.errors[key] ?? 0) + 1;
}

// Resident memory of the server (kB), from /proc.
const rssKb = (pid) => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+)/m)[1]);

// Many requests at once, more than -np runs and --max-queue holds, from one address (more
// connections than its limit): each one is answered, 200 or a 503 that says why.
async function burstPart(port) {
  const results = await Promise.all(Array.from({ length: N_BURST }, () =>
    call(port, 'POST', '/v1/chat/completions', { messages: [{ role: 'user', content: words(6) }], max_tokens: 4 }, {},
      { localAddress: '127.0.0.5', timeoutMs: REQUEST_TIMEOUT_MS * 2 })));
  const tally = {};
  for (const r of results) tally[r.status ?? r.error] = (tally[r.status ?? r.error] ?? 0) + 1;
  console.log(`soak: a burst of ${N_BURST} simultaneous chats: ${JSON.stringify(tally)}`);
  check(results.every((r) => (r.status === 200 && !validChat(r, false, 4)) || openaiError(r, 503)),
    `the burst: every request answered with a whole 200 or an OpenAI 503 (${JSON.stringify(tally)})`);
  check(results.some((r) => r.status === 200) && results.some((r) => r.status === 503),
    `the burst: some served, some refused for capacity (${JSON.stringify(tally)})`);
}

// One random request: [kind, promise of a failure message or null].
async function oneRequest(port) {
  const roll = rand();
  const stream = rand() < 0.5;
  const maxTokens = randInt(1, 32);
  const temperature = pick([0, 0.7, 1.0]);
  if (roll < 0.22) {
    const body = { messages: [{ role: 'user', content: words(randInt(1, 20)) }], max_tokens: maxTokens, temperature, stream, seed: randInt(0, 1e6) };
    if (stream && rand() < 0.5) body.stream_options = { include_usage: true };
    const r = await call(port, 'POST', '/v1/chat/completions', body);
    return ['chat', r, validChat(r, stream, maxTokens)];
  }
  if (roll < 0.34) {
    const body = { prompt: words(randInt(1, 30)), max_tokens: maxTokens, temperature, stream };
    const r = await call(port, 'POST', '/v1/completions', body);
    if (r.status !== 200 || !r.complete) return ['completion', r, `status ${r.status ?? r.error}`];
    return ['completion', r, stream ? (sseEvents(r.body).at(-1) === '[DONE]' ? null : 'no [DONE]') : (typeof JSON.parse(r.body).choices?.[0]?.text === 'string' ? null : 'no text')];
  }
  if (roll < 0.46) {
    // long generations that together need more blocks than the pool holds
    const body = { prompt: words(randInt(10, 40)), n_predict: randInt(120, 200), ignore_eos: true, temperature, stream };
    const r = await call(port, 'POST', '/completion', body);
    return ['long', r, validLlama(r, stream)];
  }
  if (roll < 0.58) {
    const body = { prompt: words(randInt(5, 30)), n_predict: 400, ignore_eos: true, stream: rand() < 0.7 };
    const r = await call(port, 'POST', '/completion', body, {}, { abortMs: randInt(5, 600) });
    if (r.aborted) return ['abort', r, null];
    return ['abort', r, validLlama(r, body.stream)];
  }
  if (roll < 0.62) {
    // hangs up half way through the body
    const req = buildRequest('POST', '/v1/chat/completions', { messages: [{ role: 'user', content: words(50) }] });
    const r = await exchange(port, [req.subarray(0, randInt(10, req.length - 1))], { abortMs: randInt(0, 50) });
    return ['abort mid-body', r, r.aborted ? null : `got ${r.status ?? r.error}`];
  }
  if (roll < 0.70) {
    const bad = pick(['{"messages": [', '{"messages": [{"role": "user", "content": "hi"}]', 'nul', '', '[]', '"text"', '{"a":1}{',
      '\u00ff\u00fe{', '{"messages": [{"role": "user", "content": "\\ud800"}]}', '{"prompt": "x", "max_tokens": 1e99999}']);
    const route = pick(['/v1/chat/completions', '/v1/completions', '/completion', '/tokenize']);
    const r = await call(port, 'POST', route, bad);
    return ['malformed', r, openaiError(r, 400) ? null : `expected a 400 error for ${JSON.stringify(bad)} on ${route}: ${r.status ?? r.error} ${r.body?.slice(0, 100)}`];
  }
  if (roll < 0.76) {
    const size = randInt(MAX_BODY + 1, 4 * MAX_BODY);
    const body = JSON.stringify({ prompt: 'x'.repeat(size) });
    // without Content-Length the body arrives chunked and is read to its end before the 413
    const chunked = rand() < 0.5;
    const extra = chunked ? { 'Content-Length': null, 'Transfer-Encoding': 'chunked' } : {};
    const payload = chunked ? `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n` : body;
    const r = await call(port, 'POST', '/v1/completions', payload, extra);
    return ['oversize', r, openaiError(r, 413) ? null : `expected 413: ${r.status ?? r.error}`];
  }
  if (roll < 0.80) {
    const r = await call(port, 'POST', '/v1/completions', { prompt: 'word '.repeat(randInt(300, 2000)) });
    return ['prompt over context', r, openaiError(r, 400) ? null : `expected 400: ${r.status ?? r.error}`];
  }
  if (roll < 0.86) {
    const o = pick(ODD);
    const r = await call(port, 'POST', o.route ?? '/v1/chat/completions', o.body);
    return ['odd fields', r, judgeOdd(o, r)];
  }
  if (roll < 0.90) {
    const r = await call(port, 'POST', '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }, { Authorization: `Bearer ${KEY.slice(0, -1)}` });
    return ['unauthorized', r, openaiError(r, 401) ? null : `expected 401: ${r.status ?? r.error}`];
  }
  const route = pick(['/v1/models', '/props', '/slots', '/health', '/tokenize']);
  const r = route === '/tokenize' ? await call(port, 'POST', route, { content: words(8) }) : await call(port, 'GET', route);
  return ['info', r, r.status === 200 && r.complete ? null : `${route}: ${r.status ?? r.error}`];
}

// ---- odd fields: 200 or 400 (with an OpenAI error), never a crash ----

const msgs = [{ role: 'user', content: 'Tell me a story.' }];
let nested = 'null';
for (let i = 0; i < 1500; i++) nested = `{"a":${nested}}`;
const ODD = [
  { what: 'max_tokens INT32_MAX', body: { messages: msgs, max_tokens: 2147483647, temperature: 0 }, ok: [200] },
  { what: 'max_tokens 2^40', body: { messages: msgs, max_tokens: 2 ** 40 }, ok: [400] },
  { what: 'max_tokens 1e300', body: { messages: msgs, max_tokens: 1e300 }, ok: [400] },
  { what: 'max_tokens -5', body: { messages: msgs, max_tokens: -5 }, ok: [400] },
  { what: 'max_tokens 0', body: { messages: msgs, max_tokens: 0 }, ok: [400] },
  { what: 'n_predict huge on /completion', route: '/completion', body: { prompt: 'Once', n_predict: 2147483647, temperature: 0 }, ok: [200] },
  { what: 'temperature -1', body: { messages: msgs, temperature: -1 }, ok: [400] },
  { what: 'temperature "NaN"', body: { messages: msgs, temperature: 'NaN' }, ok: [400] },
  { what: 'top_p "Infinity"', body: { messages: msgs, top_p: 'Infinity' }, ok: [400] },
  { what: 'min_p "-0"', body: { messages: msgs, min_p: '-0' }, ok: [400] },
  { what: 'temperature 1e308', body: { messages: msgs, temperature: 1e308, max_tokens: 4 }, ok: [400] },
  { what: 'top_k -1', body: { messages: msgs, top_k: -1 }, ok: [400] },
  { what: 'top_k 2^31', body: { messages: msgs, top_k: 2 ** 31 }, ok: [400] },
  { what: 'repeat_penalty 0', body: { messages: msgs, repeat_penalty: 0 }, ok: [400] },
  { what: 'seed -1e30', body: { messages: msgs, seed: -1e30 }, ok: [400] },
  { what: 'seed past int64', body: `{"messages": ${JSON.stringify(msgs)}, "seed": 99999999999999999999999}`, ok: [400] },
  { what: 'n 2', body: { messages: msgs, n: 2, max_tokens: 4 }, ok: [200] },
  { what: 'n 1000', body: { messages: msgs, n: 1000 }, ok: [400] },
  { what: 'best_of below n', route: '/v1/completions', body: { prompt: 'a', n: 3, best_of: 2 }, ok: [400] },
  { what: 'best_of streamed', route: '/v1/completions', body: { prompt: 'a', best_of: 2, stream: true }, ok: [400] },
  { what: 'echo on chat', body: { messages: msgs, echo: true }, ok: [400] },
  { what: 'suffix without FIM tokens', route: '/v1/completions', body: { prompt: 'a', suffix: 'b' }, ok: [400] },
  { what: 'stop_token_ids past the vocabulary', route: '/v1/completions', body: { prompt: 'a', stop_token_ids: [1e9] }, ok: [400] },
  { what: 'min_tokens over max_tokens', route: '/v1/completions', body: { prompt: 'a', min_tokens: 9, max_tokens: 2 }, ok: [400] },
  { what: 'n 0', body: { messages: msgs, n: 0 }, ok: [400] },
  { what: 'unknown role', body: { messages: [{ role: 'wizard', content: 'hi' }], max_tokens: 4 }, ok: [200, 400] },
  { what: 'empty messages', body: { messages: [] }, ok: [400] },
  { what: 'message without role', body: { messages: [{ content: 'hi' }] }, ok: [400] },
  { what: 'message without content', body: { messages: [{ role: 'user' }], max_tokens: 4 }, ok: [200, 400] },
  { what: 'content null', body: { messages: [{ role: 'user', content: null }], max_tokens: 4 }, ok: [200, 400] },
  { what: 'content a number', body: { messages: [{ role: 'user', content: 42 }], max_tokens: 4 }, ok: [200, 400] },
  { what: 'content parts', body: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], max_tokens: 4 }, ok: [200, 400] },
  { what: 'content nested 1500 deep', body: `{"max_tokens": 4, "messages": [{"role": "user", "content": ${nested}}]}`, ok: [200, 400] },
  { what: 'body nested 20000 deep', body: `{"messages": ${'['.repeat(20000)}${']'.repeat(20000)}}`, ok: [400] },
  { what: '10k stop strings', body: { messages: msgs, stop: Array(10000).fill('x') }, ok: [400] },
  { what: 'empty stop string', body: { messages: msgs, stop: [''] }, ok: [400] },
  { what: 'stop a number', body: { messages: msgs, stop: 5 }, ok: [400] },
  { what: 'logit_bias outside the vocabulary', body: { messages: msgs, logit_bias: { 999999: 1 } }, ok: [400] },
  { what: 'logit_bias a string', body: { messages: msgs, logit_bias: { 1: 'x' } }, ok: [400] },
  { what: 'top_logprobs 1000', body: { messages: msgs, logprobs: true, top_logprobs: 1000 }, ok: [400] },
  { what: 'stream "yes"', body: { messages: msgs, stream: 'yes' }, ok: [400] },
  { what: 'stream_options a number', body: { messages: msgs, stream: true, stream_options: 5 }, ok: [400] },
  { what: 'response_format json_object', body: { messages: msgs, response_format: { type: 'json_object' }, max_tokens: 8 }, ok: [200] },
  { what: 'response_format json_schema without a schema', body: { messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, ok: [400] },
  { what: 'json_schema a string', body: { messages: msgs, json_schema: 'x' }, ok: [400] },
  { what: 'grammar a number', body: { messages: msgs, grammar: 5 }, ok: [400] },
  { what: 'grammar left-recursive', body: { messages: msgs, grammar: 'root ::= root "a"' }, ok: [400] },
  { what: 'chat_template_kwargs a number', body: { messages: msgs, chat_template_kwargs: 5 }, ok: [400] },
  { what: 'a 60 KB model name', body: { model: 'm'.repeat(60000), messages: msgs, max_tokens: 2 }, ok: [200] },
  { what: 'body null', body: 'null', ok: [400] },
  { what: 'body an array', body: '[{"messages": []}]', ok: [400] },
  { what: 'NUL escape in a string', body: '{"messages": [{"role": "user", "content": "a\\u0000b"}]}', ok: [400] },
  { what: 'prompt empty array', route: '/v1/completions', body: { prompt: [] }, ok: [400] },
  { what: 'prompt token -1', route: '/v1/completions', body: { prompt: [-1] }, ok: [400] },
  { what: 'prompt token 1e10', route: '/v1/completions', body: { prompt: [1e10] }, ok: [400] },
  { what: 'prompt two strings', route: '/v1/completions', body: { prompt: ['a', 'b'], max_tokens: 4 }, ok: [200] },
  { what: 'prompt string and ids', route: '/v1/completions', body: { prompt: ['a', [1, 2]] }, ok: [400] },
  { what: 'prompt ids and string', route: '/v1/completions', body: { prompt: [[1, 2], 'a'] }, ok: [400] },
  { what: 'prompt an object', route: '/v1/completions', body: { prompt: {} }, ok: [400] },
  { what: 'prompt missing', route: '/completion', body: { n_predict: 4 }, ok: [400] },
  { what: 'logprobs 1000 on completions', route: '/v1/completions', body: { prompt: 'a', logprobs: 1000 }, ok: [400] },
  { what: 'tokenize a number', route: '/tokenize', body: { content: 5 }, ok: [400] },
  { what: 'detokenize outside the vocabulary', route: '/detokenize', body: { tokens: [99999999] }, ok: [200, 400] },
  { what: 'detokenize -1', route: '/detokenize', body: { tokens: [-1] }, ok: [400] },
  { what: 'apply-template a string', route: '/apply-template', body: { messages: 'x' }, ok: [400] },
  { what: 'apply-template unknown role', route: '/apply-template', body: { messages: [{ role: 'x', content: 1 }] }, ok: [200, 400] },
];

function judgeOdd(o, r) {
  if (!o.ok.includes(r.status)) return `${o.what}: status ${r.status ?? r.error}, expected ${o.ok.join(' or ')}`;
  if (r.status === 400 && !openaiError(r, 400)) return `${o.what}: 400 without an OpenAI error body: ${r.body?.slice(0, 100)}`;
  if (r.status === 200) {
    try {
      JSON.parse(r.body);
    } catch {
      return `${o.what}: 200 with a body that is not JSON`;
    }
  }
  return null;
}

async function oddPart(port) {
  for (const o of ODD) {
    const r = await call(port, 'POST', o.route ?? '/v1/chat/completions', o.body, {}, { timeoutMs: REQUEST_TIMEOUT_MS });
    const bad = judgeOdd(o, r);
    check(!bad, bad ?? o.what);
    await alive(port, o.what);
  }
}

// ---- slow clients ----

// A request that never finishes arriving: its headers (or its body) a byte every 100 ms.
function slowClient(port, localAddress, body) {
  const head = body
    ? `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{"prompt": "`
    : 'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n';
  const drip = body ? 'a'.repeat(2000) : 'X-Slow: yes\r\n'.repeat(200);
  const bytes = Buffer.from(head + drip);
  const pieces = body ? [bytes.subarray(0, head.length), ...Array.from(drip, (c) => Buffer.from(c))]
    : Array.from(bytes, (b) => Buffer.from([b]));
  return exchange(port, pieces, { gapMs: 100, localAddress, timeoutMs: 30_000 });
}

async function slowPart(port) {
  const t0 = Date.now();
  const runs = [];
  for (let i = 0; i < N_SLOW_HEADERS; i++) runs.push(slowClient(port, '127.0.0.2', false));
  for (let i = 0; i < N_SLOW_BODIES; i++) runs.push(slowClient(port, '127.0.0.3', true));
  slow.held = runs.length;
  runs.forEach((p) => p.then(() => slow.held--));
  const results = await Promise.all(runs);
  for (const r of results) {
    if (r.status) {
      slow.answered++;
      console.error(`  a slow client was answered: ${r.status} ${r.body?.slice(0, 160)}`);
    }
    else if (r.error === 'client timeout') continue;
    else if (r.ms < (REFUSED_S + READ_TIMEOUT_S) * 500) slow.refused++;
    else {
      slow.dropped++;
      slow.lateMs.push(r.ms);
    }
  }
  const worst = Math.max(...slow.lateMs);
  check(slow.answered === 0, `no slow client got an answer (${slow.answered} did)`);
  check(slow.refused === N_SLOW_HEADERS - PER_IP, `the per-address limit refused ${slow.refused} of ${N_SLOW_HEADERS} slow clients, expected ${N_SLOW_HEADERS - PER_IP}`);
  check(slow.dropped === PER_IP + N_SLOW_BODIES, `the read deadline dropped ${slow.dropped} slow clients, expected ${PER_IP + N_SLOW_BODIES}`);
  check(worst < (READ_TIMEOUT_S + 2) * 1000, `the last slow client was dropped after ${worst} ms (deadline ${READ_TIMEOUT_S} s)`);
  return Date.now() - t0;
}

// ---- the load ----

async function loadPart(port, pid) {
  const failures = [];
  let next = 0;
  const t0 = Date.now();
  const client = async () => {
    while (next < N_REQUESTS && Date.now() - t0 < LOAD_S * 1000) {
      next++;
      stats.requests++;
      if (stats.requests === N_WARMUP) stats.rssWarmKb = rssKb(pid);
      const [kind, r, bad] = await oneRequest(port);
      tally(kind, r);
      if (r.aborted) stats.aborted++;
      else if (r.status === 200) {
        stats.completed++;
        stats.slowestMs = Math.max(stats.slowestMs, r.ms);
      }
      if (r.status === 200 && slow.held >= PER_IP / 2) stats.completedWhileSlowHeld++;
      if (bad) failures.push(`${kind}: ${bad}${r.status === 503 ? ` ${r.body?.slice(0, 160)}` : ''}`);
    }
  };
  const clients = Array.from({ length: N_CLIENTS }, client);
  await sleep(500);
  const slowMs = slowPart(port);
  await Promise.all(clients);
  stats.slowMs = await slowMs;
  stats.seconds = (Date.now() - t0) / 1000;
  for (const f of failures.slice(0, 20)) console.error(`  ${f}`);
  check(stats.requests >= Math.min(N_REQUESTS, 200), `${stats.requests} requests issued in ${LOAD_S} s`);
  check(failures.length === 0, `${failures.length} of ${stats.requests} requests did not get what they should`);
  check(stats.completedWhileSlowHeld > 0, `well-formed requests completed while slow clients held connections (${stats.completedWhileSlowHeld})`);
}

async function poolSettles(port, what) {
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(port);
    if (m.referenced === 0 && m.processing === 0 && m.waiting === 0) break;
    await sleep(50);
  }
  check(m.referenced === 0, `${what}: ${m.referenced} KV blocks still referenced`);
  check(m.free + m.cached === m.capacity, `${what}: free ${m.free} + cached ${m.cached} != capacity ${m.capacity}`);
  check(m.processing === 0 && m.waiting === 0, `${what}: ${m.processing} running and ${m.waiting} waiting`);
  return m;
}

// ---- limits on a second server: connections in all, header size, CORS; and the key ----

async function limitsPart() {
  const s = await startServer(['-c', '128', '-np', '1', '--max-connections', '6', '--read-timeout', '3', '--max-header', '8192', '--cors', 'https://app.example']);
  // six silent connections fill the server; a seventh is answered 503 at once, and once they
  // have been silent for a second, a new one takes the place of the oldest
  const holders = Array.from({ length: 6 }, (_, i) => exchange(s.port, [], { localAddress: `127.0.0.${10 + i}`, timeoutMs: 10_000 }));
  await sleep(300);
  const refused = await call(s.port, 'GET', '/health', undefined, {}, { timeoutMs: 5_000 });
  check(openaiError(refused, 503) && refused.ms < 1000, `a connection past --max-connections gets a 503 at once (${refused.status ?? refused.error}, ${refused.ms} ms)`);
  await sleep(1200);
  const replacing = await call(s.port, 'GET', '/health', undefined, {}, { timeoutMs: 5_000 });
  check(replacing.status === 200, `once they are slow, a new connection takes the place of one (${replacing.status ?? replacing.error})`);
  const held = (await Promise.all(holders)).map((r) => (r.status ? -1 : r.ms)).sort((a, b) => a - b);
  check(held[0] >= 1000 && held[0] < 2500, `the oldest silent connection was replaced (${held.join(', ')} ms)`);
  check(held.slice(1).every((ms) => ms >= 2900 && ms < 5000), `the rest are dropped by --read-timeout 3 (${held.join(', ')} ms)`);
  await sleep(100);
  await alive(s.port, 'after the connection limit');

  let r = await call(s.port, 'GET', '/v1/models', undefined, { 'X-Pad': 'p'.repeat(4000) });
  check(r.status === 200, `a 4 KB header passes --max-header 8192 (${r.status ?? r.error})`);
  r = await call(s.port, 'GET', '/v1/models', undefined, { 'X-Pad': 'p'.repeat(10000) });
  check(r.status === 431, `a 10 KB header gets 431 under --max-header 8192 (${r.status ?? r.error})`);

  r = await call(s.port, 'OPTIONS', '/v1/chat/completions', undefined,
    { Authorization: null, Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type' });
  check(r.status === 204, `--cors answers a preflight without a key (${r.status ?? r.error})`);
  check(r.headers?.['access-control-allow-origin'] === 'https://app.example' && /POST/.test(r.headers?.['access-control-allow-methods'] ?? '') &&
        /authorization/i.test(r.headers?.['access-control-allow-headers'] ?? ''), `preflight headers ${JSON.stringify(r.headers)}`);
  r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 2 }, { Origin: 'https://app.example' });
  check(r.status === 200 && r.headers['access-control-allow-origin'] === 'https://app.example', '--cors: a completion carries Access-Control-Allow-Origin');
  r = await call(s.port, 'GET', '/v1/models', undefined, { Authorization: 'Bearer nope' });
  check(r.status === 401 && r.headers['access-control-allow-origin'] === 'https://app.example', '--cors: so does a 401, which the page can then read');
  check((await stopServer(s)) === 0, 'the limits server stops cleanly');
}

async function keyAndCorsOffPart(port) {
  for (const [what, auth] of [['the key less its last character', `Bearer ${KEY.slice(0, -1)}`], ['the key and one more character', `Bearer ${KEY}x`],
    ['an empty key', 'Bearer '], ['the key without Bearer', KEY], ['the key in lower case', `bearer ${KEY}`]]) {
    const r = await call(port, 'GET', '/v1/models', undefined, { Authorization: auth });
    check(openaiError(r, 401), `${what} gets 401 (${r.status ?? r.error})`);
  }
  let r = await call(port, 'GET', '/v1/models');
  check(r.status === 200 && !Object.keys(r.headers).some((h) => h.startsWith('access-control-')), 'no CORS headers without --cors');
  r = await call(port, 'OPTIONS', '/v1/models', undefined, { Authorization: null, Origin: 'https://evil.example' });
  check(r.status !== 204 && r.status >= 400 && !Object.keys(r.headers ?? {}).some((h) => h.startsWith('access-control-')), `no preflight answer without --cors (${r.status ?? r.error})`);
  // a declared length over --max-body is refused before any of the body is sent
  r = await exchange(port, buildRequest('POST', '/v1/completions', undefined, { 'Content-Length': String(100 * MAX_BODY) }), { timeoutMs: 5_000 });
  check(openaiError(r, 413) && r.ms < READ_TIMEOUT_S * 1000, `413 from Content-Length alone (${r.status ?? r.error}, ${r.ms} ms)`);
  r = await call(port, 'GET', '/v1/models', undefined, { 'X-Pad': 'p'.repeat(40000) });
  check(r.status === 431, `a 40 KB header gets 431 by default (${r.status ?? r.error})`);
  await alive(port, 'after a large header');
}

let s;
try {
  s = await startServer(['-c', String(CTX), '-np', '4', '--kv-cache-budget', String(KV_BUDGET), '--max-body', String(MAX_BODY),
    '--read-timeout', String(READ_TIMEOUT_S), '--max-connections', '160', '--max-connections-per-ip', String(PER_IP),
    '--max-queue', String(MAX_QUEUE)],
    // ASan holds freed memory back in a quarantine, which would read as growth
    { ASAN_OPTIONS: `${process.env.ASAN_OPTIONS ? process.env.ASAN_OPTIONS + ':' : ''}quarantine_size_mb=8:thread_local_quarantine_size_kb=64` });
  await keyAndCorsOffPart(s.port);
  const tOdd = Date.now();
  await oddPart(s.port);
  console.log(`soak: ${ODD.length} odd bodies in ${((Date.now() - tOdd) / 1000).toFixed(1)} s, the server alive after each`);
  await poolSettles(s.port, 'after the odd bodies');
  // the burst first: its hundreds of connection threads are part of the warm-up (the C
  // library's per-thread arenas reach their number), then the load, whose first requests
  // complete the warm-up
  await burstPart(s.port);
  await loadPart(s.port, s.child.pid);
  check(s.exited === null, `the server is still running (${s.exited})`);
  const m = await poolSettles(s.port, 'after the load');
  const rssEndKb = rssKb(s.child.pid);
  console.log(`soak: resident memory ${stats.rssWarmKb} kB after ${N_WARMUP} requests, ${rssEndKb} kB at the end`);
  check(rssEndKb <= stats.rssWarmKb * 1.1, `resident memory within 10% of its value after the warm-up (${stats.rssWarmKb} -> ${rssEndKb} kB)`);
  check(m.preemptions > 0, `the pool was short enough that sequences were preempted (${m.preemptions})`);
  check(m.readTimeouts >= PER_IP + N_SLOW_BODIES, `/metrics counts the read timeouts (${m.readTimeouts})`);
  const r = await call(s.port, 'POST', '/v1/chat/completions', { messages: msgs, max_tokens: 8 });
  check(!validChat(r, false, 8), 'a request after the load completes');
  console.log(`soak: ${stats.requests} requests in ${stats.seconds.toFixed(1)} s: ${stats.completed} completed (200, the slowest in ${stats.slowestMs} ms), ${stats.aborted} aborted by the client`);
  console.log(`soak: by kind ${JSON.stringify(stats.byKind)}`);
  console.log(`soak: outcomes ${JSON.stringify(stats.errors)}`);
  console.log(`soak: slow clients: ${slow.refused} refused at once, ${slow.dropped} dropped by the read deadline (last after ${Math.max(...slow.lateMs)} ms), ` +
    `${stats.completedWhileSlowHeld} requests completed while they held connections`);
  console.log(`soak: preemptions ${m.preemptions}, cancelled ${m.cancelled}, finished ${m.finished}, read timeouts ${m.readTimeouts}; ` +
    `pool ${m.capacity} blocks: ${m.free} free, ${m.cached} cached, ${m.referenced} referenced`);
  check((await stopServer(s)) === 0, 'SIGTERM stops the loaded server cleanly');
  await limitsPart();
} catch (e) {
  h.fail(e);
}
h.finish(`soak: seed ${SEED}: `);
