// Shared by the node tests that drive mlxcel-server (tests/server, tests/soak): pass/fail
// counting, the servers they spawn on free loopback ports, and a watchdog that kills them all
// and fails the run when it takes too long; a server run to its exit, for flags that stop it.
import { spawn } from 'node:child_process';
import path from 'node:path';

export function harness({ bin, label, timeoutMs }) {
  let passed = 0, failed = 0;
  const children = [];
  const watchdog = setTimeout(() => {
    console.error(`${label}: timed out`);
    for (const c of children) c.kill('SIGKILL');
    process.exit(1);
  }, timeoutMs);

  // Records one check; a failure is printed and counted, and the run goes on.
  function check(cond, what) {
    if (cond) passed++;
    else {
      failed++;
      console.error(`CHECK failed: ${what}`);
    }
  }

  // Counts an exception that ended a part of the run.
  function fail(e) {
    failed++;
    console.error(e);
  }

  // Tracks a process the run spawned itself, so that the watchdog and finish() kill it.
  function own(child) {
    children.push(child);
    return child;
  }

  // Starts mlxcel-server on a free port; resolves once its startup line names the port with
  // { child, port, url, log (its stderr so far), exited (null while it runs) }. `shell`: a
  // script run by sh instead, with the server's path as $0 and `args` after it, for arguments
  // that must hold bytes node cannot pass (it sends strings as UTF-8).
  function startServer(args, env = {}, { shell } = {}) {
    const server = path.join(bin, 'mlxcel-server');
    const [command, argv] = shell ? ['/bin/sh', ['-c', shell, server, ...args]] : [server, ['--port', '0', '-t', '2', ...args]];
    return new Promise((resolve, reject) => {
      const child = own(spawn(command, argv, { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] }));
      const s = { child, exited: null, log: '' };
      child.stderr.on('data', (d) => {
        s.log += d;
        const m = s.log.match(/listening on http:\/\/([\d.]+):(\d+)/);
        if (m && !s.port) {
          s.port = Number(m[2]);
          s.url = `http://${m[1]}:${m[2]}`;
          resolve(s);
        }
      });
      child.on('exit', (code, sig) => {
        s.exited = `${code ?? sig}`;
        reject(new Error(`server exited ${code ?? sig}: ${s.log}`));
      });
      child.on('error', reject);
    });
  }

  // SIGTERM; resolves with the exit code (or how it had already ended).
  function stopServer(s) {
    return new Promise((resolve) => {
      if (s.exited !== null) return resolve(s.exited);
      s.child.removeAllListeners('exit');
      s.child.on('exit', (code) => resolve(code));
      s.child.kill('SIGTERM');
    });
  }

  // Runs mlxcel-server with args to its exit (killed after timeoutMs); resolves with
  // { code (the exit code, or the signal), log (its stderr) }: for flags that must not start it.
  function runToExit(args, env = {}, timeoutMs = 20_000) {
    return new Promise((resolve) => {
      const child = own(spawn(path.join(bin, 'mlxcel-server'), ['--port', '0', ...args],
        { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] }));
      let log = '';
      child.stderr.on('data', (d) => (log += d));
      const t = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      child.on('exit', (code, sig) => {
        clearTimeout(t);
        resolve({ code: code ?? sig, log });
      });
    });
  }

  // Kills what is left, prints "N passed, N failed" (after `prefix`) and exits accordingly.
  function finish(prefix = '') {
    for (const c of children) c.kill('SIGKILL');
    clearTimeout(watchdog);
    console.log(`${prefix}${passed} passed, ${failed} failed`);
    process.exit(failed ? 1 : 0);
  }

  return { check, fail, own, startServer, stopServer, runToExit, finish };
}
