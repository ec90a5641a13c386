// A stand-in for the Hugging Face Hub on 127.0.0.1, for testing downloads without a network.
// It serves the files of one directory as every repo named with --repo:
//   GET /api/models/{owner}/{name}/tree/{rev}?recursive=true   the listing, two entries a
//       page, chained with Link: <...>; rel="next" as the Hub paginates
//   GET /{owner}/{name}/resolve/{rev}/{path}                   a file; LFS files (*.safetensors)
//       redirect to /cdn/{sha256}, which honours Range: bytes=N-
// Besides the directory's files the listing has a README.md, a directory and a safetensors file
// inside it, none of which a client of the runtime should fetch.
//
// usage: node fake_hub.mjs --root DIR --state DIR --repo owner/name [--repo ...]
// It writes STATE/port once listening, appends one JSON line per request to STATE/log
// ({method, path, range, auth, status, sent}), and reads STATE/mode before each request:
//   normal    as above
//   cut       every LFS response stops at byte CUT of the file and the connection is dropped
//   cut-once  only the first LFS response is cut that way
//   badsha    the listing gives a wrong sha256 for the LFS files
//   badsize   the listing says config.json is one byte longer than it is
//   evil      the listing also names ../escape.safetensors
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

export const CUT = 100000;

const args = { repo: [] };
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i].replace(/^--/, '');
  if (key === 'repo') args.repo.push(process.argv[i + 1]);
  else args[key] = process.argv[i + 1];
}
if (!args.root || !args.state || args.repo.length === 0) {
  console.error('usage: node fake_hub.mjs --root DIR --state DIR --repo owner/name [--repo ...]');
  process.exit(2);
}
fs.mkdirSync(args.state, { recursive: true });

const isLfs = (p) => p.endsWith('.safetensors');
const files = new Map(); // path -> {data, sha256}
for (const name of fs.readdirSync(args.root).sort()) {
  const data = fs.readFileSync(path.join(args.root, name));
  files.set(name, { data, sha256: crypto.createHash('sha256').update(data).digest('hex') });
}
const extra = new Map([
  ['README.md', Buffer.from('# a model card nobody needs at run time\n')],
  ['sub/extra.safetensors', Buffer.from('not a top-level weight file')],
]);
for (const [name, data] of extra)
  files.set(name, { data, sha256: crypto.createHash('sha256').update(data).digest('hex') });

// cut-once cuts the first LFS response after the mode file switched to it.
let cutsLeft = 0;
let lastMode = 'normal';
const mode = () => {
  let m = 'normal';
  try {
    m = fs.readFileSync(path.join(args.state, 'mode'), 'utf8').trim() || 'normal';
  } catch {}
  if (m !== lastMode) cutsLeft = 1;
  lastMode = m;
  return m;
};

function listing(m) {
  const entries = [{ type: 'directory', path: 'sub', size: 0, oid: '0'.repeat(40) }];
  for (const [p, f] of files) {
    const gitOid = crypto.createHash('sha1').update(f.data).digest('hex');
    const e = { type: 'file', path: p, size: f.data.length, oid: gitOid };
    if (m === 'badsize' && p === 'config.json') e.size += 1;
    if (isLfs(p)) {
      const oid = m === 'badsha' ? crypto.createHash('sha256').update('other').digest('hex') : f.sha256;
      e.lfs = { oid, size: f.data.length, pointerSize: 134 };
    }
    entries.push(e);
  }
  if (m === 'evil') entries.push({ type: 'file', path: '../escape.safetensors', size: 5, oid: '1'.repeat(40) });
  return entries;
}

function log(req, status, sent) {
  const line = {
    method: req.method,
    path: req.url,
    range: req.headers.range || null,
    auth: req.headers.authorization || null,
    status,
    sent,
  };
  fs.appendFileSync(path.join(args.state, 'log'), JSON.stringify(line) + '\n');
}

function send(req, res, status, headers, body) {
  res.writeHead(status, { 'Content-Length': body.length, ...headers });
  res.end(body);
  log(req, status, body.length);
}

function serveTree(req, res, url, repo) {
  const page = Number(url.searchParams.get('cursor') || 0);
  const all = listing(mode());
  const body = Buffer.from(JSON.stringify(all.slice(page * 2, page * 2 + 2)));
  const headers = { 'Content-Type': 'application/json' };
  if ((page + 1) * 2 < all.length) {
    const next = `http://${req.headers.host}/api/models/${repo}/tree/main?recursive=true&cursor=${page + 1}`;
    headers.Link = `<${next}>; rel="next"`;
  }
  send(req, res, 200, headers, body);
}

function serveBlob(req, res, f, lfs) {
  const size = f.data.length;
  const m = mode();
  let start = 0;
  const range = /^bytes=(\d+)-$/.exec(req.headers.range || '');
  if (range) start = Number(range[1]);
  if (start >= size && size > 0) return send(req, res, 416, { 'Content-Range': `bytes */${size}` }, Buffer.alloc(0));
  const status = range ? 206 : 200;
  const headers = { 'Content-Length': size - start, 'Accept-Ranges': 'bytes' };
  if (range) headers['Content-Range'] = `bytes ${start}-${size - 1}/${size}`;
  const cut = lfs && (m === 'cut' || (m === 'cut-once' && cutsLeft > 0));
  res.writeHead(status, headers);
  res.flushHeaders();
  if (!cut) {
    res.end(f.data.subarray(start));
    return log(req, status, size - start);
  }
  if (m === 'cut-once') cutsLeft--;
  const part = f.data.subarray(start, Math.max(start, CUT));
  log(req, status, part.length);
  res.write(part, () => res.socket.destroy());
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://localhost');
  const parts = url.pathname.split('/').map(decodeURIComponent);
  if (req.method !== 'GET') return send(req, res, 405, {}, Buffer.alloc(0));
  // /api/models/{owner}/{name}/tree/{rev}
  if (parts[1] === 'api' && parts[2] === 'models' && parts[5] === 'tree') {
    const repo = `${parts[3]}/${parts[4]}`;
    if (!args.repo.includes(repo)) return send(req, res, 404, {}, Buffer.from('{"error":"Repository not found"}'));
    return serveTree(req, res, url, repo);
  }
  // /{owner}/{name}/resolve/{rev}/{path...}
  if (parts[3] === 'resolve') {
    const repo = `${parts[1]}/${parts[2]}`;
    const f = files.get(parts.slice(5).join('/'));
    if (!args.repo.includes(repo) || !f) return send(req, res, 404, {}, Buffer.from('Entry not found'));
    const p = parts.slice(5).join('/');
    if (isLfs(p)) return send(req, res, 302, { Location: `/cdn/${f.sha256}` }, Buffer.alloc(0));
    return serveBlob(req, res, f, false);
  }
  if (parts[1] === 'cdn') {
    const f = [...files.values()].find((x) => x.sha256 === parts[2]);
    if (!f) return send(req, res, 404, {}, Buffer.alloc(0));
    return serveBlob(req, res, f, true);
  }
  send(req, res, 404, {}, Buffer.from('not found'));
});

server.listen(0, '127.0.0.1', () => {
  fs.writeFileSync(path.join(args.state, 'port.tmp'), String(server.address().port));
  fs.renameSync(path.join(args.state, 'port.tmp'), path.join(args.state, 'port'));
});
