// Decisions until a limit is reached, then how long until the next hit would pass.
//
//   npm install && npm run build
//   npx tsc -p tsconfig.examples.json --noEmit false --outDir build-examples && node build-examples/decide.js [HOST:PORT]
//
// It uses the `edge` domain of deploy/config/edge.yaml: 3 requests per 30 seconds for each user under /api/.
import { randomBytes } from 'node:crypto';

import { Client, SluiceError, type Decision } from 'sluice-client';

const target = process.argv[2] ?? process.env.SLUICE_ADDR ?? '127.0.0.1:8081';
const sluice = new Client(target, { timeoutMs: 2000 });
// Entries in order, as pairs: the rule is path=/api/*, then user under it.
const request: [string, string][] = [
  ['path', '/api/orders'],
  ['user', `example-${randomBytes(4).toString('hex')}`],
];

try {
  let passed = 0;
  let decision: Decision;
  for (;;) {
    decision = await sluice.shouldRateLimit('edge', [request]);
    if (!decision.allowed) break;
    passed++;
  }
  const [left] = await sluice.getRemaining('edge', [request]);
  const status = decision.statuses[0];
  console.log(`${passed} requests passed, the next is ${decision.code} (limit ${status?.limit?.requestsPerUnit})`);
  console.log(`retry after ${((left?.retryAfterMs ?? 0) / 1000).toFixed(1)} s`);
} catch (error) {
  if (!(error instanceof SluiceError)) throw error;
  console.error(`sluice at ${target}: ${error.message}`);
  process.exitCode = 1;
} finally {
  sluice.close();
}
