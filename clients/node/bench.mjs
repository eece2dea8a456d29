// Calls per second of the TypeScript client: CONCURRENCY ShouldRateLimit calls kept in flight on one client for
// SECONDS, against a sluice this script starts (in memory, on free ports) with one unlimited-enough rule, so every
// call is decided and counted. Prints the rate, the latency percentiles and what sluice answered.
//
//   npm run build
//   SLUICE_BIN=../../target/release/sluice node bench.mjs [CONCURRENCY=64] [SECONDS=5]
//
// Or against a sluice already running, on its own config: SLUICE_ADDR=host:port SLUICE_DOMAIN=edge node bench.mjs
import { Client } from 'sluice-client';

import { Sluice } from './test/harness.mjs';

const concurrency = Number(process.argv[2] ?? 64);
const seconds = Number(process.argv[3] ?? 5);
if (!Number.isInteger(concurrency) || concurrency < 1) throw new Error(`concurrency: '${process.argv[2]}' is not a whole number over 0`);
if (!(seconds > 0)) throw new Error(`seconds: '${process.argv[3]}' is not a duration`);

const CONFIG = `\
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`;

const server = process.env.SLUICE_ADDR ? undefined : await Sluice.start({ files: { 'bench.yaml': CONFIG } });
const target = process.env.SLUICE_ADDR ?? server.target;
const domain = process.env.SLUICE_DOMAIN ?? 'bench';
const client = new Client(target);
const users = Array.from({ length: 1000 }, (_, i) => ({ user: `u${i}` }));
const latencies = [];
const codes = new Map();
let calls = 0;
let failures = 0;

async function worker(id, until) {
  for (let i = id; performance.now() < until; i += concurrency) {
    const started = performance.now();
    try {
      const decision = await client.shouldRateLimit(domain, users[i % users.length]);
      codes.set(decision.code, (codes.get(decision.code) ?? 0) + 1);
      calls += 1;
      latencies.push(performance.now() - started);
    } catch (error) {
      failures += 1;
      if (failures === 1) console.error(`first failure: ${error.message}`);
    }
  }
}

try {
  // A second of warm-up: the connection, the JIT, and the server's first counters.
  await Promise.all(Array.from({ length: concurrency }, (_, id) => worker(id, performance.now() + 1000)));
  calls = 0;
  failures = 0;
  latencies.length = 0;
  codes.clear();
  const started = performance.now();
  const cpu = process.cpuUsage();
  await Promise.all(Array.from({ length: concurrency }, (_, id) => worker(id, started + seconds * 1000)));
  const elapsed = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  const clientCpu = (used.user + used.system) / 1e6;
  latencies.sort((a, b) => a - b);
  const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]?.toFixed(2);
  console.log(
    `${(calls / elapsed).toFixed(0)} calls/s: ${calls} ShouldRateLimit calls in ${elapsed.toFixed(2)} s, ` +
      `${concurrency} in flight, ${failures} failed; latency ms p50 ${at(0.5)} p99 ${at(0.99)}; ` +
      `answers ${JSON.stringify(Object.fromEntries(codes))}; ` +
      `client CPU ${clientCpu.toFixed(2)} s (${((clientCpu / calls) * 1e6).toFixed(0)} µs a call)`,
  );
} finally {
  client.close();
  if (server !== undefined) await server.stop();
}
