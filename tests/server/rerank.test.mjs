// Reranking (--reranking: /v1/rerank, /rerank, /v1/reranking, /reranking) on the demo model, a
// causal LM, so through its "yes" and "no" tokens: each document's score must be the sigmoid
// of logit("yes") - logit("no") after the pair's last token, the pair being Qwen3-Reranker's
// judge prompt as its model card builds it (system turn, instruction, query, document, an
// empty thought), which the test builds itself with @huggingface/tokenizers and scores with
// `mlxcel logits` (the engine's plain prefill, not the server's path). Then the Jina/Cohere shape (ordering, top_n,
// return_documents, {"text"} documents, max_tokens_per_doc, usage), TEI's shape (texts,
// return_text, raw_scores), determinism, the refusals, the route without --reranking (501),
// LLAMA_ARG_RERANKING, and --rerank on a model whose tokenizer lost "yes" (exit 1 at start-up).
// Then a sequence classifier, the qwen3_seqcls_bf16 fixture, through the server against
// transformers' score.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { byteTokenizer } from '../node/byte_tokenizer.mjs';
import { harness } from '../node/harness.mjs';
import { SRC, BIN, MODEL, load, post } from '../node/setup.mjs';


const { Tokenizer } = await load('@huggingface/tokenizers', 'dist/tokenizers.mjs');

const { check, fail, startServer, stopServer, finish } =
  harness({ bin: BIN, label: 'rerank server test', timeoutMs: 110_000 });

const sigmoid = (x) => 1 / (1 + Math.exp(-x));
const logit = (p) => Math.log(p / (1 - p));

const tokJson = JSON.parse(readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8'));
const tok = new Tokenizer(tokJson, JSON.parse(readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8')));
const YES = tokJson.model.vocab.yes, NO = tokJson.model.vocab.no;

const QUERY = 'Who is the king of Israel?';
const DOCS = ['And David the king said unto the people', 'Once upon a time there was a little girl',
  'The stock market fell sharply on Monday', 'Saul was king over Israel'];

// The pair's tokens in Qwen3-Reranker's judge prompt, as its model card builds it: the three
// parts encoded apart without special tokens; maxDoc keeps that many tokens after
// "<Document>:", where the card's truncation of the middle part cuts.
const JUDGE_PREFIX = '<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the ' +
  'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n';
const JUDGE_SUFFIX = '<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n';
const encode = (text) => tok.encode(text, { add_special_tokens: false }).ids;
function pair(query, doc, maxDoc) {
  const head = `<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: ${query}\n<Document>:`;
  const middle = encode(`${head} ${doc}`);
  return [...encode(JUDGE_PREFIX), ...middle.slice(0, maxDoc === undefined ? middle.length : encode(head).length + maxDoc), ...encode(JUDGE_SUFFIX)];
}

// logit(yes) - logit(no) after the last token, from `mlxcel logits`.
function expected(ids, dir) {
  const out = path.join(dir, 'logits.npy');
  execFileSync(path.join(BIN, 'mlxcel'), ['logits', '-m', MODEL, '-t', '2', '--tokens', ids.join(','), '-o', out]);
  const buf = readFileSync(out);
  const n = buf.readUInt16LE(8);
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset + 10 + n));
  const vocab = data.length / ids.length, last = (ids.length - 1) * vocab;
  return data[last + YES] - data[last + NO];
}

async function shapes(url, dir) {
  check(Number.isInteger(YES) && Number.isInteger(NO), `the demo tokenizer has "yes" (${YES}) and "no" (${NO})`);
  const r = await post(url, '/v1/rerank', { model: 'demo', query: QUERY, documents: DOCS });
  const j = await r.json();
  check(r.status === 200 && j.object === 'list' && j.model === 'demo' && /^rerank-/.test(j.id) && Array.isArray(j.results),
    `envelope: ${r.status} ${JSON.stringify(j).slice(0, 200)}`);
  const res = j.results ?? [];
  check(res.length === DOCS.length && [...res.map((x) => x.index)].sort().every((x, i) => x === i),
    `every document once: ${JSON.stringify(res.map((x) => x.index))}`);
  check(res.every((x, i) => x.relevance_score > 0 && x.relevance_score < 1 && (i === 0 || res[i - 1].relevance_score >= x.relevance_score)),
    `probabilities, highest first: ${JSON.stringify(res.map((x) => x.relevance_score))}`);
  check(res.every((x) => !('document' in x)), 'no documents unless asked for');
  const pairs = DOCS.map((d) => pair(QUERY, d));
  const n = pairs.reduce((s, p) => s + p.length, 0);
  check(j.usage?.prompt_tokens === n && j.usage?.total_tokens === n, `usage ${JSON.stringify(j.usage)} against ${n} tokens of the pairs`);
  const byIndex = new Map(res.map((x) => [x.index, x.relevance_score]));
  const want = pairs.map((p) => expected(p, dir));
  const errs = want.map((w, i) => Math.abs(logit(byIndex.get(i)) - w));
  check(errs.every((e) => e < 1e-3), `each score is sigmoid(logit(yes) - logit(no)) of the pair: |error| ${errs.map((e) => e.toExponential(1))} (want ${want.map((w) => w.toFixed(4))})`);
  check(new Set(want.map((w) => w.toFixed(3))).size === DOCS.length, 'the documents score differently');

  const again = await (await post(url, '/v1/rerank', { query: QUERY, documents: DOCS })).json();
  check(JSON.stringify(again.results) === JSON.stringify(j.results), 'a second request gives the same scores');
  for (const route of ['/rerank', '/v1/reranking', '/reranking']) {
    const o = await (await post(url, route, { query: QUERY, documents: DOCS })).json();
    check(JSON.stringify(o.results) === JSON.stringify(j.results), `${route} answers as /v1/rerank`);
  }

  const top = await (await post(url, '/v1/rerank', { query: QUERY, documents: DOCS.map((text) => ({ text })), top_n: 2, return_documents: true })).json();
  check(top.results?.length === 2 && top.results.every((x, i) => x.index === res[i].index && x.relevance_score === res[i].relevance_score),
    `top_n 2: the best two (${JSON.stringify(top.results?.map((x) => x.index))})`);
  check(top.results?.every((x) => x.document?.text === DOCS[x.index]), 'return_documents: each result carries its document\'s text');
  check(top.usage?.prompt_tokens === n, 'top_n still scores every document');
  const big = await (await post(url, '/v1/rerank', { query: QUERY, documents: DOCS, top_n: 99 })).json();
  check(big.results?.length === DOCS.length, 'top_n past the documents gives them all');

  const cut = pair(QUERY, DOCS[0], 3);
  const short = await (await post(url, '/v1/rerank', { query: QUERY, documents: [DOCS[0]], max_tokens_per_doc: 3 })).json();
  check(short.usage?.prompt_tokens === cut.length && Math.abs(logit(short.results[0].relevance_score) - expected(cut, dir)) < 1e-3,
    `max_tokens_per_doc 3 scores the document's first 3 tokens (${short.usage?.prompt_tokens} tokens, want ${cut.length})`);

  const tei = await (await post(url, '/rerank', { query: QUERY, texts: DOCS, return_text: true })).json();
  check(Array.isArray(tei) && tei.length === DOCS.length && tei.every((x, i) => x.index === res[i].index && x.score === res[i].relevance_score && x.text === DOCS[x.index]),
    `TEI's texts: a bare array of {index, score, text}: ${JSON.stringify(tei).slice(0, 160)}`);
  const raw = await (await post(url, '/rerank', { query: QUERY, texts: DOCS, raw_scores: true })).json();
  check(Array.isArray(raw) && raw.every((x) => Math.abs(x.score - want[x.index]) < 1e-3 && !('text' in x)), 'TEI\'s raw_scores: the logits');
}

async function refusals(url) {
  const long = 'and the king said unto the people '.repeat(60);
  for (const [body, needle, what] of [
    [{ documents: DOCS }, "'query' is required", 'no query'],
    [{ query: '', documents: DOCS }, "'query'", 'an empty query'],
    [{ query: 7, documents: DOCS }, "'query'", 'a query that is not a string'],
    [{ query: QUERY }, "'documents' is required", 'no documents'],
    [{ query: QUERY, documents: [] }, "'documents' must be a non-empty array", 'empty documents'],
    [{ query: QUERY, documents: 'a' }, "'documents' must be a non-empty array", 'documents not an array'],
    [{ query: QUERY, documents: ['a', 3] }, "'documents[1]'", 'a document that is a number'],
    [{ query: QUERY, documents: [{ text: 'a', title: 'b' }] }, "'documents[0].title' is not supported", 'an unknown key of a document'],
    [{ query: QUERY, documents: [{ title: 'b' }] }, "'documents[0]", 'a document object without text'],
    [{ query: QUERY, documents: DOCS, rank_fields: ['text'] }, "'rank_fields' is not supported", 'an unknown field'],
    [{ query: QUERY, documents: DOCS, top_n: 0 }, "'top_n' must be a positive integer", 'top_n 0'],
    [{ query: QUERY, documents: DOCS, top_n: '2' }, "'top_n'", 'top_n a string'],
    [{ query: QUERY, documents: DOCS, return_documents: 'yes' }, "'return_documents' must be true or false", 'return_documents a string'],
    [{ query: QUERY, documents: DOCS, raw_scores: true }, "'raw_scores' is not supported", 'raw_scores outside TEI\'s shape'],
    [{ query: QUERY, documents: DOCS, texts: DOCS }, "'documents' and 'texts'", 'both documents and texts'],
    [{ query: QUERY, documents: [long] }, 'more than the context size', 'a document past the context'],
  ]) {
    const r = await post(url, '/v1/rerank', body);
    const text = await r.text();
    check(r.status === 400 && text.includes(needle), `${what}: ${r.status} ${text}`);
  }
}

// The demo model whose "yes" token is renamed (and the merges that make or use it dropped):
// no score head and no yes/no pair.
function noYesModel(dir) {
  const model = path.join(dir, 'noyes');
  cpSync(MODEL, model, { recursive: true });
  const t = JSON.parse(readFileSync(path.join(model, 'tokenizer.json'), 'utf8'));
  t.model.vocab['<gone>'] = t.model.vocab.yes;
  delete t.model.vocab.yes;
  t.model.merges = t.model.merges.filter((m) => {
    const [a, b] = Array.isArray(m) ? m : m.split(' ');
    return a !== 'yes' && b !== 'yes' && a + b !== 'yes';
  });
  writeFileSync(path.join(model, 'tokenizer.json'), JSON.stringify(t));
  return model;
}

// The qwen3_seqcls_bf16 fixture (a Qwen3ForSequenceClassification) given a byte-level
// tokenizer, so that a query "\u0001" and an empty document are its first reference sequence,
// [1]: the server must answer transformers' score for it. Without --reranking it does not
// start (it has no LM head), and with it, generation says why it cannot.
async function classifier(dir) {
  const fixture = path.join(SRC, 'tests/fixtures/qwen3_seqcls_bf16');
  const model = path.join(dir, 'seqcls');
  cpSync(fixture, model, { recursive: true });
  writeFileSync(path.join(model, 'tokenizer.json'), JSON.stringify(byteTokenizer()));
  writeFileSync(path.join(model, 'tokenizer_config.json'), '{}');
  const ref = JSON.parse(readFileSync(path.join(fixture, 'scores.json'), 'utf8'));
  check(JSON.stringify(ref.sequences[0]) === '[1]', `the fixture's first sequence is [1]: ${JSON.stringify(ref.sequences[0])}`);
  try {
    await startServer(['-m', model, '-c', '256']);
    check(false, 'a classifier started without --reranking');
  } catch (e) {
    check(/exited 1/.test(e.message) && e.message.includes('sequence classifier') && e.message.includes('--reranking'),
      `a classifier without --reranking exits at start-up: ${e.message.trim()}`);
  }
  const s = await startServer(['-m', model, '-c', '256', '--reranking']);
  try {
    const want = ref.scores[0][0];
    const r = await (await post(s.url, '/v1/rerank', { query: '\u0001', documents: ['', 'ab'] })).json();
    const got = r.results?.find((x) => x.index === 0)?.relevance_score;
    check(r.usage?.prompt_tokens === 1 + 3 && Math.abs(logit(got) - want) < 1e-3 * Math.abs(want),
      `the score head through the server: ${got} = sigmoid(${logit(got)}), transformers ${want} (${JSON.stringify(r.usage)})`);
    const raw = await (await post(s.url, '/rerank', { query: '\u0001', texts: [''], raw_scores: true })).json();
    check(Math.abs(raw[0]?.score - want) < 1e-3 * Math.abs(want), `TEI's raw_scores give the head's logit: ${raw[0]?.score}`);
    const g = await post(s.url, '/v1/completions', { prompt: 'ab', max_tokens: 2 });
    const text = await g.text();
    check(g.status === 501 && text.includes('sequence classifier'), `generation on a classifier: ${g.status} ${text}`);
  } catch (e) {
    fail(e);
  }
  await stopServer(s);
}

async function main() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'mlxcel-rerank-'));
  try {
    const a = await startServer(['-m', MODEL, '-c', '256'], { LLAMA_ARG_RERANKING: '1' });
    try {
      await shapes(a.url, dir);
      await refusals(a.url);
    } catch (e) {
      fail(e);
    }
    await stopServer(a);
    const off = await startServer(['-m', MODEL, '-c', '256']);
    try {
      const r = await post(off.url, '/v1/rerank', { query: QUERY, documents: DOCS });
      check(r.status === 501 && (await r.text()).includes('--reranking'), `without --reranking: ${r.status}`);
    } catch (e) {
      fail(e);
    }
    await stopServer(off);
    try {
      await startServer(['-m', noYesModel(dir), '-c', '256', '--rerank']);
      check(false, '--rerank started on a model without "yes"');
    } catch (e) {
      check(/exited 1/.test(e.message) && e.message.includes('no score head') && e.message.includes('"yes"') && !e.message.includes('nor'),
        `--rerank on a model without "yes" exits at start-up naming it: ${e.message.trim()}`);
    }
    await classifier(dir).catch(fail);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
finish('rerank server test: ');
