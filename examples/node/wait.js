// Waiting for a permit instead of failing: sluice.v1.RateLimiter/WaitForPermit holds the call until the hit would
// pass (or max_wait runs out), as a batch job or a queue worker wants.
//
//   npm install
//   node wait.js [HOST:PORT]        (default: $SLUICE_ADDR, else 127.0.0.1:8081)
//
// It uses the `edge` domain of deploy/config/edge.yaml: 10 requests per second for each client address. It spends
// them, sees the eleventh refused, then waits for the next one. The protos are read from ../../proto.
'use strict';

const crypto = require('node:crypto');
const path = require('node:path');
const { promisify } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.SLUICE_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
// Every call gets a deadline; a waiting call's is its longest wait and a little more.
const DEADLINE_MS = 2000;
const MAX_WAIT_S = 2;

function loadSluice() {
  const definition = protoLoader.loadSync('sluice/v1/sluice.proto', {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).sluice.v1;
}

async function main() {
  const target = process.argv[2] || process.env.SLUICE_ADDR || '127.0.0.1:8081';
  const sluice = loadSluice();
  const client = new sluice.RateLimiter(target, grpc.credentials.createInsecure());
  const shouldRateLimit = promisify(client.ShouldRateLimit.bind(client));
  const waitForPermit = promisify(client.WaitForPermit.bind(client));
  // A fresh address each run (documentation range), so that runs do not share a counter.
  const address = `2001:db8::${crypto.randomBytes(2).toString('hex')}:${crypto.randomBytes(2).toString('hex')}`;
  const descriptors = [{ entries: [{ key: 'remote_address', value: address }] }];
  try {
    let passed = 0;
    let response;
    for (;;) {
      response = await shouldRateLimit({ domain: 'edge', descriptors }, { deadline: Date.now() + DEADLINE_MS });
      if (response.overall_code !== 'OK') break;
      passed++;
    }
    console.log(`${passed} requests passed, the next is ${response.overall_code}`);
    // Held until the limit has room again (a second window here), at most MAX_WAIT_S; a caller that gives up (its
    // deadline, a cancel) consumes nothing.
    const waited = await waitForPermit(
      { domain: 'edge', descriptors, max_wait: { seconds: MAX_WAIT_S, nanos: 0 } },
      { deadline: Date.now() + MAX_WAIT_S * 1000 + DEADLINE_MS },
    );
    const seconds = Number(waited.waited.seconds) + waited.waited.nanos / 1e9;
    console.log(`waited ${seconds.toFixed(3)}s for a permit: ${waited.decision.overall_code}`);
  } finally {
    client.close();
  }
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exitCode = 1;
});
