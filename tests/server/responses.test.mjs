// OpenAI's Responses API (/v1/responses) through the official openai package's
// client.responses, on the demo model with the small Hermes-style template of the tools test
// (tests/server/templates/tools_think.jinja). The demo model follows no instructions, so what it
// must write is forced honestly: a function call by tool_choice (the server's grammar), a JSON
// answer by text.format, reasoning by reasoning.effort (the template then opens <think>, which
// the demo model never closes). Answers are checked against the chat route on the same
// conversation at temperature 0, streamed against whole, and a conversation continued by
// previous_response_id against the same conversation sent whole.
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { collectResponse } from '../node/streams.mjs';
import { WEATHER } from '../node/weather_tool.mjs';
import { SRC, BIN, MODEL, load, post } from '../node/setup.mjs';

const TEMPLATE = path.join(SRC, 'tests/server/templates/tools_think.jinja');

const { default: OpenAI } = await load('openai', 'index.mjs');
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'responses server test', timeoutMs: 110_000 });

const validWeather = new Ajv2020({ strict: false }).compile(WEATHER);
const TOOLS = [{ type: 'function', name: 'get_weather', description: 'Weather for a city.', parameters: WEATHER }];
// the same tools as the chat API spells them
const CHAT_TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city.', parameters: WEATHER } }];
const INSTRUCTIONS = 'You are a scribe of the king.';
const ASK = 'Tell me about the king.';
const ASK_WEATHER = 'What is the weather in Paris?';

const chat = async (url, body) => (await post(url, '/v1/chat/completions', body)).json();

const messageText = (r) => r.output.filter((i) => i.type === 'message')
  .flatMap((i) => i.content).filter((p) => p.type === 'output_text').map((p) => p.text).join('');

async function plain(url, client) {
  const ask = { model: 'demo', instructions: INSTRUCTIONS, input: ASK, max_output_tokens: 24, temperature: 0 };
  const r = await client.responses.create(ask);
  check(/^resp_\w+$/.test(r.id) && r.object === 'response' && typeof r.created_at === 'number' && r.model === 'demo',
    `response envelope: ${JSON.stringify(r)}`);
  const msg = r.output[0];
  check(r.output.length === 1 && msg?.type === 'message' && msg.role === 'assistant' && /^msg_\w+$/.test(msg.id) &&
    msg.content.length === 1 && msg.content[0].type === 'output_text' && msg.content[0].text.length > 0,
  `one message of output_text: ${JSON.stringify(r.output)}`);
  check(r.output_text === msg?.content[0].text, `the SDK's output_text: ${r.output_text}`);
  const cut = r.status === 'incomplete';
  check((cut && r.incomplete_details?.reason === 'max_output_tokens' && r.usage.output_tokens === 24) ||
    (r.status === 'completed' && r.incomplete_details === null), `status ${r.status} ${JSON.stringify(r.incomplete_details)}`);
  check(r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens && r.usage.input_tokens > 0,
    `usage: ${JSON.stringify(r.usage)}`);
  check(r.instructions === INSTRUCTIONS && r.max_output_tokens === 24 && r.temperature === 0 && r.previous_response_id === null &&
    JSON.stringify(r.tools) === '[]' && r.tool_choice === 'auto' && r.text?.format?.type === 'text' && r.store === true &&
    typeof r.top_p === 'number' && r.error === null, `echo fields: ${JSON.stringify(r)}`);

  // the chat route on the same conversation: the same greedy answer from the same prompt
  const c = await chat(url, { messages: [{ role: 'system', content: INSTRUCTIONS }, { role: 'user', content: ASK }],
    max_tokens: 24, temperature: 0 });
  check(c.choices?.[0]?.message?.content === r.output_text, `same answer as chat: ${JSON.stringify(c)} vs ${r.output_text}`);
  check(c.usage?.prompt_tokens === r.usage.input_tokens, `same prompt as chat: ${c.usage?.prompt_tokens} vs ${r.usage.input_tokens}`);

  // streamed: the text deltas are the greedy answer, in the Responses event order
  const s = await collectResponse(await client.responses.create({ ...ask, stream: true }));
  check(s.text === r.output_text && s.seqOk, `streamed text: ${JSON.stringify(s.text)} vs ${JSON.stringify(r.output_text)}`);
  const deltas = s.types.filter((t) => t === 'response.output_text.delta').length;
  const order = ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added',
    ...Array(deltas).fill('response.output_text.delta'), 'response.output_text.done', 'response.content_part.done',
    'response.output_item.done', cut ? 'response.incomplete' : 'response.completed'];
  check(deltas > 1 && JSON.stringify(s.types) === JSON.stringify(order), `event order: ${s.types.join(' ')}`);
  const fin = s.last?.response;
  check(fin?.status === r.status && messageText(fin) === r.output_text && fin.usage.output_tokens === r.usage.output_tokens &&
    fin.usage.input_tokens === r.usage.input_tokens && fin.instructions === INSTRUCTIONS, `the last event's response: ${JSON.stringify(fin)}`);
  check(s.added[0]?.status === 'in_progress' && s.done[0]?.content?.[0]?.text === r.output_text, `item events: ${JSON.stringify(s.done)}`);

  // the SDK's stream helper folds the events into the same response
  const helper = client.responses.stream(ask);
  for await (const e of helper) void e;
  const folded = await helper.finalResponse();
  check(folded.output_text === r.output_text && folded.id !== r.id, `responses.stream: ${JSON.stringify(folded)}`);
}

async function toolRound(url, client) {
  const ask = { model: 'demo', input: ASK_WEATHER, tools: TOOLS, max_output_tokens: 120 };
  const r = await client.responses.create({ ...ask, tool_choice: { type: 'function', name: 'get_weather' } });
  const call = r.output.find((i) => i.type === 'function_call');
  check(r.status === 'completed' && r.output.length === 1 && call, `forced call: ${JSON.stringify(r)}`);
  let args;
  try {
    args = JSON.parse(call?.arguments);
  } catch {
    args = undefined;
  }
  check(/^call_\w+$/.test(call?.call_id ?? '') && /^fc_\w+$/.test(call?.id ?? '') && call?.name === 'get_weather' && validWeather(args),
    `function_call item: ${JSON.stringify(call)}`);
  check(r.tools?.[0]?.name === 'get_weather' && r.tool_choice?.name === 'get_weather', `tools echoed: ${JSON.stringify(r.tools)} ${JSON.stringify(r.tool_choice)}`);

  // streamed with required: the call's item, then its arguments as deltas and done
  const s = await collectResponse(await client.responses.create({ ...ask, tool_choice: 'required', stream: true }));
  const fc = s.last?.response?.output?.find((i) => i.type === 'function_call');
  check(s.added[0]?.type === 'function_call' && s.added[0].name === 'get_weather' && s.types.includes('response.function_call_arguments.delta'),
    `streamed call events: ${s.types.join(' ')}`);
  check(validWeather(JSON.parse(s.args || 'null')) && s.argsDone[0] === s.args && fc?.arguments === s.args && s.seqOk,
    `streamed arguments: ${s.args} ${JSON.stringify(fc)}`);

  // the result by previous_response_id, and the same conversation resent whole: one prompt,
  // which is the chat route's for the same history
  const result = { type: 'function_call_output', call_id: call?.call_id, output: '21 degrees' };
  const byId = await client.responses.create({ model: 'demo', tools: TOOLS, previous_response_id: r.id, input: [result], max_output_tokens: 8 });
  const whole = await client.responses.create({ model: 'demo', tools: TOOLS, max_output_tokens: 8,
    input: [{ role: 'user', content: ASK_WEATHER }, ...r.output, result] });
  check(byId.output.every((i) => i.type === 'message') && byId.previous_response_id === r.id && byId.usage.input_tokens > r.usage.input_tokens,
    `result turn answered: ${JSON.stringify(byId)}`);
  const c = await chat(url, { tools: CHAT_TOOLS, max_tokens: 1, messages: [{ role: 'user', content: ASK_WEATHER },
    { role: 'assistant', content: '', tool_calls: [{ id: call?.call_id, type: 'function', function: { name: 'get_weather', arguments: call?.arguments } }] },
    { role: 'tool', tool_call_id: call?.call_id, content: '21 degrees' }] });
  check(byId.usage.input_tokens === whole.usage.input_tokens && whole.usage.input_tokens === c.usage?.prompt_tokens,
    `tool history: by id ${byId.usage.input_tokens}, whole ${whole.usage.input_tokens}, chat ${c.usage?.prompt_tokens}`);
}

async function continued(url, client) {
  const first = await client.responses.create({ model: 'demo', input: ASK, max_output_tokens: 8, temperature: 0 });
  const next = 'And the queen?';
  const byId = await client.responses.create({ model: 'demo', previous_response_id: first.id, input: next, max_output_tokens: 8, temperature: 0 });
  const whole = await client.responses.create({ model: 'demo', max_output_tokens: 8, temperature: 0,
    input: [{ role: 'user', content: ASK }, ...first.output, { type: 'message', role: 'user', content: [{ type: 'input_text', text: next }] }] });
  check(byId.usage.input_tokens === whole.usage.input_tokens && byId.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
    `continued: by id ${byId.usage.input_tokens}, whole ${whole.usage.input_tokens}, first ${JSON.stringify(first.usage)}`);
  check(byId.output_text === whole.output_text && byId.previous_response_id === first.id, `continued answers: ${byId.output_text} vs ${whole.output_text}`);
  const c = await chat(url, { max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: ASK },
    { role: 'assistant', content: first.output_text }, { role: 'user', content: next }] });
  check(c.usage?.prompt_tokens === byId.usage.input_tokens && c.choices?.[0]?.message?.content === byId.output_text,
    `continued as chat: ${c.usage?.prompt_tokens} ${JSON.stringify(c.choices?.[0]?.message)}`);
  // a chain of two: the second continuation holds the whole conversation
  const third = await client.responses.create({ model: 'demo', previous_response_id: byId.id, input: 'And the prince?', max_output_tokens: 4 });
  check(third.usage.input_tokens > byId.usage.input_tokens + byId.usage.output_tokens, `a chain: ${JSON.stringify(third.usage)}`);
  // store false: not kept
  const unstored = await client.responses.create({ model: 'demo', input: ASK, max_output_tokens: 2, store: false });
  check(unstored.store === false, `store echoed: ${unstored.store}`);
  return unstored.id;
}

async function structured(client) {
  const r = await client.responses.create({ model: 'demo', input: ASK_WEATHER, max_output_tokens: 60,
    text: { format: { type: 'json_schema', name: 'weather', schema: WEATHER, strict: true } } });
  let parsed;
  try {
    parsed = JSON.parse(r.output_text);
  } catch {
    parsed = undefined;
  }
  check(validWeather(parsed) && r.status === 'completed' && r.text?.format?.type === 'json_schema' && r.text.format.name === 'weather',
    `text.format json_schema: ${JSON.stringify(r)}`);
}

async function reasoning(client) {
  // effort turns thinking on: the template opens <think>, and the demo model never closes it
  const ask = { model: 'demo', input: ASK_WEATHER, max_output_tokens: 10, temperature: 0, reasoning: { effort: 'low' } };
  const r = await client.responses.create(ask);
  const item = r.output[0];
  check(item?.type === 'reasoning' && /^rs_\w+$/.test(item.id) && item.content?.[0]?.type === 'reasoning_text' &&
    item.content[0].text.trim().length > 0 && r.reasoning?.effort === 'low', `reasoning item: ${JSON.stringify(r)}`);
  const s = await collectResponse(await client.responses.create({ ...ask, stream: true }));
  check(s.reasoning === item?.content?.[0]?.text && s.types.includes('response.reasoning_text.done') &&
    JSON.stringify(s.last?.response?.output) === JSON.stringify(r.output.map((i) => ({ ...i, id: s.last?.response?.output?.[0]?.id }))),
  `reasoning streamed: ${JSON.stringify(s.last?.response?.output)}`);
  // the reasoning item sent back, by previous_response_id or whole: one prompt
  const thanks = { role: 'user', content: 'Thanks.' };
  const byId = await client.responses.create({ model: 'demo', previous_response_id: r.id, input: [thanks], max_output_tokens: 2 });
  const whole = await client.responses.create({ model: 'demo', input: [{ role: 'user', content: ASK_WEATHER }, ...r.output, thanks], max_output_tokens: 2 });
  check(byId.usage.input_tokens === whole.usage.input_tokens && whole.usage.input_tokens > r.usage.input_tokens,
    `reasoning sent back: by id ${byId.usage.input_tokens}, whole ${whole.usage.input_tokens}`);
  const off = await client.responses.create({ ...ask, reasoning: { effort: 'none' } });
  check(off.output.every((i) => i.type === 'message'), `effort none: ${JSON.stringify(off.output)}`);
}

async function refusals(url, client, unstored) {
  const ask = { model: 'demo', input: ASK, max_output_tokens: 4 };
  async function bad(extra, needle, what) {
    try {
      await client.responses.create({ ...ask, ...extra });
      check(false, `${what}: accepted`);
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.error?.type === 'invalid_request_error' &&
        typeof e.error?.message === 'string' && e.error.message.includes(needle), `${what}: ${e.status} ${JSON.stringify(e.error)}`);
    }
  }
  for (const type of ['web_search', 'file_search', 'code_interpreter', 'computer_use_preview', 'image_generation', 'mcp'])
    await bad({ tools: [{ type }] }, `the built-in tool '${type}'`, `the built-in tool ${type}`);
  await bad({ service_tier: 'auto' }, "'service_tier'", 'an unimplemented field');
  await bad({ include: ['reasoning.encrypted_content'] }, "'include'", 'include');
  await bad({ previous_response_id: 'resp_doesnotexist' }, "'resp_doesnotexist'", 'an unknown previous_response_id');
  await bad({ previous_response_id: unstored }, `'${unstored}'`, 'a response stored with store false');
  await bad({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AA==' }] }] },
    "'input[0].content[0]'", 'an image part');
  await bad({ tools: TOOLS, tool_choice: { type: 'web_search_preview' } }, "'tool_choice'", 'a built-in tool_choice');
  await bad({ tools: [{ ...TOOLS[0], defer_loading: true }] }, "'tools[0].defer_loading'", 'an unknown tool field');
  await bad({ reasoning: { effort: 'low', summary: 'auto' } }, "'reasoning.summary'", 'reasoning summaries');
  await bad({ text: { format: { type: 'text' }, verbosity: 'low' } }, "'text.verbosity'", 'text.verbosity');
  await bad({ input: [{ type: 'item_reference', id: 'x' }] }, "'input[0]'", 'an item reference');
  const missing = await fetch(`${url}/v1/responses`);
  check(missing.status === 404, `GET /v1/responses: ${missing.status}`);
}

// GET /v1/responses/{id} shows a stored response as it was answered (whole or streamed), DELETE
// forgets it (then both are a 404, and previous_response_id a 400); a response stored with
// store false is not there; query parameters are refused.
async function stored(url, client, unstored) {
  const ask = { model: 'demo', input: ASK, max_output_tokens: 6, temperature: 0 };
  const r = await client.responses.create(ask);
  const got = await client.responses.retrieve(r.id);
  check(JSON.stringify(got) === JSON.stringify(r), `retrieve gives the response as answered: ${JSON.stringify(got).slice(0, 160)}`);
  const s = await collectResponse(await client.responses.create({ ...ask, stream: true }));
  const sid = s.last?.response?.id;
  check(JSON.stringify((await (await fetch(`${url}/v1/responses/${sid}`)).json())) === JSON.stringify(s.last?.response),
    'a streamed response is stored as its response.completed event gave it');
  const del = await fetch(`${url}/v1/responses/${r.id}`, { method: 'DELETE' });
  check(del.status === 200 && JSON.stringify(await del.json()) === JSON.stringify({ id: r.id, object: 'response', deleted: true }),
    `DELETE answers {id, object, deleted} (${del.status})`);
  for (const [what, call] of [['retrieve after delete', () => client.responses.retrieve(r.id)],
    ['delete twice', () => client.responses.delete(r.id)], ['retrieve of store false', () => client.responses.retrieve(unstored)],
    ['retrieve of an unknown id', () => client.responses.retrieve('resp_nothere')]]) {
    try {
      await call();
      check(false, `${what}: answered`);
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError && e.error?.message?.includes('No response found'), `${what}: ${e.status} ${JSON.stringify(e.error)}`);
    }
  }
  await client.responses.delete(sid);
  try {
    await client.responses.create({ ...ask, previous_response_id: sid });
    check(false, 'previous_response_id of a deleted response: accepted');
  } catch (e) {
    check(e.status === 400 && e.error?.message?.includes(sid), `previous_response_id of a deleted response: ${e.status}`);
  }
  const q = await fetch(`${url}/v1/responses/${unstored}?include=message.output_text.logprobs`);
  check(q.status === 400 && (await q.text()).includes("'include'"), `a query parameter is refused: ${q.status}`);
}

// A stream the server's stop cuts short ends with response.failed (status failed, the error
// saying why) and no response.completed; the cut request makes the server exit 1.
async function failedStream() {
  const s = await startServer(['-m', MODEL, '-c', '512', '--shutdown-timeout', '0', '--chat-template-file', TEMPLATE]);
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0 });
  s.child.removeAllListeners('exit');
  const exited = new Promise((res) => s.child.on('exit', (code) => res(code)));
  const out = { types: [], seqOk: true, last: null };
  const stream = await client.responses.create({ model: 'demo', input: ASK, max_output_tokens: 400, temperature: 0, stream: true });
  for await (const e of stream) {
    out.seqOk = out.seqOk && e.sequence_number === out.types.length;
    if (e.type === 'response.output_text.delta' && !out.types.includes(e.type)) s.child.kill('SIGTERM');
    out.types.push(e.type);
    out.last = e;
  }
  const r = out.last?.response;
  check(out.last?.type === 'response.failed' && r?.status === 'failed' && r?.error?.code === 'server_error' &&
    /stopping/.test(r?.error?.message ?? '') && !out.types.includes('response.completed') && out.seqOk,
  `a stream cut by the stop ends with response.failed: ${out.types.slice(-3)} ${JSON.stringify(r?.error)}`);
  check((await exited) === 1, 'and the server exits 1: a request was cut');
}

async function main() {
  const a = await startServer(['-m', MODEL, '-c', '512', '-np', '2', '--chat-template-file', TEMPLATE]);
  const client = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none', maxRetries: 0 });
  try {
    await plain(a.url, client);
    await toolRound(a.url, client);
    const unstored = await continued(a.url, client);
    await structured(client);
    await reasoning(client);
    await refusals(a.url, client, unstored);
    await stored(a.url, client, unstored);
  } catch (e) {
    fail(e);
  }
  await stopServer(a);
  await failedStream().catch(fail);
}

await main();
finish('responses server test: ');
