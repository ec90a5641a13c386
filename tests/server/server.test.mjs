// mlxcel-server end to end on the demo model: the openai client (models, chat and completions,
// streamed and not, usage, seeds, 16 concurrent streams with one aborted), the native routes,
// every error status, the LLAMA_ARG_* environment, and after each part the pool shows no
// block still referenced. Each server runs on a free loopback port and is killed at the end;
// a watchdog bounds the whole run.
import { spawn } from 'node:child_process';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { BIN, MODEL, load } from '../node/setup.mjs';

const KEY = 'test-key-123';

const { default: OpenAI } = await load('openai', 'index.mjs');

const { check, fail, own, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'server test', timeoutMs: 100_000 });

async function metrics(url) {
  const r = await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
  const text = await r.text();
  const get = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1]);
  return { referenced: get('mlxcel_kv_blocks_referenced'), cancelled: get('mlxcel_requests_cancelled_total'),
    capacity: get('mlxcel_kv_blocks_capacity'), free: get('mlxcel_kv_blocks_free'), cached: get('mlxcel_kv_blocks_cached') };
}

// Polls until no block is referenced (a cancelled stream frees its blocks within a poll
// period of the server noticing), for at most 5 s.
async function checkNoLeak(url, what) {
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(url);
    if (m.referenced === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  check(m.referenced === 0, `${what}: ${m.referenced} blocks still referenced`);
  check(m.free + m.cached + m.referenced === m.capacity, `${what}: pool accounting adds up`);
}

const post = (url, route, body, headers = {}) =>
  fetch(url + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}`, ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });

async function expectError(res, status, what) {
  check(res.status === status, `${what}: status ${res.status}, expected ${status}`);
  const j = await res.json().catch(() => null);
  check(j && j.error && typeof j.error.message === 'string' && j.error.message.length > 0 &&
        typeof j.error.type === 'string' && j.error.code === status, `${what}: OpenAI error body`);
}

const messages = [{ role: 'user', content: 'Tell me about the sea.' }];

async function openaiPart(url) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'demo', 'models list names the demo model');

  const greedy = { model: 'demo', messages, max_tokens: 16, temperature: 0 };
  const whole = await client.chat.completions.create(greedy);
  const text = whole.choices[0].message.content;
  check(typeof text === 'string' && text.length > 0, 'chat completion has content');
  check(['stop', 'length'].includes(whole.choices[0].finish_reason), 'chat finish_reason');
  check(whole.usage.prompt_tokens > 0 && whole.usage.completion_tokens > 0 &&
        whole.usage.completion_tokens <= 16 &&
        whole.usage.total_tokens === whole.usage.prompt_tokens + whole.usage.completion_tokens, 'chat usage');

  const stream = await client.chat.completions.create({ ...greedy, stream: true, stream_options: { include_usage: true } });
  let streamed = '', usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      streamed += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(streamed === text, `streamed chat equals the whole one: ${JSON.stringify(streamed)} vs ${JSON.stringify(text)}`);
  check(finish === whole.choices[0].finish_reason, 'streamed finish_reason');
  check(usage && usage.completion_tokens === whole.usage.completion_tokens &&
        usage.prompt_tokens === whole.usage.prompt_tokens, 'stream usage chunk');

  const comp = await client.completions.create({ model: 'demo', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
  check(typeof comp.choices[0].text === 'string' && comp.choices[0].text.length > 0, 'completion text');
  check(comp.usage.completion_tokens > 0 && comp.usage.completion_tokens <= 12, 'completion usage');
  check(comp.choices[0].finish_reason === 'length' || comp.choices[0].finish_reason === 'stop', 'completion finish_reason');

  const sampled = (seed) => client.chat.completions.create({ model: 'demo', messages, max_tokens: 24, temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, seed })
    .then((r) => r.choices[0].message.content);
  const [a, b, c] = await Promise.all([sampled(123), sampled(123), sampled(124)]);
  check(a === b, 'the same seed gives the same text');
  check(a !== c, 'another seed gives another text');

  const lp = await client.chat.completions.create({ ...greedy, max_tokens: 4, logprobs: true, top_logprobs: 3 });
  const content = lp.choices[0].logprobs?.content ?? [];
  check(content.length === lp.usage.completion_tokens, 'one logprob entry per token');
  check(content.every((e) => e.logprob <= 0 && e.top_logprobs.length === 3 &&
        e.top_logprobs[0].logprob >= e.logprob - 1e-6), 'greedy token is the most likely');
  const joined = Buffer.concat(content.map((e) => Buffer.from(e.bytes))).toString('utf8');
  check(joined.trimStart() === lp.choices[0].message.content.trimStart(),
        "the entries' bytes join into the message");
  await checkNoLeak(url, 'after the openai calls');

  // 16 concurrent streams; one is aborted after its first chunk and must not hold blocks.
  const ctrl = new AbortController();
  const runs = [];
  for (let i = 0; i < 16; i++) {
    runs.push((async () => {
      const s = await client.chat.completions.create(
        { model: 'demo', messages: [{ role: 'user', content: `Story number ${i}` }], max_tokens: i === 0 ? 200 : 12, temperature: 0, stream: true },
        i === 0 ? { signal: ctrl.signal } : {});
      let n = 0, fin = null;
      try {
        for await (const chunk of s) {
          n++;
          if (i === 0 && n === 2) ctrl.abort();
          fin = chunk.choices[0]?.finish_reason ?? fin;
        }
      } catch (e) {
        if (i !== 0) throw e;
      }
      return i === 0 && ctrl.signal.aborted ? 'aborted' : fin;
    })());
  }
  const results = await Promise.all(runs);
  check(results[0] === 'aborted', `the first stream was aborted (${results[0]})`);
  check(results.slice(1).every((r) => r === 'length' || r === 'stop'), 'the other 15 streams finished');
  await checkNoLeak(url, 'after 16 streams with one aborted');
  check((await metrics(url)).cancelled >= 1, 'the aborted stream was cancelled');
}

async function nativePart(url) {
  let r = await fetch(`${url}/health`);
  check(r.status === 200 && (await r.json()).status === 'ok', '/health without a key');
  r = await post(url, '/tokenize', { content: 'Hello world' });
  const tokens = (await r.json()).tokens;
  check(Array.isArray(tokens) && tokens.length > 0, '/tokenize');
  r = await post(url, '/detokenize', { tokens });
  check((await r.json()).content.trim() === 'Hello world', '/detokenize round trip');
  r = await post(url, '/apply-template', { messages });
  check((await r.json()).prompt.includes('Tell me about the sea.'), '/apply-template');
  r = await fetch(`${url}/slots`, { headers: { Authorization: `Bearer ${KEY}` } });
  check((await r.json()).length === 4, '/slots lists -np slots');
  r = await fetch(`${url}/props`, { headers: { Authorization: `Bearer ${KEY}` } });
  const props = await r.json();
  check(props.total_slots === 4 && props.default_generation_settings.n_ctx === 256, '/props');

  // stop strings: a piece from the middle of the greedy text (likely spanning tokens) ends it
  const base = { prompt: 'Once upon a time', n_predict: 40, temperature: 0 };
  r = await post(url, '/completion', base);
  const full = (await r.json()).content;
  check(full.length > 12, `/completion text (${JSON.stringify(full)})`);
  const stop = full.slice(6, 10);
  r = await post(url, '/completion', { ...base, stop: [stop] });
  const cut = await r.json();
  check(cut.content === full.slice(0, full.indexOf(stop)), `stop string ${JSON.stringify(stop)} cuts the text`);
  check(cut.stop === true && cut.stop_type === 'word' && cut.stopping_word === stop, '/completion reports the stop word');

  // streamed /completion pieces add up to the whole text
  r = await post(url, '/completion', { ...base, stream: true });
  const sse = await r.text();
  const pieces = sse.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
  check(pieces.map((p) => p.content).join('') === full, 'streamed /completion equals the whole');

  await expectError(await post(url, '/v1/chat/completions', { messages }, { Authorization: 'Bearer wrong' }), 401, 'wrong key');
  await expectError(await fetch(`${url}/v1/models`), 401, 'no key');
  await expectError(await fetch(`${url}/v2/nothing`, { headers: { Authorization: `Bearer ${KEY}` } }), 404, 'unknown route');
  await expectError(await post(url, '/v1/chat/completions', '{"messages": ['), 400, 'malformed JSON');
  await expectError(await post(url, '/v1/chat/completions', { messages, temperature: 'hot' }), 400, 'wrong field type');
  await expectError(await post(url, '/v1/chat/completions', { messages: 'hi' }), 400, 'messages not an array');
  await expectError(await post(url, '/v1/completions', { prompt: 'word '.repeat(400) }), 400, 'prompt longer than the context');
  await expectError(await post(url, '/v1/completions', { prompt: 'x'.repeat(70_000) }), 413, 'body over the limit');
  await checkNoLeak(url, 'after the native routes');
}

// One slot and a queue of one (set through the environment): a third request gets 503.
// Messages as the SDKs send them, prefill, and the first generated word's leading space.
async function messagesPart(url) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
  const template = async (body) => {
    const r = await post(url, '/apply-template', body);
    return r.status === 200 ? (await r.json()).prompt : `status ${r.status}`;
  };
  const plain = await template({ messages: [{ role: 'user', content: 'Tell me\nabout the king.' }] });
  const parts = await template({ messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me' }, { type: 'text', text: 'about the king.' }] }] });
  check(parts === plain && plain.endsWith('[/INST]'), `text parts are joined with a newline: ${JSON.stringify(parts)}`);
  const byParts = await client.chat.completions.create({ model: 'demo', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }] }] });
  check(typeof byParts.choices[0].message.content === 'string', 'the openai client sends content parts and gets an answer');
  const toolTurn = [{ role: 'user', content: 'Weather?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'sunny' }];
  const rendered = await template({ messages: toolTurn });
  check(!rendered.startsWith('status') && rendered.includes('sunny'), `null content beside tool_calls renders: ${JSON.stringify(rendered)}`);
  check(await template({ messages: [{ role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'Hi' }] }) ===
        await template({ messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }] }), 'developer is system');
  const image = await post(url, '/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'text', text: 'What is it?' }, { type: 'image_url', image_url: { url: 'data:,' } }] }] });
  check(image.status === 400 && /text only/.test((await image.json()).error.message), 'an image part is refused: this model takes text only');
  await expectError(await post(url, '/v1/chat/completions', { messages: [{ role: 'wizard', content: 'hi' }] }), 400, 'an unknown role');
  await expectError(await post(url, '/v1/chat/completions', { messages, tools: { type: 'function' } }), 400, 'tools that are not an array');
  await expectError(await post(url, '/v1/chat/completions', { messages, grammar: 'root ::= ("a"' }), 400, 'a grammar that does not parse');

  // prefill: a final assistant message is continued
  const prefill = [{ role: 'user', content: 'Tell me a story.' }, { role: 'assistant', content: 'Once upon a time' }];
  const cont = await template({ messages: prefill });
  check(cont.endsWith('[/INST] Once upon a time'), `a final assistant message is continued: ${JSON.stringify(cont)}`);
  const closed = await template({ messages: prefill, add_generation_prompt: true });
  check(closed.endsWith('Once upon a time</s>'), `unless add_generation_prompt is asked for: ${JSON.stringify(closed)}`);
  check(await template({ messages: prefill, continue_final_message: true, add_generation_prompt: true }) === 'status 400', 'both at once is a 400');
  const continued = await client.chat.completions.create({ model: 'demo', messages: prefill, max_tokens: 8, temperature: 0 });
  check(typeof continued.choices[0].message.content === 'string', 'a prefilled chat is answered');

  // the first generated word keeps its leading space, on every route
  const ids = async (text) => (await (await post(url, '/tokenize', { content: text })).json()).tokens;
  const [base, withSaid] = [await ids('The king'), await ids('The king said')];
  const said = withSaid.at(-1);
  check(withSaid.length === base.length + 1, 'one token for " said"');
  const forced = { temperature: 0, logit_bias: { [said]: 100 } };
  const comp = await client.completions.create({ model: 'demo', prompt: 'The king', max_tokens: 2, ...forced });
  check(comp.choices[0].text === ' said said', `completions: ${JSON.stringify(comp.choices[0].text)}`);
  const native = await (await post(url, '/completion', { prompt: 'The king', n_predict: 2, ...forced })).json();
  check(native.content === ' said said', `/completion: ${JSON.stringify(native.content)}`);
  let streamed = '';
  for await (const chunk of await client.completions.create({ model: 'demo', prompt: 'The king', max_tokens: 2, stream: true, ...forced }))
    streamed += chunk.choices[0]?.text ?? '';
  check(streamed === ' said said', `streamed completions: ${JSON.stringify(streamed)}`);
  const chat = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 2, ...forced });
  check(chat.choices[0].message.content === ' said said', `chat: ${JSON.stringify(chat.choices[0].message.content)}`);
  await checkNoLeak(url, 'after the messages part');
}

async function queuePart() {
  const s = await startServer(['-m', MODEL, '-c', '256', '--metrics', '--api-key', KEY],
    { LLAMA_ARG_N_PARALLEL: '1', LLAMA_ARG_MAX_QUEUE: '1', LLAMA_ARG_PORT: '1' });
  const r = await fetch(`${s.url}/props`, { headers: { Authorization: `Bearer ${KEY}` } });
  check((await r.json()).total_slots === 1, 'LLAMA_ARG_N_PARALLEL sets the slots');
  const long = await post(s.url, '/completion', { prompt: 'Once', n_predict: 200, ignore_eos: true, stream: true });
  const reader = long.body.getReader();
  await reader.read();
  const second = post(s.url, '/completion', { prompt: 'Twice', n_predict: 4 });
  await new Promise((res) => setTimeout(res, 100));
  await expectError(await post(s.url, '/completion', { prompt: 'Thrice', n_predict: 4 }), 503, 'queue full');
  await reader.cancel();
  check((await second).status === 200, 'the queued request is served');
  await checkNoLeak(s.url, 'after the queue test');
  check((await stopServer(s)) === 0, 'SIGTERM stops the server cleanly');
}

async function refusePart() {
  const child = own(spawn(path.join(BIN, 'mlxcel-server'), ['-m', MODEL, '--port', '0', '-c', '256', '--kv-cache-budget', '100K'], { stdio: ['ignore', 'ignore', 'pipe'] }));
  let log = '';
  child.stderr.on('data', (d) => (log += d));
  const code = await new Promise((res) => child.on('exit', res));
  check(code === 1 && /error/.test(log) && /\d+.*\d+/.test(log), `a KV budget below one sequence is refused: ${log.trim()}`);
}

try {
  const s = await startServer(['-m', MODEL, '-c', '256', '-np', '4', '--metrics', '--api-key', KEY, '--max-body', '65536']);
  await openaiPart(s.url);
  await nativePart(s.url);
  await messagesPart(s.url);
  await stopServer(s);
  await queuePart();
  await refusePart();
} catch (e) {
  fail(e);
}
finish();
