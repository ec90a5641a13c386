// A raw HTTP/1.1 client over net, shared by the node tests that need what fetch hides: every
// request on its own connection, bytes sent as given (malformed, trickled, half-closed), the
// local address chosen, and the response read until the server closes.
import net from 'node:net';

function decodeChunked(buf) {
  const out = [];
  let i = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', i);
    if (eol < 0) return null;
    const n = parseInt(buf.subarray(i, eol).toString(), 16);
    if (Number.isNaN(n)) return null;
    if (n === 0) return Buffer.concat(out);
    out.push(buf.subarray(eol + 2, eol + 2 + n));
    i = eol + 2 + n + 2;
  }
}

// { status, headers, body, complete } of a raw response, or null when it has no status line.
// Interim 1xx responses before it are read past, as HTTP/1.1 clients must; `interim` counts
// them.
export function parseResponse(raw) {
  let interim = 0;
  for (;;) {
    const m = raw.toString('latin1', 0, 16).match(/^HTTP\/1\.1 1\d\d /);
    const end = raw.indexOf('\r\n\r\n');
    if (!m || end < 0) break;
    raw = raw.subarray(end + 4);
    interim++;
  }
  const end = raw.indexOf('\r\n\r\n');
  if (end < 0) return null;
  const lines = raw.subarray(0, end).toString('latin1').split('\r\n');
  const m = lines[0].match(/^HTTP\/1\.[01] (\d{3})/);
  if (!m) return null;
  const headers = {};
  for (const l of lines.slice(1)) {
    const k = l.indexOf(':');
    headers[l.slice(0, k).trim().toLowerCase()] = l.slice(k + 1).trim();
  }
  let body = raw.subarray(end + 4);
  if (/chunked/i.test(headers['transfer-encoding'] ?? '')) body = decodeChunked(body);
  return { status: Number(m[1]), headers, body: body?.toString('utf8') ?? null, complete: body !== null, interim };
}

// key: the bearer key every request carries unless its headers say otherwise (null drops a
// header); timeoutMs: how long exchange waits by default.
export function rawHttp({ key, timeoutMs: defaultTimeoutMs }) {
  function buildRequest(method, route, body, extra = {}) {
    const b = body === undefined ? Buffer.alloc(0) : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const headers = { Host: '127.0.0.1', Connection: 'close', ...(key ? { Authorization: `Bearer ${key}` } : {}), ...extra };
    // defaults only for the headers the caller did not name (null: leave it out)
    if (method === 'POST') {
      if (!('Content-Type' in headers)) headers['Content-Type'] = 'application/json';
      if (!('Content-Length' in headers)) headers['Content-Length'] = String(b.length);
    }
    for (const k of Object.keys(headers)) if (headers[k] === null) delete headers[k];
    const head = `${method} ${route} HTTP/1.1\r\n` + Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('') + '\r\n';
    return Buffer.concat([Buffer.from(head, 'latin1'), b]);
  }

  // Sends `data` (a Buffer, or an array of Buffers written with `gapMs` between them) and reads
  // until the server closes. `abortMs`: the client hangs up after that long; `halfClose`: the
  // client shuts down its sending side once everything is written. Resolves with
  // { status, headers, body, complete } or { error } or { aborted }, plus the time taken.
  function exchange(port, data, { abortMs, gapMs = 0, localAddress, halfClose = false, timeoutMs = defaultTimeoutMs } = {}) {
    return new Promise((resolve) => {
      const t0 = Date.now();
      const sock = net.connect({ host: '127.0.0.1', port, localAddress, allowHalfOpen: true });
      const parts = [];
      let done = false;
      const finish = (r) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        clearTimeout(abortTimer);
        sock.destroy();
        resolve({ ...r, ms: Date.now() - t0 });
      };
      const timer = setTimeout(() => finish({ error: 'client timeout' }), timeoutMs);
      const abortTimer = abortMs !== undefined ? setTimeout(() => finish({ aborted: true }), abortMs) : null;
      sock.on('connect', async () => {
        const pieces = Array.isArray(data) ? data : [data];
        for (const p of pieces) {
          if (done || sock.destroyed) return;
          sock.write(p);
          if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
        }
        if (halfClose && !done) sock.end();
      });
      sock.on('data', (d) => parts.push(d));
      sock.on('error', (e) => {
        const r = parseResponse(Buffer.concat(parts));
        finish(r && r.complete ? r : { error: e.code ?? String(e) });
      });
      sock.on('end', () => {
        const r = parseResponse(Buffer.concat(parts));
        finish(r ?? { error: parts.length ? 'unparsable response' : 'closed without a response' });
      });
    });
  }

  return { buildRequest, exchange };
}
