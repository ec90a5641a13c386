// Embeddings (--embeddings: /v1/embeddings, /embeddings, /embedding) through the official
// openai package. On the demo model: shapes, unit norm, the same text giving the same vector
// alone, twice, in a batch in either order, as token ids, as base64 (the SDK's default) or
// floats; refusals. Against transformers: on the llama_f32 fixture (tied embeddings, given a
// byte-level tokenizer here), whose logits.npy holds transformers' logits at every position of
// its reference tokens, logits = h_t E^T with h_t the hidden state after the final norm, so the
// mean of the logits over the positions is (mean_t h_t) E^T: E times the mean-pooled embedding
// must point where the mean logits do (E, 256 x 128, maps 128 dimensions injectively, so that
// pins the embedding's direction). The same with last-token pooling named by a
// sentence-transformers Pooling config, against the last position's logits.
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { byteTokenizer } from '../node/byte_tokenizer.mjs';
import { harness } from '../node/harness.mjs';
import { SRC, BIN, MODEL, load, post } from '../node/setup.mjs';

const FIXTURE = path.join(SRC, 'tests/fixtures/llama_f32');

const { default: OpenAI } = await load('openai', 'index.mjs');
const { Tokenizer } = await load('@huggingface/tokenizers', 'dist/tokenizers.mjs');

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'embeddings server test', timeoutMs: 110_000 });

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
const norm = (a) => Math.sqrt(dot(a, a));
const cosine = (a, b) => dot(a, b) / (norm(a) * norm(b));

async function demo(url) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
  const tok = new Tokenizer(JSON.parse(readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8')),
    JSON.parse(readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8')));
  const TEXTS = ['The king said unto the people', 'Once upon a time', 'Hello, world'];
  const one = await client.embeddings.create({ model: 'demo', input: TEXTS[0] });
  const v = one.data[0]?.embedding ?? [];
  const ids = tok.encode(TEXTS[0], { add_special_tokens: true }).ids;
  check(one.object === 'list' && one.data.length === 1 && one.data[0].object === 'embedding' && one.data[0].index === 0 &&
    typeof one.model === 'string', `envelope: ${JSON.stringify({ ...one, data: one.data.map((d) => ({ ...d, embedding: d.embedding.length })) })}`);
  check(v.length === 384 && Math.abs(norm(v) - 1) < 1e-5 && v.every(Number.isFinite), `384 dimensions of unit norm: ${v.length}, ${norm(v)}`);
  check(one.usage.prompt_tokens === ids.length && one.usage.total_tokens === ids.length,
    `usage ${JSON.stringify(one.usage)} against ${ids.length} tokens (with BOS)`);

  const again = await client.embeddings.create({ model: 'demo', input: TEXTS[0] });
  check(same(again.data[0].embedding, v), 'the same text gives the same vector');
  const floats = await client.embeddings.create({ model: 'demo', input: TEXTS[0], encoding_format: 'float' });
  check(same(floats.data[0].embedding, v), 'float and base64 give the same vector');
  const byIds = await client.embeddings.create({ model: 'demo', input: ids });
  check(same(byIds.data[0].embedding, v) && byIds.usage.prompt_tokens === ids.length, 'token ids give the text\'s vector');

  const batch = await client.embeddings.create({ model: 'demo', input: TEXTS });
  const reversed = await client.embeddings.create({ model: 'demo', input: [...TEXTS].reverse() });
  check(batch.data.length === 3 && batch.data.every((d, i) => d.index === i), `batch indexes: ${batch.data.map((d) => d.index)}`);
  check(same(batch.data[0].embedding, v) && TEXTS.every((_, i) => same(batch.data[i].embedding, reversed.data[2 - i].embedding)),
    'a batch in either order gives each text its own vector');
  check(!same(batch.data[1].embedding, batch.data[2].embedding) && cosine(batch.data[1].embedding, batch.data[2].embedding) < 0.9999,
    'different texts give different vectors');
  const nested = await client.embeddings.create({ model: 'demo', input: [ids, tok.encode(TEXTS[1], { add_special_tokens: true }).ids] });
  check(same(nested.data[0].embedding, v) && same(nested.data[1].embedding, batch.data[1].embedding), 'arrays of token ids');

  const alias = await (await post(url, '/embeddings', { input: TEXTS[0] })).json();
  check(same(alias.data?.[0]?.embedding ?? [], v), '/embeddings');
  const llama = await (await post(url, '/embedding', { content: TEXTS[0] })).json();
  check(Array.isArray(llama) && llama[0]?.index === 0 && same(llama[0]?.embedding?.[0] ?? [], v), `/embedding: ${JSON.stringify(llama).slice(0, 120)}`);

  for (const [body, needle, what] of [[{ input: TEXTS[0], dimensions: 64 }, 'dimensions', 'dimensions other than the model\'s'],
    [{ input: TEXTS[0], encoding_format: 'int8' }, 'encoding_format', 'an unknown encoding'],
    [{ input: TEXTS[0], truncate: true }, "'truncate'", 'an unknown field'],
    [{ input: '' }, "'input'", 'an empty string'], [{ input: [1, 999999] }, "'input[1]'", 'a token outside the vocabulary']]) {
    const r = await post(url, '/v1/embeddings', { model: 'demo', ...body });
    const text = await r.text();
    check(r.status === 400 && text.includes(needle), `${what}: ${r.status} ${text}`);
  }
}

// safetensors: one float32 tensor by name
function tensor(file, name) {
  const buf = readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const info = JSON.parse(buf.subarray(8, 8 + n).toString())[name];
  const [a, b] = info.data_offsets;
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset + 8 + n + a, buf.byteOffset + 8 + n + b));
  return { shape: info.shape, data };
}

// .npy: a float32 array, C order
function npy(file) {
  const buf = readFileSync(file);
  const n = buf.readUInt16LE(8);
  const header = buf.subarray(10, 10 + n).toString();
  const shape = header.match(/'shape': \((\d+), (\d+)\)/).slice(1).map(Number);
  if (!header.includes("'<f4'") || header.includes("'fortran_order': True")) throw new Error(`${file}: ${header}`);
  return { shape, data: new Float32Array(buf.buffer.slice(buf.byteOffset + 10 + n)) };
}

// The fixture's embedding of its reference tokens, and E times it (where the logits' mean
// over the pooled positions must point)
async function projected(url, E) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
  const ref = JSON.parse(readFileSync(path.join(FIXTURE, 'reference.json'), 'utf8'));
  const e = (await client.embeddings.create({ model: 'fixture', input: ref.tokens })).data[0].embedding;
  const [vocab, dim] = E.shape;
  return { e, dim, proj: Array.from({ length: vocab }, (_, t) => dot(E.data.subarray(t * dim, (t + 1) * dim), e)) };
}

const meanRow = (rows) => Array.from(rows[0], (_, t) => rows.reduce((s, r) => s + r[t], 0) / rows.length);

async function fixture() {
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-embed-'));
  try {
    cpSync(FIXTURE, tmp, { recursive: true });
    writeFileSync(path.join(tmp, 'tokenizer.json'), JSON.stringify(byteTokenizer()));
    writeFileSync(path.join(tmp, 'tokenizer_config.json'), '{}');
    const E = tensor(path.join(tmp, 'model.safetensors'), 'model.embed_tokens.weight');
    const L = npy(path.join(FIXTURE, 'logits.npy'));
    const rows = Array.from({ length: L.shape[0] }, (_, i) => L.data.subarray(i * L.shape[1], (i + 1) * L.shape[1]));

    const mean = await startServer(['-m', tmp, '-c', '256', '--embeddings']);
    try {
      const r = await projected(mean.url, E);
      check(r.dim === 128 && Math.abs(norm(r.e) - 1) < 1e-5, `fixture: ${r.dim} dimensions, norm ${norm(r.e)}`);
      const cos = cosine(r.proj, meanRow(rows)), other = cosine(r.proj, rows[rows.length - 1]);
      check(cos > 1 - 1e-6, `mean pooling against transformers' mean logits: cosine ${cos}`);
      check(other < 0.999, `and not against the last position's: cosine ${other}`);
    } catch (e) {
      fail(e);
    }
    await stopServer(mean);

    // a sentence-transformers Pooling module that names the last token
    writeFileSync(path.join(tmp, 'modules.json'), JSON.stringify([{ idx: 0, name: '0', path: '', type: 'sentence_transformers.models.Transformer' },
      { idx: 1, name: '1', path: '1_Pooling', type: 'sentence_transformers.models.Pooling' }]));
    mkdirSync(path.join(tmp, '1_Pooling'));
    const pooling = (mode) => writeFileSync(path.join(tmp, '1_Pooling/config.json'), JSON.stringify({ word_embedding_dimension: 128,
      pooling_mode_cls_token: false, pooling_mode_mean_tokens: false, pooling_mode_max_tokens: false, pooling_mode_lasttoken: false, [mode]: true }));
    pooling('pooling_mode_lasttoken');
    const lastTok = await startServer(['-m', tmp, '-c', '256', '--embeddings']);
    try {
      const r = await projected(lastTok.url, E);
      const cos = cosine(r.proj, rows[rows.length - 1]);
      check(cos > 1 - 1e-6, `last-token pooling against transformers' last logits: cosine ${cos}`);
    } catch (e) {
      fail(e);
    }
    await stopServer(lastTok);

    pooling('pooling_mode_max_tokens');
    try {
      await startServer(['-m', tmp, '-c', '256', '--embeddings']);
      check(false, 'max pooling started');
    } catch (e) {
      check(/exited 1/.test(e.message) && e.message.includes('pooling_mode_max_tokens'), `max pooling refused: ${e.message}`);
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

async function main() {
  const a = await startServer(['-m', MODEL, '-c', '512', '--embeddings']);
  try {
    await demo(a.url);
  } catch (e) {
    fail(e);
  }
  await stopServer(a);
  const off = await startServer(['-m', MODEL, '-c', '256']);
  try {
    const r = await post(off.url, '/v1/embeddings', { input: 'x' });
    check(r.status === 501 && (await r.text()).includes('--embeddings'), `without --embeddings: ${r.status}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(off);
  await fixture().catch(fail);
}

await main();
finish('embeddings server test: ');
