// Constrained output end to end on the demo model: response_format json_schema through the
// openai client for the schemas under tests/grammar/schemas (every answer must parse and
// validate with ajv, draft 2020-12 with ajv-formats), llama-server's json_schema and grammar
// fields on /v1/completions and /completion, json_object, a streamed answer equal to the whole
// one, and the 400s of bad schemas, bad GBNF and conflicting fields. The demo model writes
// prose, so only the grammar can make these answers valid. A bias towards the tokens that close
// strings, arrays and objects keeps the answers short (they are valid without it, but the
// model would fill the context with string content first).
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { SRC, BIN, MODEL, load } from '../node/setup.mjs';

const SCHEMAS = path.join(SRC, 'tests/grammar/schemas');
const KEY = 'test-key-456';

const { default: OpenAI } = await load('openai', 'index.mjs');
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');
const { default: addFormats } = await load('ajv-formats', 'dist/index.js');

// Sanitizer builds run several times slower (CMake passes the factor).
const TIME_SCALE = Number(process.env.MLXCEL_TEST_TIME_SCALE ?? 1);
const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'grammar server test', timeoutMs: 110_000 * TIME_SCALE });

// Where the demo model loops inside an unbounded part of the document (an email's local part,
// the free keys of a map) it never closes it: valid up to max_tokens, but not a whole document.
const LOOPING = new Set(['01-person.json', '15-map.json', '27-required-not-listed.json']);

const post = (url, route, body) =>
  fetch(url + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });

// Runs fn over items, `width` at a time (the server's slots), in order of the items.
async function pool(items, width, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  }));
  return out;
}

function validator(schema) {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  return ajv.compile(schema);
}

// The answer parses and validates; `what` names the case.
function checkDocument(text, validate, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    check(false, `${what}: not JSON: ${JSON.stringify(text)}`);
    return;
  }
  check(validate(value), `${what}: ${JSON.stringify(validate.errors)}: ${text}`);
}

async function closers(url) {
  // the last token of each text: the '"', ']' and '}' that close strings, arrays and objects,
  // with and without the word-initial space, and '",'
  const bias = {};
  for (const text of ['"', '",', 'a"', 'a]', 'a}']) {
    const ids = (await (await post(url, '/tokenize', { content: text })).json()).tokens;
    bias[ids.at(-1)] = 5;
  }
  return bias;
}

async function schemaPart(url, client, bias) {
  const files = readdirSync(SCHEMAS).filter((f) => f.endsWith('.json') && !LOOPING.has(f)).sort();
  check(files.length >= 20, `at least 20 schemas (${files.length})`);
  const schemas = files.map((f) => JSON.parse(readFileSync(path.join(SCHEMAS, f), 'utf8')));
  const answers = await pool(files, 4, (f, i) => client.chat.completions.create({
    model: 'demo', messages: [{ role: 'user', content: `Write the ${f.slice(3, -5)} as JSON.` }],
    max_tokens: 450, temperature: 0, logit_bias: bias,
    response_format: { type: 'json_schema', json_schema: { name: f.slice(3, -5).replace(/-/g, '_'), schema: schemas[i], strict: true } },
  }));
  for (let i = 0; i < files.length; i++) {
    const a = answers[i].choices[0];
    check(a.finish_reason === 'stop', `${files[i]}: finish_reason ${a.finish_reason}`);
    checkDocument(a.message.content, validator(schemas[i]), `${files[i]} (chat, response_format)`);
  }

  // llama-server's json_schema field, sampled at temperature 1 over the whole vocabulary
  const sampled = files.filter((_, i) => i % 3 === 0);
  const docs = await pool(sampled, 4, (f) => post(url, '/v1/completions', {
    prompt: 'The record:', max_tokens: 450, temperature: 1, top_k: 0, top_p: 1, min_p: 0, seed: 11,
    logit_bias: bias, json_schema: JSON.parse(readFileSync(path.join(SCHEMAS, f), 'utf8')),
  }).then((r) => r.json()));
  for (let i = 0; i < sampled.length; i++) {
    const c = docs[i].choices?.[0];
    check(c?.finish_reason === 'stop', `${sampled[i]} (completions, sampled): ${JSON.stringify(docs[i]).slice(0, 300)}`);
    checkDocument(c?.text ?? '', validator(JSON.parse(readFileSync(path.join(SCHEMAS, sampled[i]), 'utf8'))),
      `${sampled[i]} (completions, json_schema, temperature 1)`);
  }
}

async function formatsPart(url, client, bias) {
  const messages = [{ role: 'user', content: 'Tell me about the sea, as JSON.' }];
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 300, temperature: 1, seed, logit_bias: bias,
      response_format: { type: 'json_object' } });
    let v = null;
    try {
      v = JSON.parse(r.choices[0].message.content);
    } catch {
      v = null;
    }
    check(v !== null && typeof v === 'object' && !Array.isArray(v), `json_object gives an object: ${JSON.stringify(r.choices[0].message.content)}`);
  }

  // the same constrained answer streamed and whole
  const schema = JSON.parse(readFileSync(path.join(SCHEMAS, '26-issue.json'), 'utf8'));
  const body = { model: 'demo', messages, max_tokens: 450, temperature: 0, logit_bias: bias,
    response_format: { type: 'json_schema', json_schema: { name: 'issue', schema } } };
  const whole = (await client.chat.completions.create(body)).choices[0].message.content;
  let streamed = '';
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true }))
    streamed += chunk.choices[0]?.delta?.content ?? '';
  check(streamed === whole, `streamed equals whole: ${JSON.stringify(streamed)} vs ${JSON.stringify(whole)}`);
  checkDocument(streamed, validator(schema), 'streamed issue');

  // GBNF on every route
  const gbnf = 'root ::= ("yes" | "no") ", because " [a-z ]{1,24} "."';
  const shape = /^(yes|no), because [a-z ]{1,24}\.$/;
  const chat = await client.chat.completions.create({ model: 'demo', messages, max_tokens: 60, temperature: 0, grammar: gbnf });
  check(shape.test(chat.choices[0].message.content) && chat.choices[0].finish_reason === 'stop',
    `grammar on chat: ${JSON.stringify(chat.choices[0].message.content)}`);
  const comp = await client.completions.create({ model: 'demo', prompt: 'Is it so?', max_tokens: 60, temperature: 1, seed: 5, grammar: gbnf });
  check(shape.test(comp.choices[0].text), `grammar on completions: ${JSON.stringify(comp.choices[0].text)}`);
  const native = await (await post(url, '/completion', { prompt: 'Is it so?', n_predict: 60, temperature: 0, grammar: gbnf })).json();
  check(shape.test(native.content) && native.stop_type === 'eos', `grammar on /completion: ${JSON.stringify(native)}`);
  const nativeSchema = await (await post(url, '/completion', { prompt: 'Weather:', n_predict: 200, temperature: 0, logit_bias: bias,
    response_format: { type: 'json_schema', json_schema: { schema: JSON.parse(readFileSync(path.join(SCHEMAS, '20-openai-strict-weather.json'), 'utf8')) } } })).json();
  checkDocument(nativeSchema.content ?? '', validator(JSON.parse(readFileSync(path.join(SCHEMAS, '20-openai-strict-weather.json'), 'utf8'))),
    '/completion with response_format');
  // llama-server's "no grammar"
  const none = await post(url, '/completion', { prompt: 'Is it so?', n_predict: 4, grammar: '' });
  check(none.status === 200, `an empty grammar is none: ${none.status}`);
}

async function expect400(url, route, body, pattern, what) {
  const r = await post(url, route, body);
  const j = await r.json().catch(() => null);
  const msg = j?.error?.message ?? '';
  check(r.status === 400 && pattern.test(msg), `${what}: ${r.status} ${JSON.stringify(msg)}`);
}

async function refusalsPart(url) {
  const messages = [{ role: 'user', content: 'JSON?' }];
  const rf = (schema) => ({ messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
  await expect400(url, '/v1/chat/completions', rf({ type: 'string', pattern: '^a+$' }), /'pattern' at #/, 'an unsupported keyword names itself and its pointer');
  await expect400(url, '/v1/chat/completions', rf({ type: 'object', properties: { a: { $ref: '#/$defs/gone' } } }), /#\/properties\/a/, 'a dangling $ref');
  await expect400(url, '/v1/chat/completions', rf({ type: 'array', items: { type: 'strnig' } }), /#\/items/, 'an unknown type');
  await expect400(url, '/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, /schema/, 'json_schema without a schema');
  await expect400(url, '/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {}, strict: 'yes' } } }, /strict/, 'strict not a boolean');
  await expect400(url, '/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {}, extra: 1 } } }, /extra/, 'an unknown json_schema field');
  await expect400(url, '/v1/chat/completions', { messages, response_format: { type: 'xml' } }, /xml/, 'an unknown format type');
  await expect400(url, '/v1/completions', { prompt: 'a', json_schema: { type: 'integer', multipleOf: 3 } }, /multipleOf/, 'json_schema field, unsupported keyword');
  await expect400(url, '/completion', { prompt: 'a', grammar: 'root ::= ("a"' }, /grammar: line 1/, 'GBNF that does not parse');
  await expect400(url, '/completion', { prompt: 'a', grammar: 'start ::= "a"' }, /root/, 'GBNF without root');
  await expect400(url, '/completion', { prompt: 'a', grammar: 7 }, /grammar/, 'grammar not a string');
  await expect400(url, '/v1/chat/completions', { messages, grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, /exclude/, 'two constraints at once');
  await expect400(url, '/v1/completions', { prompt: 'a', grammar: 'root ::= "a"', json_schema: {} }, /exclude/, 'grammar and json_schema at once');
}

try {
  const s = await startServer(['-m', MODEL, '-c', '512', '-np', '4', '--metrics', '--api-key', KEY]);
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 * TIME_SCALE });
  const bias = await closers(s.url);
  const t0 = Date.now();
  await schemaPart(s.url, client, bias);
  await formatsPart(s.url, client, bias);
  await refusalsPart(s.url);
  const m = await (await fetch(`${s.url}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } })).text();
  check(/^mlxcel_kv_blocks_referenced 0$/m.test(m), 'no block still referenced');
  console.log(`constrained requests took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  check((await stopServer(s)) === 0, 'SIGTERM stops the server cleanly');
} catch (e) {
  fail(e);
}
finish();
