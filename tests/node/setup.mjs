// Where the node tests find what they use: the source tree, the built binaries, the demo model
// and the JS packages of tests/node (the references they compare against); and the JSON POST
// most of them send.
import { existsSync } from 'node:fs';
import path from 'node:path';

export const SRC = process.env.MLXCEL_SOURCE_DIR ?? '.';
export const BIN = process.env.MLXCEL_BIN_DIR ?? 'build/bin';
export const MODEL = path.join(SRC, 'models/demo');
export const NODE_MODULES = path.join(SRC, 'tests/node/node_modules');

// Imports `file` of package `pkg` from tests/node/node_modules; when the package is not
// installed the run ends (exit 1, a failure: the test cannot say anything) saying how to get it.
export function load(pkg, file) {
  if (!existsSync(path.join(NODE_MODULES, pkg))) {
    console.log(`tests/node/node_modules has no ${pkg} package: run \`npm ci\` in tests/node (tools/install-deps.sh does)`);
    process.exit(1);
  }
  return import(path.join(NODE_MODULES, pkg, file));
}

// POSTs body as JSON to url + route, with any further headers.
export const post = (url, route, body, headers = {}) =>
  fetch(url + route, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
