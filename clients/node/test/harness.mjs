// Starts a real sluice for the tests: the binary from $SLUICE_BIN (else the repository's target/debug/sluice), its
// in-memory store, a config directory written for the test, gRPC and HTTP on free ports of 127.0.0.1. Ready once
// /healthz answers and the gRPC port accepts connections; stopped with SIGTERM by its PID, and it must exit 0.
import { spawn } from 'node:child_process';
import { accessSync, constants, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, writeFileSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const STARTUP_TIMEOUT_MS = 15_000;
const SHUTDOWN_TIMEOUT_MS = 5_000;

export function sluiceBin() {
  const path = process.env.SLUICE_BIN ?? join(REPO, 'target', 'debug', 'sluice');
  try {
    accessSync(path, constants.X_OK);
  } catch {
    throw new Error(`sluice binary not found at ${path}: run \`cargo build\` first or set SLUICE_BIN`);
  }
  return path;
}

/** A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it). */
export function freePort() {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function healthy(httpPort) {
  try {
    const response = await fetch(`http://127.0.0.1:${httpPort}/healthz`, { signal: AbortSignal.timeout(1000) });
    return response.status === 200;
  } catch {
    return false;
  }
}

function accepts(port) {
  return new Promise((done) => {
    const socket = createConnection({ host: '127.0.0.1', port }, () => {
      socket.destroy();
      done(true);
    });
    socket.once('error', () => done(false));
  });
}

/** One `sluice serve` process. `files` maps a config file's name to its YAML; `config` is a directory instead. */
export class Sluice {
  static async start({ files, config, args = [] } = {}) {
    for (let attempt = 1; ; attempt++) {
      const server = new Sluice(files, config, args, await freePort(), await freePort());
      try {
        await server.waitHealthy();
        return server;
      } catch (error) {
        await server.stop();
        // A port taken between its choice and the bind: try fresh ones.
        if (attempt >= 3 || server.exitCode === null) throw error;
      }
    }
  }

  constructor(files, config, args, grpcPort, httpPort) {
    this.workdir = mkdtempSync(join(tmpdir(), 'sluice-node-'));
    if (files !== undefined) {
      config = join(this.workdir, 'config');
      mkdirSync(config);
      for (const [name, text] of Object.entries(files)) writeFileSync(join(config, name), text);
    }
    this.grpcPort = grpcPort;
    this.httpPort = httpPort;
    this.target = `127.0.0.1:${grpcPort}`;
    this.logPath = join(this.workdir, 'sluice.log');
    const log = openSync(this.logPath, 'a');
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLUICE_')));
    this.proc = spawn(
      sluiceBin(),
      ['serve', '--config', config, '--grpc-addr', this.target, '--http-addr', `127.0.0.1:${httpPort}`, ...args],
      { stdio: ['ignore', log, log], env: { ...env, RUST_LOG: env.RUST_LOG ?? 'info', NO_COLOR: '1' } },
    );
    closeSync(log);
    this.exitCode = null;
    this.exited = new Promise((done) =>
      this.proc.once('exit', (code, signal) => {
        this.exitCode = code ?? signal;
        done(this.exitCode);
      }),
    );
  }

  get output() {
    try {
      return readFileSync(this.logPath, 'utf8').slice(-4000) || '<no output>';
    } catch {
      return '<no output>';
    }
  }

  async waitHealthy() {
    const deadline = Date.now() + STARTUP_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (this.exitCode !== null) throw new Error(`sluice exited with ${this.exitCode} before it was healthy:\n${this.output}`);
      if ((await healthy(this.httpPort)) && (await accepts(this.grpcPort))) return;
      await sleep(50);
    }
    throw new Error(`timed out waiting for sluice's /healthz on port ${this.httpPort}:\n${this.output}`);
  }

  /** SIGTERM by PID, then the exit code (SIGKILL after a few seconds, answering null). */
  async stop() {
    if (this.exitCode !== null) return this.exitCode;
    this.proc.kill('SIGTERM');
    const timer = sleep(SHUTDOWN_TIMEOUT_MS).then(() => 'timeout');
    if ((await Promise.race([this.exited, timer])) === 'timeout') {
      this.proc.kill('SIGKILL');
      await this.exited;
      return null;
    }
    return this.exitCode;
  }
}
