// A cost budget around a slow call whose cost is known only afterwards (an LLM call and its tokens): the estimate is
// reserved before the call and the actual tokens settled after it; the difference goes back to the budget, and a
// call that throws gives its whole estimate back.
//
//   npm install && npm run build
//   npx tsc -p tsconfig.examples.json --noEmit false --outDir build-examples && node build-examples/budget.js [HOST:PORT]
//
// It uses the `llm` domain of deploy/config/llm.yaml: input and output tokens of model `large`, per user.
import { randomBytes, randomInt } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';

import { BudgetExceeded, Client, type Reservation } from 'sluice-client';

interface Reply {
  text: string;
  inputTokens: number;
  outputTokens: number;
}

// Stands in for the model: takes a while, and only then says how many tokens it used.
async function callTheModel(prompt: string, maxTokens: number): Promise<Reply> {
  await sleep(300);
  return { text: 'ok', inputTokens: prompt.length, outputTokens: 50 + randomInt(maxTokens - 50) };
}

const target = process.argv[2] ?? process.env.SLUICE_ADDR ?? '127.0.0.1:8081';
const sluice = new Client(target);
const descriptor = { model: 'large', user: `example-${randomBytes(4).toString('hex')}` };
const prompt = 'x'.repeat(1200);
let held: Reservation | undefined;

try {
  const reply = await sluice.withReservation(
    'llm',
    descriptor,
    { estimates: { input_tokens: prompt.length, output_tokens: 500 } },
    async (r) => {
      held = r;
      console.log(`reserved ${r.id} for ${(r.reserved.ttlMs ?? 0) / 1000} s`);
      const reply = await callTheModel(prompt, 500);
      r.actuals = { input_tokens: reply.inputTokens, output_tokens: reply.outputTokens };
      return reply;
    },
  );
  const settlement = held?.settled?.settlements[0];
  console.log(`model said '${reply.text}'; settled: estimate ${settlement?.estimate}, actual ${settlement?.actual}, refunded ${settlement?.refunded}`);
} catch (error) {
  if (!(error instanceof BudgetExceeded)) throw error;
  console.log(`over budget, the model was not called: ${error.message}`);
  process.exitCode = 2;
} finally {
  sluice.close();
}
