// mlxcel-server as a drop-in for llama-server: started with a real llama-server launch line
// (`-m M -c 4096 -np 4 -ngl 99 -fa on -b 2048 -ub 512 --cache-type-k f16 --jinja --metrics`,
// embeddings on through LLAMA_ARG_EMBEDDINGS as a container sets it, M the demo model whose
// own chat template writes tool calls), driven by the official openai package through
// embeddings, the Responses API (text streamed, a tool round, the call streamed), completions
// with n=3, echo and prompt arrays, and models.retrieve, and by @anthropic-ai/sdk through the
// Messages API (text streamed, a tool round, the call streamed); stop_token_ids, min_tokens and n_probs; suffix on a copy of the model
// given FIM tokens; /metrics read with a strict Prometheus text-format parser, its
// histograms moving under load; then the operations a deployment relies on (several keys from
// flags and a file, x-api-key, --seed, JSON request log lines, CORS preflight, POST /props, slot
// erase) and the flag handling (LLAMA_ARG_* values, closest-spelling suggestions, refusals).
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { BIN, MODEL, SRC, load } from '../node/setup.mjs';
import { collectMessage, collectResponse } from '../node/streams.mjs';
import { WEATHER } from '../node/weather_tool.mjs';

const { default: OpenAI } = await load('openai', 'index.mjs');
const { default: Anthropic } = await load('@anthropic-ai/sdk', 'index.mjs');
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');
const validWeather = new Ajv2020({ strict: false }).compile(WEATHER);

const h = harness({ bin: BIN, label: 'drop-in test', timeoutMs: 110_000 });
const { check, fail, startServer, stopServer, finish } = h;

// A prompt of more than two KV blocks (32 tokens each), so that sharing it shows in the counts.
const LONG = 'And the king said unto the people of the land that they should go forth into the ' +
  'wilderness, and there they should find the house of the lord their god, and the king went up ' +
  'with all the men of the city. And it came to pass in those days that the men of the city went ' +
  'out to meet the king, and they said unto him, Thou art our lord and our king';
const BLOCK = 32;

// ---- a strict Prometheus text-format (0.0.4) parser ----

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"$/;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

function parseValue(v, where) {
  if (v === '+Inf') return Infinity;
  if (v === '-Inf') return -Infinity;
  if (v === 'NaN') return NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(v)) throw new Error(`${where}: bad value '${v}'`);
  return Number(v);
}

// Returns Map family -> { type, help, samples: [{ name, labels, value }] }; throws on any line
// that the format does not allow, a sample outside a declared family, a family declared twice,
// and a histogram whose buckets are not cumulative or do not end in +Inf equal to _count.
function parsePrometheus(text) {
  if (!text.endsWith('\n')) throw new Error('the text does not end with a newline');
  const families = new Map();
  let current = null;
  text.slice(0, -1).split('\n').forEach((line, i) => {
    const where = `line ${i + 1}`;
    if (line.startsWith('#')) {
      const m = line.match(/^# (HELP|TYPE) (\S+) ?(.*)$/);
      if (!m) throw new Error(`${where}: bad comment '${line}'`);
      const [, kind, name, rest] = m;
      if (!NAME.test(name)) throw new Error(`${where}: bad metric name '${name}'`);
      let f = families.get(name);
      if (!f) {
        f = { type: null, help: null, samples: [] };
        families.set(name, f);
      } else if (current !== f) {
        throw new Error(`${where}: family ${name} declared again after other families`);
      }
      if (kind === 'TYPE') {
        if (!TYPES.has(rest) || f.type) throw new Error(`${where}: bad or repeated TYPE '${rest}'`);
        if (f.samples.length) throw new Error(`${where}: TYPE after samples of ${name}`);
        f.type = rest;
      } else {
        if (f.help !== null) throw new Error(`${where}: repeated HELP of ${name}`);
        f.help = rest;
      }
      current = f;
      return;
    }
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)( -?\d+)?$/);
    if (!m) throw new Error(`${where}: bad sample '${line}'`);
    const [, name, labelText, value] = m;
    const labels = {};
    if (labelText) {
      const body = labelText.slice(1, -1);
      for (const part of body ? body.split(',') : []) {
        const lm = part.match(LABEL);
        if (!lm || lm[1] in labels) throw new Error(`${where}: bad label '${part}'`);
        labels[lm[1]] = lm[2];
      }
    }
    let family = name;
    if (!families.has(family)) family = name.replace(/_(bucket|sum|count)$/, '');
    const f = families.get(family);
    if (!f || f !== current) throw new Error(`${where}: sample ${name} outside its family's block`);
    if (f.type === 'histogram' && family === name) throw new Error(`${where}: bare histogram sample ${name}`);
    if (f.type !== 'histogram' && f.type !== 'summary' && family !== name) throw new Error(`${where}: ${name} in a ${f.type}`);
    f.samples.push({ name, labels, value: parseValue(value, where) });
  });
  for (const [name, f] of families) {
    if (!f.type || !f.samples.length) throw new Error(`${name}: no TYPE or no sample`);
    if (f.type !== 'histogram') continue;
    const buckets = f.samples.filter((s) => s.name === `${name}_bucket`);
    const count = f.samples.find((s) => s.name === `${name}_count`);
    const sum = f.samples.find((s) => s.name === `${name}_sum`);
    if (!count || !sum || !buckets.length) throw new Error(`${name}: histogram without buckets, _sum or _count`);
    let le = -Infinity, n = 0;
    for (const b of buckets) {
      const bound = parseValue(b.labels.le ?? 'x', `${name} le`);
      if (!(bound > le) || b.value < n) throw new Error(`${name}: buckets not increasing or not cumulative`);
      le = bound;
      n = b.value;
    }
    if (le !== Infinity || n !== count.value) throw new Error(`${name}: the +Inf bucket is not _count`);
  }
  return families;
}

const value = (fams, name) => fams.get(name)?.samples[0]?.value;
const histCount = (fams, name) => fams.get(name)?.samples.find((s) => s.name === `${name}_count`)?.value;

async function scrape(url, key) {
  const r = await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${key}` } });
  return parsePrometheus(await r.text());
}

// ---- the launch line and the openai client ----

// The demo model (its folder named demo, the id the clients ask for) with the tools template as
// its own chat template, as a tool-calling checkpoint ships it.
function toolsModel(dir) {
  const model = path.join(dir, 'demo');
  cpSync(MODEL, model, { recursive: true });
  const file = path.join(model, 'tokenizer_config.json');
  const config = JSON.parse(readFileSync(file, 'utf8'));
  config.chat_template = readFileSync(path.join(SRC, 'tests/server/templates/tools_think.jinja'), 'utf8');
  writeFileSync(file, JSON.stringify(config));
  return model;
}

const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));
const parsed = (text) => {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
};

async function embeddingsRoute(client) {
  const texts = ['The king said unto the people', 'Once upon a time'];
  const e = await client.embeddings.create({ model: 'demo', input: texts });
  check(e.data.length === 2 && e.data.every((d, i) => d.index === i && d.embedding.length === 384 && Math.abs(norm(d.embedding) - 1) < 1e-5),
    `embeddings: two unit vectors of 384 (${e.data.map((d) => `${d.embedding.length}:${norm(d.embedding)}`)})`);
  const one = await client.embeddings.create({ model: 'demo', input: texts[1], encoding_format: 'float' });
  check(JSON.stringify(one.data[0].embedding) === JSON.stringify(e.data[1].embedding), 'embeddings: a text alone and in a batch give one vector');
}

async function responsesRoute(client) {
  const ask = { model: 'demo', input: 'Tell me about the king.', max_output_tokens: 12, temperature: 0 };
  const r = await client.responses.create(ask);
  const st = await collectResponse(await client.responses.create({ ...ask, stream: true }));
  check(r.output_text.length > 0 && st.text === r.output_text && st.seqOk && st.types.includes('response.output_text.delta') &&
    st.last?.type === `response.${r.status}` &&
    st.last.response.output?.[0]?.content?.[0]?.text === r.output_text,
  `responses: the streamed text is the plain one (${JSON.stringify(st.text)} vs ${JSON.stringify(r.output_text)}, ${st.types.at(-1)})`);

  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city.', parameters: WEATHER }];
  const call = { model: 'demo', input: 'What is the weather in Paris?', tools, max_output_tokens: 120 };
  const forced = await client.responses.create({ ...call, tool_choice: { type: 'function', name: 'get_weather' } });
  const fc = forced.output.find((i) => i.type === 'function_call');
  check(fc?.name === 'get_weather' && validWeather(parsed(fc.arguments)), `responses: the forced call (${JSON.stringify(forced.output)})`);
  const result = await client.responses.create({ model: 'demo', tools, previous_response_id: forced.id, max_output_tokens: 8,
    input: [{ type: 'function_call_output', call_id: fc?.call_id, output: '21 degrees' }] });
  check(result.output.every((i) => i.type === 'message') && result.usage.input_tokens > forced.usage.input_tokens,
    `responses: the result turn is answered (${JSON.stringify(result.output)})`);
  const sc = await collectResponse(await client.responses.create({ ...call, tool_choice: 'required', stream: true }));
  check(sc.types.includes('response.function_call_arguments.delta') && validWeather(parsed(sc.args)) && sc.last?.type === 'response.completed',
    `responses: the call streamed (${sc.args}, ${sc.types.at(-1)})`);
}

async function messagesRoute(url) {
  const anthropic = new Anthropic({ baseURL: url, apiKey: 'none', maxRetries: 0, timeout: 30_000 });
  const ask = { model: 'demo', max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Tell me about the king.' }] };
  const m = await anthropic.messages.create(ask);
  const text = m.content.map((b) => b.text).join('');
  const st = await collectMessage(anthropic.messages.stream(ask));
  check(text.length > 0 && st.text === text && st.types[0] === 'message_start' && st.types.includes('content_block_delta') &&
    st.types.at(-1) === 'message_stop', `messages: the streamed text is the plain one (${JSON.stringify(st.text)} vs ${JSON.stringify(text)})`);

  const tools = [{ name: 'get_weather', description: 'Weather for a city.', input_schema: WEATHER }];
  const call = { model: 'demo', max_tokens: 120, tools, messages: [{ role: 'user', content: 'What is the weather in Paris?' }] };
  const forced = await anthropic.messages.create({ ...call, tool_choice: { type: 'tool', name: 'get_weather' } });
  const use = forced.content.find((b) => b.type === 'tool_use');
  check(forced.stop_reason === 'tool_use' && use?.name === 'get_weather' && validWeather(use.input), `messages: the forced call (${JSON.stringify(forced.content)})`);
  const result = await anthropic.messages.create({ ...call, max_tokens: 8, messages: [...call.messages, { role: 'assistant', content: forced.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use?.id, content: '21 degrees' }] }] });
  check(result.content.every((b) => b.type === 'text') && result.usage.input_tokens > forced.usage.input_tokens,
    `messages: the result turn is answered (${JSON.stringify(result.content)})`);
  const sc = await collectMessage(anthropic.messages.stream({ ...call, tool_choice: { type: 'any' } }));
  check(sc.starts.some((b) => b.type === 'tool_use') && validWeather(parsed(sc.json)) && sc.stop === 'tool_use',
    `messages: the call streamed (${sc.json}, ${sc.stop})`);
}

async function launchPart() {
  const KEY = 'none';
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-launch-'));
  const s = await startServer(['-m', toolsModel(dir), '-c', '4096', '-np', '4', '-ngl', '99', '-fa', 'on', '-b', '2048',
    '-ub', '512', '--cache-type-k', 'f16', '--jinja', '--metrics'], { LLAMA_ARG_EMBEDDINGS: '1' });
  check(/note: -ngl is moot/.test(s.log) && /note: -fa is moot/.test(s.log) && /note: --jinja is moot/.test(s.log),
    'the moot flags are noted');
  check(/context 4096 per sequence x 4 parallel/.test(s.log), `-c and -np are taken (${s.log.trim()})`);
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
  await embeddingsRoute(client);
  await responsesRoute(client);
  await messagesRoute(s.url);

  const m = await client.models.retrieve('demo');
  check(m.id === 'demo' && m.object === 'model', 'models.retrieve gives the model');
  try {
    await client.models.retrieve('no-such-model');
    check(false, 'models.retrieve of another id fails');
  } catch (e) {
    check(e.status === 404 && e.error?.message?.includes('no-such-model') && typeof e.error?.type === 'string',
      `models.retrieve of another id: 404 in OpenAI's shape (${e.status} ${JSON.stringify(e.error)})`);
  }
  const health = await fetch(`${s.url}/v1/health`);
  check(health.status === 200 && (await health.json()).status === 'ok', '/v1/health');

  const before = await scrape(s.url, KEY);
  const three = await client.completions.create({ model: 'demo', prompt: LONG, n: 3, max_tokens: 8, temperature: 1, seed: 11, ignore_eos: true });
  check(three.choices.length === 3 && three.choices.map((c) => c.index).join() === '0,1,2', 'n=3 gives choices 0, 1, 2');
  check(three.choices.every((c) => c.text.length > 0) && new Set(three.choices.map((c) => c.text)).size > 1,
    `n=3: each choice has text of its own (${JSON.stringify(three.choices.map((c) => c.text))})`);
  const n = three.usage.prompt_tokens;
  check(three.usage.completion_tokens === 24 && n > 2 * BLOCK, `n=3 usage (${JSON.stringify(three.usage)})`);
  const after = await scrape(s.url, KEY);
  const shared = value(after, 'mlxcel_prompt_tokens_cached_total') - value(before, 'mlxcel_prompt_tokens_cached_total');
  check(shared === 2 * BLOCK * Math.floor((n - 1) / BLOCK),
    `n=3 prefills the prompt once: the two others adopt all its full blocks (${shared} of ${n} tokens cached)`);

  const echo = await client.completions.create({ model: 'demo', prompt: 'The king said', echo: true, max_tokens: 4, temperature: 0 });
  const plain = await client.completions.create({ model: 'demo', prompt: 'The king said', max_tokens: 4, temperature: 0 });
  check(echo.choices[0].text === 'The king said' + plain.choices[0].text, `echo puts the prompt first (${JSON.stringify(echo.choices[0].text)})`);

  const arr = await client.completions.create({ model: 'demo', prompt: ['The king', 'A man went'], n: 2, max_tokens: 3, temperature: 0 });
  check(arr.choices.length === 4 && arr.choices.map((c) => c.index).join() === '0,1,2,3', 'two prompts times n=2: four choices');
  const one = await client.completions.create({ model: 'demo', prompt: 'A man went', max_tokens: 3, temperature: 0 });
  check(arr.choices[2].text === one.choices[0].text, 'choice 2 answers the second prompt');
  const ids = await client.completions.create({ model: 'demo', prompt: [[1, 450, 9939], [1, 319, 767]], max_tokens: 3, temperature: 0 });
  check(ids.choices.length === 2, 'a prompt array of token lists');
  for (const [what, body] of [['a mixed prompt array', { prompt: ['a', [1, 2]] }], ['suffix without FIM tokens', { prompt: 'a', suffix: 'b' }],
    ['best_of below n', { prompt: 'a', n: 2, best_of: 1 }], ['echo with logprobs', { prompt: 'a', echo: true, logprobs: 1 }]]) {
    try {
      await client.completions.create({ model: 'demo', max_tokens: 2, ...body });
      check(false, `${what} is refused`);
    } catch (e) {
      check(e.status === 400 && e.error?.message?.length > 0, `${what} is refused with a 400 (${e.status})`);
    }
  }
  const best = await client.completions.create({ model: 'demo', prompt: 'The king', n: 1, best_of: 3, max_tokens: 4, temperature: 1, ignore_eos: true });
  check(best.choices.length === 1 && best.usage.completion_tokens === 12, 'best_of=3 answers one choice of three generated');

  // the histograms move under load
  const base = await scrape(s.url, KEY);
  const done = await Promise.all(Array.from({ length: 8 }, (_, i) =>
    client.completions.create({ model: 'demo', prompt: `Load ${i}: the king`, max_tokens: 6, temperature: 0.5 })));
  const predicted = done.reduce((n, r) => n + r.usage.completion_tokens, 0);
  const load = await scrape(s.url, KEY);
  for (const name of ['mlxcel:time_to_first_token_seconds', 'mlxcel:request_latency_seconds'])
    check(histCount(load, name) - histCount(base, name) === 8, `${name} counts the 8 requests`);
  check(histCount(load, 'mlxcel:inter_token_latency_seconds') - histCount(base, 'mlxcel:inter_token_latency_seconds') === predicted - 8,
    'mlxcel:inter_token_latency_seconds counts the gaps between tokens');
  check(value(load, 'llamacpp:tokens_predicted_total') - value(base, 'llamacpp:tokens_predicted_total') === predicted,
    'llamacpp:tokens_predicted_total counts the generated tokens');
  check(value(load, 'llamacpp:prompt_tokens_total') > value(base, 'llamacpp:prompt_tokens_total'), 'llamacpp:prompt_tokens_total');
  for (const name of ['llamacpp:requests_processing', 'llamacpp:requests_deferred', 'llamacpp:kv_cache_usage_ratio',
    'mlxcel:queue_depth', 'mlxcel:kv_cache_usage_ratio', 'mlxcel:prefix_cache_hit_ratio'])
    check(load.get(name)?.type === 'gauge', `${name} is a gauge`);
  check(value(load, 'mlxcel:prefix_cache_hit_ratio') > 0, 'the prefix-cache hit ratio shows the shared prompt');
  await stopServer(s);
  rmSync(dir, { recursive: true, force: true });
}

// ---- keys, seed, request log, CORS, props, slots ----

async function operationsPart() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-keys-'));
  const keyFile = path.join(dir, 'keys');
  writeFileSync(keyFile, 'from-file-1\r\n\nfrom-file-2\n');
  try {
    const s = await startServer(['-m', MODEL, '-c', '512', '--api-key', 'k1,k2', '--api-key-file', keyFile, '-s', '7',
      '--log-format', 'json', '--props', '--cors', 'http://app.example']);
    const call = (key, header = 'Authorization') =>
      fetch(`${s.url}/v1/models`, { headers: { [header]: header === 'Authorization' ? `Bearer ${key}` : key } });
    check((await call('k2')).status === 200, '--api-key a,b: the second key');
    check((await call('from-file-2', 'x-api-key')).status === 200, '--api-key-file: a key, given as x-api-key');
    check((await call('k1,k2')).status === 401, 'the comma list is not a key');
    check((await call('nope', 'x-api-key')).status === 401, 'a wrong x-api-key');

    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'k1', maxRetries: 0 });
    const req = { model: 'demo', prompt: 'The king', max_tokens: 12, temperature: 1 };
    const [a, b] = [await client.completions.create(req), await client.completions.create(req)];
    check(a.choices[0].text === b.choices[0].text, '--seed: two unseeded requests give the same text');

    const pre = await fetch(`${s.url}/v1/completions`, { method: 'OPTIONS', headers: { Origin: 'http://app.example',
      'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type, x-stainless-os, x-api-key' } });
    check(pre.status === 204 && pre.headers.get('access-control-allow-headers') === 'content-type, x-stainless-os, x-api-key' &&
      pre.headers.get('access-control-allow-origin') === 'http://app.example', 'CORS preflight reflects the requested headers');

    const auth = { 'Content-Type': 'application/json', Authorization: 'Bearer k1' };
    let r = await fetch(`${s.url}/props`, { method: 'POST', headers: auth,
      body: JSON.stringify({ default_generation_settings: { params: { temperature: 0.25, top_k: 5 } } }) });
    check(r.status === 200, 'POST /props changes the defaults');
    const props = await (await fetch(`${s.url}/props`, { headers: auth })).json();
    check(Math.abs(props.default_generation_settings.params.temperature - 0.25) < 1e-6 &&
      props.default_generation_settings.params.top_k === 5 && props.default_generation_settings.params.seed === 7,
      'GET /props shows the changed defaults and the seed');
    r = await fetch(`${s.url}/props`, { method: 'POST', headers: auth, body: JSON.stringify({ total_slots: 9 }) });
    check(r.status === 400, 'POST /props refuses what it cannot change');

    await client.completions.create({ ...req, prompt: LONG });
    r = await fetch(`${s.url}/slots/0?action=erase`, { method: 'POST', headers: auth });
    const erased = await r.json();
    check(r.status === 200 && erased.id_slot === 0 && erased.n_erased >= 2 * BLOCK, `slot erase empties the prefix cache (${JSON.stringify(erased)})`);
    const again = await client.completions.create({ ...req, prompt: LONG });
    check(again.usage.prompt_tokens_details.cached_tokens === 0, 'after the erase nothing is adopted');
    r = await fetch(`${s.url}/slots/0?action=save`, { method: 'POST', headers: auth });
    check(r.status === 400, 'a slot action not implemented is refused');

    await stopServer(s);
    const lines = s.log.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    const gen = lines.find((l) => l.route === '/v1/completions' && l.status === 200);
    check(gen && gen.method === 'POST' && gen.tokens_in === 3 && gen.tokens_out === 12 && gen.ttft_ms > 0 &&
      gen.total_ms >= gen.ttft_ms, `a JSON log line per request (${JSON.stringify(gen)})`);
    check(lines.some((l) => l.route === '/v1/models' && l.status === 401), 'refused requests are logged too');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---- stop_token_ids, min_tokens and /completion's n_probs, on greedy output ----

async function stopsPart() {
  const s = await startServer(['-m', MODEL, '-c', '256']);
  const post = async (route, body) =>
    (await fetch(`${s.url}${route}`, { method: 'POST', body: JSON.stringify(body) })).json();
  const base = { prompt: 'The king', temperature: 0 };
  const probs = await post('/completion', { ...base, n_predict: 6, n_probs: 3 });
  const cp = probs.completion_probabilities ?? [];
  check(cp.length === 6 && cp.every((p) => Number.isInteger(p.id) && p.top_logprobs.length === 3 &&
    p.top_logprobs[0].logprob >= p.top_logprobs[2].logprob), 'n_probs: each token with its 3 most likely');
  const ids = cp.map((p) => p.id);
  const stopped = await post('/v1/completions', { ...base, max_tokens: 6, stop_token_ids: [ids[3]] });
  check(stopped.choices?.[0]?.finish_reason === 'stop' && stopped.usage.completion_tokens === 4 &&
    stopped.choices[0].text === cp.slice(0, 3).map((p) => p.token).join(''),
    `stop_token_ids ends at the id, which is not shown (${JSON.stringify(stopped.choices?.[0])})`);
  const held = await post('/v1/completions', { ...base, max_tokens: 6, stop_token_ids: [ids[0]], min_tokens: 2 });
  const banned = await post('/v1/completions', { ...base, max_tokens: 1, logprobs: 1, stop_token_ids: [ids[0]], min_tokens: 1 });
  check(held.usage?.completion_tokens >= 2, `min_tokens: no end before 2 tokens (${JSON.stringify(held.usage)})`);
  check(banned.choices?.[0]?.logprobs?.tokens?.[0] !== undefined && banned.choices[0].logprobs.tokens[0] !== cp[0].token,
    'min_tokens bans the stop id while it holds');
  await stopServer(s);
}

// ---- suffix: fill-in-the-middle on a model whose tokenizer has FIM tokens ----

// The demo model with three rare tokens renamed to Qwen's FIM tokens (special, added).
function fimModel(dir) {
  const model = path.join(dir, 'fim');
  cpSync(MODEL, model, { recursive: true });
  const file = path.join(model, 'tokenizer.json');
  const t = JSON.parse(readFileSync(file, 'utf8'));
  const byId = new Map(Object.entries(t.model.vocab).map(([k, id]) => [id, k]));
  ['<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>'].forEach((name, i) => {
    const id = 31997 + i;
    delete t.model.vocab[byId.get(id)];
    t.model.vocab[name] = id;
    t.added_tokens.push({ id, content: name, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  });
  writeFileSync(file, JSON.stringify(t));
  return model;
}

async function fimPart() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-fim-'));
  try {
    const s = await startServer(['-m', fimModel(dir), '-c', '256']);
    const post = (route, body) => fetch(`${s.url}${route}`, { method: 'POST', body: JSON.stringify(body) });
    const count = async (text) => (await (await post('/tokenize', { content: text })).json()).tokens.length;
    const r = await post('/v1/completions', { prompt: 'The king', suffix: ' and the queen', max_tokens: 4, temperature: 0 });
    const j = await r.json();
    const want = 4 + (await count('The king')) + (await count(' and the queen'));
    check(r.status === 200 && j.usage.prompt_tokens === want && j.choices[0].text.length > 0,
      `suffix: BOS, PRE, prompt, SUF, suffix, MID (${r.status}, ${j.usage?.prompt_tokens} tokens, want ${want})`);
    await stopServer(s);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---- flags that must not start the server ----

async function flagsPart() {
  const cases = [
    [['--paralel', '2'], {}, /did you mean '--parallel'/, 'a misspelt flag gets the closest spelling'],
    [['--ubatch-sise', '64'], {}, /did you mean '--ubatch-size'/, 'a misspelt llama-server flag too'],
    [['-ctk', 'q8_0'], {}, /-ctk q8_0: the KV cache holds f16, bf16 or f32/, 'a KV dtype we do not have'],
    [['-ctk', 'f16', '-ctv', 'bf16'], {}, /K and V share one dtype/, 'K and V in two dtypes'],
    [['--ctx-shift'], {}, /--ctx-shift is not supported/, '--ctx-shift is refused with its reason'],
    [['--chat-template', 'gemma'], {}, /built-in template 'gemma' has no equivalent/, 'a built-in template name we cannot map'],
    [[], { LLAMA_ARG_BATCH: 'lots' }, /LLAMA_ARG_BATCH=lots/, 'a bad LLAMA_ARG_BATCH names the variable'],
    [[], { LLAMA_ARG_ENDPOINT_SLOTS: 'maybe' }, /LLAMA_ARG_ENDPOINT_SLOTS=maybe/, 'a bad boolean variable names it'],
    [['--log-format', 'xml'], {}, /--log-format wants text or json/, 'a bad --log-format'],
  ];
  for (const [args, env, re, what] of cases) {
    const r = await h.runToExit(['-m', MODEL, '-c', '256', ...args], env);
    check(r.code === 2 && re.test(r.log), `${what}: exit 2 (${r.code}: ${r.log.trim()})`);
  }
  // the command line wins over the environment; a known variable takes effect
  const s = await startServer(['-m', MODEL, '-c', '256', '-np', '2', '--chat-template', 'chatml'],
    { LLAMA_ARG_N_PARALLEL: '3', LLAMA_ARG_ENDPOINT_SLOTS: '0', LLAMA_ARG_UBATCH: '64' });
  check(/x 2 parallel/.test(s.log), '-np on the command line wins over LLAMA_ARG_N_PARALLEL');
  check((await fetch(`${s.url}/slots`)).status === 501, 'LLAMA_ARG_ENDPOINT_SLOTS=0 turns /slots off');
  const t = await (await fetch(`${s.url}/apply-template`, { method: 'POST',
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }) })).json();
  check(t.prompt === '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n', `--chat-template chatml (${JSON.stringify(t.prompt)})`);
  await stopServer(s);
}

try {
  await launchPart();
  await operationsPart();
  await stopsPart();
  await fimPart();
  await flagsPart();
} catch (e) {
  fail(e);
}
finish();
