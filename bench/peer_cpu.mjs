// llama.cpp on the CPU as the peer of `mlxcel bench`: the prebuilt llama.cpp CPU libraries of
// the node-llama-cpp packages (bench/node, installed by `npm ci --prefix bench/node`; neither the
// build nor the tests need them), loaded with the ggml-cpu variant that fits this CPU's
// features, driven by token ids.
//
//   node bench/peer_cpu.mjs -m MODEL.gguf [-t 2] [-p 128] [-n 32] [-r 3] [--json]
//   node bench/peer_cpu.mjs -m MODEL.gguf --tokens 1,2,3 -n 16     (greedy ids, one JSON line)
//
// The tests are mlxcel bench's: ppP evaluates a P-token prompt into an empty sequence, the last
// position's logits and a greedy pick included; tgN evaluates one token untimed (a 1-token
// prefill) then times N steps of one token each, every step's logits picked greedily but the
// next id fed from a fixed list, so every run does the same work. The prompt and step ids come
// from the same generator as mlxcel bench's. Each test keeps the best of R runs.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "node", "package.json"));

const usage =
  "usage: node bench/peer_cpu.mjs -m MODEL.gguf [-t THREADS] [-p 128] [-n 32] [-r 3] [--json]\n" +
  "       node bench/peer_cpu.mjs -m MODEL.gguf --tokens IDS -n N   (greedy continuation ids)";

function die(msg) {
  process.stderr.write(`peer_cpu: ${msg}\n${usage}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const o = { model: null, threads: 2, prompt: 128, gen: 32, reps: 3, json: false, tokens: null };
  const ints = { "-t": "threads", "-p": "prompt", "-n": "gen", "-r": "reps" };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--json") o.json = true;
    else if (a === "-h" || a === "--help") {
      process.stdout.write(usage + "\n");
      process.exit(0);
    } else if (a === "-m") o.model = argv[++i] ?? die("-m needs a file");
    else if (a === "--tokens") {
      const s = argv[++i] ?? die("--tokens needs ids");
      o.tokens = s.split(",").map((x) => {
        if (!/^\d+$/.test(x)) die(`--tokens: ${JSON.stringify(x)} is not a token id`);
        return Number(x);
      });
    } else if (a in ints) {
      const s = argv[++i];
      if (s === undefined || !/^\d+$/.test(s)) die(`${a} needs a non-negative integer`);
      o[ints[a]] = Number(s);
    } else die(`unknown argument ${JSON.stringify(a)}`);
  }
  if (!o.model) die("-m MODEL.gguf is required");
  if (o.threads < 1) die("-t must be at least 1");
  if (o.reps < 1) die("-r must be at least 1");
  return o;
}

// mlxcel's bench_tokens (src/engine/engine_bench.c): spread over the vocabulary, never zero.
function benchTokens(n, vocab, seed) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    ids.push(1 + ((seed >>> 8) % (vocab - 1)));
  }
  return ids;
}

const opts = parseArgs(process.argv.slice(2));
let nlc;
try {
  nlc = await import(require.resolve("node-llama-cpp"));
} catch (e) {
  die(`node-llama-cpp is not installed (npm ci --prefix bench/node): ${e.message}`);
}
const { getLlama, LlamaLogLevel } = nlc;

// ggml says which CPU variant it loaded only in its log: keep the log, print it on failure.
const log = [];
const llama = await getLlama({
  gpu: false,
  build: "never",
  maxThreads: 0, // so that a context's thread count is the one asked for, not a hint
  logLevel: LlamaLogLevel.debug,
  logger: (level, message) => log.push(message),
});
let model, context;
try {
  model = await llama.loadModel({ modelPath: opts.model, gpuLayers: 0 });
  const need = opts.tokens ? opts.tokens.length + opts.gen : Math.max(opts.prompt, opts.gen + 1);
  context = await model.createContext({
    contextSize: Math.max(256, need + 1),
    batchSize: Math.max(opts.prompt, 32),
    sequences: 1,
    threads: opts.threads,
  });
} catch (e) {
  process.stderr.write(log.join(""));
  die(`${opts.model}: ${e.message}`);
}
const seq = context.getSequence();
const vocab = model.tokens.count ?? model.fileInfo.metadata.llama?.vocab_size;
const greedy = { temperature: 0, yieldEogToken: true };

const variant = (log.join("").match(/loaded CPU backend from \S*libggml-cpu-([\w-]+)\.so/) ?? [])[1];
const nlcPackage = join(dirname(require.resolve("node-llama-cpp")), "..", "package.json");
const nlcVersion = JSON.parse(readFileSync(nlcPackage, "utf8")).version;
const info = {
  llama_cpp: `${llama.llamaCppRelease.repo} ${llama.llamaCppRelease.release}`,
  node_llama_cpp: nlcVersion,
  ggml_cpu: variant ?? "unknown",
  features: llama.systemInfo.replace(/^CPU : /, "").trim(),
  threads: opts.threads,
  flash_attention: context.flashAttention,
};

if (opts.tokens) {
  for (const t of opts.tokens) if (t >= vocab) die(`--tokens: ${t} is outside the vocabulary of ${vocab}`);
  await seq.clearHistory();
  const out = [];
  const it = seq.evaluate(opts.tokens, greedy);
  for (let r = await it.next(); !r.done && out.length < opts.gen; ) {
    out.push(r.value);
    if (out.length < opts.gen) r = await it.next();
  }
  await it.return();
  process.stdout.write(JSON.stringify({ tokens: out, ...info }) + "\n");
  process.exit(0);
}

async function prefill() {
  await seq.clearHistory();
  const ids = benchTokens(opts.prompt, vocab, 7);
  const t0 = performance.now();
  const it = seq.evaluate(ids, greedy);
  await it.next();
  const sec = (performance.now() - t0) / 1e3;
  await it.return();
  return sec;
}

async function decode() {
  await seq.clearHistory();
  const it = seq.evaluate(benchTokens(1, vocab, 11), greedy);
  await it.next();
  const t0 = performance.now();
  for (let step = 1; step <= opts.gen; step++) await it.next(benchTokens(1, vocab, 11 + step)[0]);
  const sec = (performance.now() - t0) / 1e3;
  await it.return();
  return sec;
}

if (!opts.json) {
  process.stdout.write(
    `llama.cpp ${info.llama_cpp} (node-llama-cpp ${info.node_llama_cpp}), ggml-cpu-${info.ggml_cpu}, ` +
      `${opts.threads} threads, flash attention ${info.flash_attention}\nCPU: ${info.features}\n`,
  );
}
for (const [test, n, run] of [
  [`pp${opts.prompt}`, opts.prompt, prefill],
  [`tg${opts.gen}`, opts.gen, decode],
]) {
  if (n === 0) continue;
  let best = Infinity;
  for (let r = 0; r < opts.reps; r++) best = Math.min(best, await run());
  const row = { test, tok_per_s: n / best, seconds: best, ...info };
  if (opts.json) process.stdout.write(JSON.stringify(row) + "\n");
  else process.stdout.write(`${test}  ${row.tok_per_s.toFixed(2)} tok/s\n`);
}
await context.dispose();
await model.dispose();
