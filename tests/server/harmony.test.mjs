// GPT-OSS Harmony answers through the official openai client, on the demo model with a template
// in the Harmony layout (tests/engine/templates/harmony.jinja), from which the server must pick
// the harmony parser itself. The demo model follows no instructions, so a `grammar` field makes
// it spell the Harmony markers out; the splitter reads the text, so they count as GPT-OSS's
// special tokens would. Checked: the tools and reasoning_effort rendered, the analysis channel
// as reasoning_content and the final one as content (whole and streamed), calls as tool_calls
// with finish_reason tool_calls (two of them streamed with their index and id),
// --reasoning-format none, and a forced call refused.
import { existsSync } from 'node:fs';
import path from 'node:path';

import { harness } from '../node/harness.mjs';

const SRC = process.env.MLXCEL_SOURCE_DIR ?? '.';
const BIN = process.env.MLXCEL_BIN_DIR ?? 'build/bin';
const MODEL = path.join(SRC, 'models/demo');
const TEMPLATE = path.join(SRC, 'tests/engine/templates/harmony.jinja');
const NODE_MODULES = path.join(SRC, 'tests/node/node_modules');

if (!existsSync(path.join(NODE_MODULES, 'openai'))) {
  console.log('tests/node/node_modules has no openai package: run `npm ci` in tests/node (tools/install-deps.sh does)');
  process.exit(1);
}
const { default: OpenAI } = await import(path.join(NODE_MODULES, 'openai/index.mjs'));

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'harmony server test', timeoutMs: 110_000 });

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

const post = (url, route, body) =>
  fetch(url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });

async function collect(stream) {
  const out = { content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    out.content += c.delta?.content ?? '';
    out.reasoning += c.delta?.reasoning_content ?? '';
    for (const t of c.delta?.tool_calls ?? []) {
      const call = (out.calls[t.index] ??= { id: null, name: '', arguments: '' });
      if (t.id) call.id = t.id;
      call.name += t.function?.name ?? '';
      call.arguments += t.function?.arguments ?? '';
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

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
  const s = await collect(await client.chat.completions.create({ ...ask, stream: true }));
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
  const s = await collect(await client.chat.completions.create({ ...ask, stream: true }));
  check(s.finish === 'tool_calls' && s.calls.length === 2 && s.calls[0]?.name === 'get_weather' &&
    s.calls[1]?.name === 'ping' && s.calls[0]?.arguments === r.message.tool_calls?.[0]?.function.arguments,
    `streamed calls by index: ${JSON.stringify(s)}`);
  check(s.calls.every((c) => /^call_\w+$/.test(c?.id ?? '')) && s.calls[0]?.id !== s.calls[1]?.id,
    `streamed call ids: ${JSON.stringify(s.calls)}`);
  check(s.content === '' && !s.reasoning.includes('<|'), `no marker streamed: ${JSON.stringify(s)}`);
  const forced = await post(client.baseURL.replace(/\/v1$/, ''), '/v1/chat/completions',
    { messages: USER, tools: TOOLS, tool_choice: 'required', max_tokens: 20 });
  const text = await forced.text();
  check(forced.status === 400 && text.includes('harmony'), `tool_choice required: ${forced.status} ${text}`);
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
}

await main();
finish('harmony server test: ');
