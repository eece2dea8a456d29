// A sluice client: asks for decisions with sluice.v1.RateLimiter/ShouldRateLimit until a limit is reached, then
// asks GetRemaining how long until the next hit would pass.
//
//   npm install
//   node client.js [HOST:PORT]        (default: $SLUICE_ADDR, else 127.0.0.1:8081)
//
// The protos are read from ../../proto (this repository's), or from $SLUICE_PROTO_DIR.
//
// It uses the `edge` domain of deploy/config/edge.yaml: 3 requests per 30 seconds for each user under /api/.
'use strict';

const crypto = require('node:crypto');
const path = require('node:path');
const { promisify } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// The protos are read at run time from the repository, so the client always matches the server's API.
// google/protobuf/*.proto are not in proto/: proto-loader resolves those imports from the copies bundled with
// protobufjs, so only the repository's directory is needed here.
const PROTO_DIR = process.env.SLUICE_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');

// Every call gets a deadline: a rate limit decision that arrives late is useless to the caller.
const DEADLINE_MS = 2000;

function loadSluice() {
  const definition = protoLoader.loadSync('sluice/v1/sluice.proto', {
    includeDirs: [PROTO_DIR],
    // Field names as in the .proto (limit_remaining, not limitRemaining), like every other gRPC language.
    keepCase: true,
    // uint64 fields (remaining, Duration.seconds) can exceed 2^53: keep them exact as strings.
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).sluice.v1;
}

function seconds(duration) {
  return Number(duration.seconds) + duration.nanos / 1e9;
}

function deadline() {
  return { deadline: Date.now() + DEADLINE_MS };
}

async function main() {
  const target = process.argv[2] || process.env.SLUICE_ADDR || '127.0.0.1:8081';
  const sluice = loadSluice();
  const client = new sluice.RateLimiter(target, grpc.credentials.createInsecure());
  const shouldRateLimit = promisify(client.ShouldRateLimit.bind(client));
  const getRemaining = promisify(client.GetRemaining.bind(client));

  // A fresh user each run, so that a second run within the window does not start over the limit.
  const user = `example-${crypto.randomBytes(4).toString('hex')}`;
  const apiCall = {
    entries: [
      { key: 'path', value: '/api/orders' },
      { key: 'user', value: user },
    ],
  };

  try {
    for (let attempt = 1; attempt <= 4; attempt++) {
      const response = await shouldRateLimit({ domain: 'edge', descriptors: [apiCall] }, deadline());
      const status = response.statuses[0];
      console.log(
        `request ${attempt}: ${response.overall_code}, ` +
          `${status.limit_remaining} of ${status.current_limit.requests_per_unit} left, ` +
          `window resets in ${seconds(status.duration_until_reset).toFixed(1)}s`,
      );
    }

    // Read-only: asking does not consume a hit.
    const remaining = await getRemaining({ domain: 'edge', descriptors: [apiCall] }, deadline());
    for (const d of remaining.descriptors) {
      if (!d.matched) {
        console.log('no rule matches this descriptor');
      } else if (d.unlimited) {
        console.log('unlimited');
      } else {
        const unit = d.limit.unit.toLowerCase();
        const window = d.limit.unit_multiplier === 1 ? unit : `${d.limit.unit_multiplier} ${unit}s`;
        console.log(
          `remaining: ${d.remaining} of ${d.limit.requests_per_unit} per ${window} (${d.limit.algorithm}), ` +
            `next hit allowed in ${seconds(d.retry_after).toFixed(1)}s`,
        );
      }
    }
  } finally {
    client.close();
  }
}

main().catch((err) => {
  // UNAVAILABLE here usually means nothing listens at the address, DEADLINE_EXCEEDED an overloaded server.
  console.error(`error: ${err.message}`);
  process.exitCode = 1;
});
