// A cost budget around a slow call whose cost is known only afterwards (an LLM call and its tokens): reserve an
// estimate with sluice.v1.RateLimiter/Reserve, do the work, then Settle the actual cost; the difference is given
// back (or charged). Concurrent reservations can never together spend more than the budget.
//
//   npm install
//   node budget.js [HOST:PORT]        (default: $SLUICE_ADDR, else 127.0.0.1:8081)
//
// It uses the `llm` domain of deploy/config/llm.yaml: input and output tokens of model `large`, per user.
'use strict';

const crypto = require('node:crypto');
const path = require('node:path');
const { promisify } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.SLUICE_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
const DEADLINE_MS = 2000;

function loadSluice() {
  const definition = protoLoader.loadSync('sluice/v1/sluice.proto', {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    // Costs are uint64: keep them exact as strings.
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).sluice.v1;
}

function deadline() {
  return { deadline: Date.now() + DEADLINE_MS };
}

// Stands in for the model: takes a while, and only then says how many tokens it produced.
function fakeModelCall() {
  return new Promise((resolve) => setTimeout(() => resolve(50 + crypto.randomInt(350)), 300));
}

async function main() {
  const target = process.argv[2] || process.env.SLUICE_ADDR || '127.0.0.1:8081';
  const sluice = loadSluice();
  const client = new sluice.RateLimiter(target, grpc.credentials.createInsecure());
  const reserve = promisify(client.Reserve.bind(client));
  const settle = promisify(client.Settle.bind(client));
  const user = `example-${crypto.randomBytes(4).toString('hex')}`;
  const call = {
    entries: [
      { key: 'model', value: 'large' },
      { key: 'user', value: user },
    ],
  };
  const promptTokens = 1200;
  try {
    const reserved = await reserve(
      { domain: 'llm', descriptors: [call], estimates: { input_tokens: promptTokens, output_tokens: 500 } },
      deadline(),
    );
    if (reserved.overall_code !== 'OK') {
      console.log('over budget: not calling the model');
      return 2;
    }
    console.log(`reserved ${reserved.reservation_id} for ${reserved.ttl.seconds}s`);
    const outputTokens = await fakeModelCall();
    const settled = await settle(
      {
        domain: 'llm',
        descriptors: [call],
        reservation_id: reserved.reservation_id,
        actuals: { input_tokens: promptTokens, output_tokens: outputTokens },
      },
      deadline(),
    );
    if (!settled.settled) {
      console.log('the reservation expired: it stays charged at its estimate');
      return 1;
    }
    const s = settled.settlements[0];
    console.log(`settled: estimate ${s.estimate}, actual ${s.actual}, refunded ${s.refunded}, charged ${s.charged}`);
    return 0;
  } catch (e) {
    console.error(`sluice at ${target}: ${e.message}`);
    return 1;
  } finally {
    client.close();
  }
}

main().then((code) => process.exit(code));
