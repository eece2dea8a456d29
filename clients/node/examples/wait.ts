// Waiting for a permit instead of failing, as a batch job or a queue worker wants: WaitForPermit holds the call until
// the hit would pass, and an AbortSignal gives up the wait (nothing consumed) when the job is cancelled.
//
//   npm install && npm run build
//   npx tsc -p tsconfig.examples.json --noEmit false --outDir build-examples && node build-examples/wait.js [HOST:PORT]
//
// It uses the `edge` domain of deploy/config/edge.yaml: 10 requests per second for each client address.
import { randomBytes } from 'node:crypto';

import { Aborted, Client } from 'sluice-client';

const target = process.argv[2] ?? process.env.SLUICE_ADDR ?? '127.0.0.1:8081';
const sluice = new Client(target);
// A fresh address each run (documentation range), so that runs do not share a counter.
const address = { remote_address: `2001:db8::${randomBytes(2).toString('hex')}` };

try {
  let passed = 0;
  while ((await sluice.shouldRateLimit('edge', address)).allowed) passed++;
  console.log(`${passed} requests passed; waiting for the next one`);
  const permit = await sluice.waitForPermit('edge', address, { maxWaitMs: 2000 });
  console.log(`waited ${permit.waitedMs.toFixed(0)} ms: ${permit.decision.code}`);

  // A wait given up: the job is cancelled 100 ms in, long before the limit has room again.
  while ((await sluice.shouldRateLimit('edge', address)).allowed) passed++;
  const job = new AbortController();
  setTimeout(() => job.abort(new Error('job cancelled')), 100);
  try {
    await sluice.waitForPermit('edge', address, { maxWaitMs: 2000, signal: job.signal });
  } catch (error) {
    if (!(error instanceof Aborted)) throw error;
    console.log(`gave up waiting: ${error.message} (${String(error.cause)})`);
  }
  process.exitCode = permit.allowed ? 0 : 1;
} finally {
  sluice.close();
}
