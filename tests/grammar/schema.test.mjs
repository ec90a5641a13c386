// Every schema under tests/grammar/schemas: gram_gen prints random documents of its grammar
// (walks over single characters and over the demo tokenizer's tokens) and each must parse as
// JSON and validate against the schema with ajv (draft 2020-12, ajv-formats in full mode).
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

import { SRC, load } from '../node/setup.mjs';

const GEN = process.env.MLXCEL_GRAM_GEN ?? 'build/tests/gram_gen';
const { default: Ajv2020 } = await load('ajv', 'dist/2020.js');
const { default: addFormats } = await load('ajv-formats', 'dist/index.js');

let passed = 0, failed = 0;
function check(cond, what) {
  if (cond) passed++;
  else {
    failed++;
    console.error(`CHECK failed: ${what}`);
  }
}

const dir = path.join(SRC, 'tests/grammar/schemas');
const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
check(files.length >= 20, `at least 20 schemas (${files.length})`);
const runs = [
  { args: ['-n', '150', '--seed', '17'], label: 'characters' },
  { args: ['-n', '10', '--seed', '29', '--tokenizer', path.join(SRC, 'models/demo')], label: 'demo tokens' },
];
let docs = 0;
for (const f of files) {
  const schema = JSON.parse(readFileSync(path.join(dir, f), 'utf8'));
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const validate = ajv.compile(schema);
  for (const run of runs) {
    let out;
    try {
      out = execFileSync(GEN, ['--schema', path.join(dir, f), ...run.args], { encoding: 'utf8', maxBuffer: 64 << 20 });
    } catch (e) {
      check(false, `${f} (${run.label}): gram_gen failed: ${e.stderr ?? e.message}`);
      continue;
    }
    for (const line of out.split('\n').filter((l) => l.length)) {
      const text = JSON.parse(line);
      let value, parsed = true;
      try {
        value = JSON.parse(text);
      } catch {
        parsed = false;
      }
      check(parsed, `${f} (${run.label}): not JSON: ${text}`);
      if (!parsed) continue;
      const ok = validate(value);
      check(ok, `${f} (${run.label}): ${JSON.stringify(validate.errors)}: ${text}`);
      docs++;
    }
  }
}
// json_object mode: any object.
const out = execFileSync(GEN, ['--json-object', '-n', '100', '--seed', '3'], { encoding: 'utf8' });
for (const line of out.split('\n').filter((l) => l.length)) {
  const v = JSON.parse(JSON.parse(line));
  check(v !== null && typeof v === 'object' && !Array.isArray(v), `json_object: ${line}`);
  docs++;
}
console.log(`${files.length} schemas, ${docs} documents validated`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
