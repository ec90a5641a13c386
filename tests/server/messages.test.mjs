// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official
// @anthropic-ai/sdk package, on the demo model with the small Hermes-style template of the tools
// test (tests/server/templates/tools_think.jinja). The demo model follows no instructions, so
// what it must write is forced honestly: a tool call by tool_choice (the server's grammar), the
// end of its thinking by the thinking budget, a JSON answer by output_config.format. The
// answers are checked against the OpenAI chat route on the same conversation at temperature 0,
// and the token counts against @huggingface/tokenizers on the prompt the chat template renders.
import { readFileSync } from 'node:fs';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { collectMessage } from '../node/streams.mjs';
import { WEATHER } from '../node/weather_tool.mjs';
import { SRC, BIN, MODEL, load, post } from '../node/setup.mjs';

const TEMPLATE = path.join(SRC, 'tests/server/templates/tools_think.jinja');

const { default: Anthropic } = await load('@anthropic-ai/sdk', 'index.mjs');
const { Tokenizer } = await load('@huggingface/tokenizers', 'dist/tokenizers.mjs');
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'messages server test', timeoutMs: 110_000 });

const tokenizer = new Tokenizer(JSON.parse(readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8')),
  JSON.parse(readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8')));

const validWeather = new Ajv2020({ strict: false }).compile(WEATHER);
const TOOLS = [{ name: 'get_weather', description: 'Weather for a city.', input_schema: WEATHER }];
// the same tools as OpenAI's API spells them
const OPENAI_TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city.', parameters: WEATHER } }];
const SYSTEM = 'You are a scribe of the king.';
const USER = [{ role: 'user', content: 'Tell me about the king.' }];
// a prompt after which the demo model, thinking, writes more than a stop
const ASK_WEATHER = [{ role: 'user', content: 'What is the weather in Paris?' }];

const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// Tokens of the prompt the chat template renders for OpenAI-shaped messages, by the reference
// tokenizer (the template writes its own special tokens: none are added).
async function referenceCount(url, body) {
  const prompt = (await (await post(url, '/apply-template', body)).json()).prompt;
  return { prompt, n: tokenizer.encode(prompt, { add_special_tokens: false }).ids.length };
}

async function plain(url, client) {
  const ask = { model: 'demo', max_tokens: 24, temperature: 0, system: SYSTEM, messages: USER };
  const m = await client.messages.create(ask);
  check(m.type === 'message' && m.role === 'assistant' && /^msg_\w+$/.test(m.id) && typeof m.model === 'string',
    `message envelope: ${JSON.stringify(m)}`);
  check(m.content.length === 1 && m.content[0].type === 'text' && m.content[0].text.length > 0, `one text block: ${JSON.stringify(m.content)}`);
  check(['max_tokens', 'end_turn'].includes(m.stop_reason) && m.stop_sequence === null, `stop_reason ${m.stop_reason}`);
  check(m.stop_reason !== 'max_tokens' || m.usage.output_tokens === 24, `max_tokens: usage ${JSON.stringify(m.usage)}`);

  // the same conversation through the OpenAI chat route: the same greedy answer and prompt
  const chat = await (await post(url, '/v1/chat/completions', { messages: [{ role: 'system', content: SYSTEM }, ...USER],
    max_tokens: 24, temperature: 0 })).json();
  check(chat.choices?.[0]?.message?.content === m.content[0].text, `same answer as chat: ${JSON.stringify(chat)} vs ${m.content[0].text}`);
  check(chat.usage?.prompt_tokens === m.usage.input_tokens, `same prompt as chat: ${chat.usage?.prompt_tokens} vs ${m.usage.input_tokens}`);

  // count_tokens: the tokenizer's count of the rendered prompt, and what the answer used
  const ref = await referenceCount(url, { messages: [{ role: 'system', content: SYSTEM }, ...USER] });
  const counted = await client.messages.countTokens({ model: 'demo', system: SYSTEM, messages: USER });
  check(counted.input_tokens === ref.n && counted.input_tokens === m.usage.input_tokens,
    `count_tokens ${counted.input_tokens}, tokenizer ${ref.n}, usage ${m.usage.input_tokens}`);
  const blocks = await client.messages.countTokens({ model: 'demo', system: [{ type: 'text', text: SYSTEM }],
    messages: [{ role: 'user', content: [{ type: 'text', text: USER[0].content }] }] });
  check(blocks.input_tokens === ref.n, `system and content as text blocks: ${blocks.input_tokens} vs ${ref.n}`);

  // streamed: the text deltas are the greedy answer, in Anthropic's event order
  const s = await collectMessage(client.messages.stream(ask));
  check(s.text === m.content[0].text && textOf(s.final) === m.content[0].text, `streamed text: ${JSON.stringify(s.text)} vs ${JSON.stringify(m.content[0].text)}`);
  const order = ['message_start', 'content_block_start', ...s.types.slice(2, -3).map(() => 'content_block_delta'),
    'content_block_stop', 'message_delta', 'message_stop'];
  check(JSON.stringify(s.types.filter((t) => t !== 'ping')) === JSON.stringify(order) && s.types.length > 6, `event order: ${s.types.join(' ')}`);
  check(s.stop === m.stop_reason && s.final.stop_reason === m.stop_reason && s.final.usage.output_tokens === m.usage.output_tokens &&
    s.final.usage.input_tokens === m.usage.input_tokens, `streamed stop and usage: ${JSON.stringify(s.final)}`);

  // a stop sequence taken from the answer ends it there
  const words = m.content[0].text.split(' ').filter((w) => /^[A-Za-z]{3,}$/.test(w));
  const word = words[1] ?? words[0];
  const cut = await client.messages.create({ ...ask, stop_sequences: ['zzzq', word] });
  check(cut.stop_reason === 'stop_sequence' && cut.stop_sequence === word &&
    m.content[0].text.startsWith(cut.content.map((b) => b.text).join('') + word),
    `stop_sequences [${word}]: ${JSON.stringify(cut)}`);
}

async function toolRound(url, client) {
  const ask = { model: 'demo', max_tokens: 120, tools: TOOLS, messages: ASK_WEATHER };
  const r = await client.messages.create({ ...ask, tool_choice: { type: 'tool', name: 'get_weather' } });
  const use = r.content.find((b) => b.type === 'tool_use');
  check(r.stop_reason === 'tool_use' && r.content.length === 1 && use, `forced tool: ${JSON.stringify(r)}`);
  check(/^toolu_\w+$/.test(use?.id ?? '') && use?.name === 'get_weather' && validWeather(use?.input), `tool_use block: ${JSON.stringify(use)}`);

  // streamed, with any tool: the call arrives as a tool_use block and its input as JSON deltas
  const s = await collectMessage(client.messages.stream({ ...ask, tool_choice: { type: 'any' } }));
  const fin = s.final.content.find((b) => b.type === 'tool_use');
  check(s.starts.some((b) => b.type === 'tool_use' && b.name === 'get_weather' && /^toolu_/.test(b.id)) && s.stop === 'tool_use',
    `streamed tool_use start: ${JSON.stringify(s.starts)} ${s.stop}`);
  check(validWeather(JSON.parse(s.json || 'null')) && JSON.stringify(fin?.input) === s.json, `streamed input: ${s.json} ${JSON.stringify(fin)}`);

  // the result turn: the SDK's own assistant content and a tool_result, rendered as the chat
  // template renders the same history in OpenAI's shape
  const history = [...ask.messages, { role: 'assistant', content: r.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use?.id, content: '21 degrees' }] }];
  const after = await client.messages.create({ ...ask, max_tokens: 8, messages: history });
  check(after.content.every((b) => b.type === 'text') && after.usage.input_tokens > r.usage.input_tokens &&
    ['end_turn', 'max_tokens'].includes(after.stop_reason), `result turn answered: ${JSON.stringify(after)}`);
  const openai = [...ask.messages, { role: 'assistant', content: '', tool_calls: [{ id: use?.id, type: 'function',
    function: { name: 'get_weather', arguments: JSON.stringify(use?.input) } }] }, { role: 'tool', tool_call_id: use?.id, content: '21 degrees' }];
  const ref = await referenceCount(url, { messages: openai, tools: OPENAI_TOOLS });
  check(ref.prompt.includes(`<|tool|> ${use?.id}\n21 degrees`) && ref.prompt.includes('"name": "get_weather", "arguments": {"city"'),
    `the OpenAI history renders the call and its result: ${ref.prompt}`);
  const counted = await client.messages.countTokens({ model: 'demo', tools: TOOLS, messages: history });
  check(counted.input_tokens === ref.n && after.usage.input_tokens === ref.n,
    `tool history counted: ${counted.input_tokens}, tokenizer ${ref.n}, usage ${after.usage.input_tokens}`);

  // an error result is said so; tool_choice none renders no tools
  const failed = [...history.slice(0, 2), { role: 'user', content: [{ type: 'tool_result', tool_use_id: use?.id, content: 'no network', is_error: true }] }];
  const errRef = await referenceCount(url, { messages: [...openai.slice(0, 2), { role: 'tool', tool_call_id: use?.id, content: 'Error:\nno network' }], tools: OPENAI_TOOLS });
  check((await client.messages.countTokens({ model: 'demo', tools: TOOLS, messages: failed })).input_tokens === errRef.n, 'is_error renders as Error:');
  const none = await client.messages.countTokens({ model: 'demo', tools: TOOLS, tool_choice: { type: 'none' }, messages: ask.messages });
  const bare = await client.messages.countTokens({ model: 'demo', messages: ask.messages });
  check(none.input_tokens === bare.input_tokens, `tool_choice none: ${none.input_tokens} vs ${bare.input_tokens}`);
}

async function thinking(client) {
  // the template opens <think> when thinking is on; the demo model never closes it, the budget does
  const ask = { model: 'demo', max_tokens: 30, temperature: 0, thinking: { type: 'enabled', budget_tokens: 5 }, messages: ASK_WEATHER };
  const m = await client.messages.create(ask);
  check(m.content[0]?.type === 'thinking' && m.content[0].thinking.trim().length > 0 && typeof m.content[0].signature === 'string' &&
    m.content[1]?.type === 'text' && m.content[1].text.length > 0 && !m.content[1].text.includes('think>'),
    `thinking block then text: ${JSON.stringify(m.content)}`);
  const s = await collectMessage(client.messages.stream(ask));
  check(s.thinking === m.content[0]?.thinking && s.text === m.content[1]?.text &&
    JSON.stringify(s.final.content) === JSON.stringify(m.content), `thinking streamed: ${JSON.stringify(s.final.content)}`);
  check(s.starts[0]?.type === 'thinking' && s.starts[1]?.type === 'text', `block starts: ${JSON.stringify(s.starts)}`);
  const off = await client.messages.create({ ...ask, thinking: { type: 'disabled' } });
  check(off.content.every((b) => b.type === 'text'), `thinking disabled: ${JSON.stringify(off.content)}`);
}

// output_config.format is enforced by the grammar; metadata and cache_control are taken
async function accepted(client) {
  const r = await client.messages.create({ model: 'demo', max_tokens: 60, messages: ASK_WEATHER, metadata: { user_id: 'u1' },
    system: [{ type: 'text', text: SYSTEM, cache_control: { type: 'ephemeral', ttl: '1h' } }],
    output_config: { format: { type: 'json_schema', schema: WEATHER } } });
  let parsed;
  try {
    parsed = JSON.parse(textOf(r));
  } catch {
    parsed = undefined;
  }
  check(validWeather(parsed) && r.stop_reason === 'end_turn', `output_config.format: ${JSON.stringify(r)}`);
  const serial = await client.messages.countTokens({ model: 'demo', tools: TOOLS, messages: ASK_WEATHER,
    tool_choice: { type: 'any', disable_parallel_tool_use: true } });
  check(serial.input_tokens > 0, `disable_parallel_tool_use taken: ${JSON.stringify(serial)}`);
}

async function refusals(url, client) {
  const ask = { model: 'demo', max_tokens: 4, messages: USER };
  async function bad(extra, needle, what) {
    try {
      await client.messages.create({ ...ask, ...extra });
      check(false, `${what}: accepted`);
    } catch (e) {
      check(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.type === 'error' &&
        e.error?.error?.type === 'invalid_request_error' && e.error.error.message.includes(needle),
        `${what}: ${e.status} ${JSON.stringify(e.error)}`);
    }
  }
  await bad({ service_tier: 'auto' }, "'service_tier'", 'an unimplemented field');
  await bad({ max_tokens: undefined }, "'max_tokens'", 'max_tokens missing');
  await bad({ temperature: 1.5 }, "'temperature'", 'temperature past 1');
  await bad({ messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] },
    "'messages[0].content[0]'", 'an image block');
  await bad({ messages: [{ role: 'user', content: [{ type: 'text', text: 'x', citations: [{ type: 'char_location' }] }] }] },
    "'messages[0].content[0].citations'", 'citations');
  await bad({ tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, "'tools[0]'", 'a server tool');
  await bad({ tools: [{ ...TOOLS[0], input_examples: [] }] }, "'tools[0].input_examples'", 'an unknown tool field');
  await bad({ tools: TOOLS, tool_choice: { type: 'sometimes' } }, "'tool_choice.type'", 'a bad tool_choice');
  await bad({ thinking: { type: 'enabled', budget_tokens: 10 } }, "'thinking.budget_tokens'", 'a budget past max_tokens');
  await bad({ messages: [{ role: 'system', content: 'x' }] }, "'messages[0].role'", 'a system role in messages');
  const raw = await post(url, '/v1/messages', { ...ask, top_k: -1 });
  const body = await raw.json();
  check(raw.status === 400 && body.type === 'error' && body.error?.message.includes("'top_k'"), `top_k -1: ${JSON.stringify(body)}`);
  const missing = await fetch(`${url}/v1/messages`);
  const nf = await missing.json();
  check(missing.status === 404 && nf.type === 'error' && nf.error?.type === 'not_found_error', `GET /v1/messages: ${JSON.stringify(nf)}`);
}

async function auth() {
  const s = await startServer(['-m', MODEL, '-c', '256', '--api-key', 'sekrit']);
  try {
    const ok = new Anthropic({ baseURL: s.url, apiKey: 'sekrit', maxRetries: 0 });
    const m = await ok.messages.create({ model: 'demo', max_tokens: 4, messages: USER });
    check(m.type === 'message' && m.usage.output_tokens > 0, `the right x-api-key: ${JSON.stringify(m)}`);
    const counted = await ok.messages.countTokens({ model: 'demo', messages: USER });
    check(counted.input_tokens === m.usage.input_tokens, `count_tokens with the key: ${JSON.stringify(counted)}`);
    for (const key of ['wrong', 'sekrit2']) {
      try {
        await new Anthropic({ baseURL: s.url, apiKey: key, maxRetries: 0 }).messages.create({ model: 'demo', max_tokens: 4, messages: USER });
        check(false, `x-api-key ${key} accepted`);
      } catch (e) {
        check(e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error',
          `x-api-key ${key}: ${e.status} ${JSON.stringify(e.error)}`);
      }
    }
    const none = await post(s.url, '/v1/messages/count_tokens', { model: 'demo', messages: USER }, { 'anthropic-version': '2023-06-01' });
    check(none.status === 401 && (await none.json()).type === 'error', `no key: ${none.status}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(s);
}

async function main() {
  const a = await startServer(['-m', MODEL, '-c', '512', '-np', '2', '--chat-template-file', TEMPLATE]);
  const client = new Anthropic({ baseURL: a.url, apiKey: 'none', maxRetries: 0 });
  try {
    await plain(a.url, client);
    await toolRound(a.url, client);
    await thinking(client);
    await accepted(client);
    await refusals(a.url, client);
  } catch (e) {
    fail(e);
  }
  await stopServer(a);
  await auth();
}

await main();
finish('messages server test: ');
