// The examples and the docs page's budgeted LLM call: type-checked under `tsc --strict`, compiled, and run against a
// real sluice on deploy/config (the files the examples are written for).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { REPO, Sluice } from './harness.mjs';

const PACKAGE = dirname(dirname(fileURLToPath(import.meta.url)));
const TSC = join(PACKAGE, 'node_modules', 'typescript', 'bin', 'tsc');
const run = promisify(execFile);

/** Runs a program to its end, answering its exit code and output (a failing exit is an answer, not a throw). */
async function runNode(args, env = {}) {
  try {
    const { stdout, stderr } = await run(process.execPath, args, { cwd: PACKAGE, env: { ...process.env, ...env }, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    return { code: error.code, stdout: error.stdout ?? '', stderr: error.stderr ?? String(error) };
  }
}

// Compiled output lives inside the package, where `import 'sluice-client'` resolves to the package itself.
const build = mkdtempSync(join(PACKAGE, 'test', '.build-'));
let sluice;

before(async () => {
  sluice = await Sluice.start({ config: join(REPO, 'deploy', 'config') });
});

after(async () => {
  rmSync(build, { recursive: true, force: true });
  if (sluice !== undefined) assert.equal(await sluice.stop(), 0, `sluice did not exit cleanly:\n${sluice.output}`);
});

test('the examples pass tsc --strict --noEmit', async () => {
  const out = await runNode([TSC, '-p', 'tsconfig.examples.json', '--strict', '--noEmit']);
  assert.equal(out.code, 0, out.stdout + out.stderr);
});

test('tsc --strict refuses a call the protos do not allow', async () => {
  // The check above can fail: a misspelt option and a wrong answer field are compile errors.
  const dir = mkdtempSync(join(build, 'wrong-'));
  writeFileSync(
    join(dir, 'wrong.ts'),
    "import { Client } from 'sluice-client';\n" +
      "const c = new Client();\n" +
      "const d = await c.shouldRateLimit('edge', { user: 'a' }, { hitAddend: 2 });\n" +
      'console.log(d.statuses[0]?.remainingHits);\n',
  );
  const out = await runNode([TSC, '--strict', '--noEmit', '--module', 'NodeNext', '--moduleResolution', 'NodeNext', '--target', 'ES2022', '--types', 'node', '--skipLibCheck', join(dir, 'wrong.ts')]);
  assert.notEqual(out.code, 0);
  assert.match(out.stdout, /hitAddend/);
  assert.match(out.stdout, /remainingHits/);
});

test('the examples run against sluice', async () => {
  const out = await runNode([TSC, '-p', 'tsconfig.examples.json', '--noEmit', 'false', '--rootDir', 'examples', '--outDir', join(build, 'examples')]);
  assert.equal(out.code, 0, out.stdout + out.stderr);
  // How many pass before the refusal is the limit's count, more when the window turns during the loop (a second
  // ends within the ten calls of `wait` now and then on a busy machine).
  const expected = {
    decide: /^\d+ requests passed, the next is OVER_LIMIT \(limit 3\)\nretry after \d+\.\d s$/m,
    budget: /^reserved [0-9a-f]+ for 300 s\nmodel said 'ok'; settled: estimate 12800, actual \d+, refunded \d+$/m,
    wait: /^\d+ requests passed; waiting for the next one\nwaited \d+ ms: OK$/m,
  };
  for (const [name, pattern] of Object.entries(expected)) {
    const ran = await runNode([join(build, 'examples', `${name}.js`), sluice.target]);
    assert.equal(ran.code, 0, `${name}: ${ran.stdout}${ran.stderr}`);
    assert.match(ran.stdout, pattern, name);
  }
});

test("the docs page's budgeted LLM call type-checks and runs as printed", async () => {
  const page = readFileSync(join(REPO, 'docs', 'src', 'client-node.md'), 'utf8');
  const example = [...page.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]).find((b) => b.includes('withReservation('));
  assert.ok(example, 'no ts block with withReservation( in docs/src/client-node.md');
  assert.ok(example.trim().split('\n').length <= 10, example);
  // What the page leaves to the reader: a model that says how many tokens it used, a prompt, a user. Then what the
  // call did: whether the model ran, and whether the output tokens not used came back (10 000 a minute, of which a
  // settled call spent 100: 9 900 fit only when the 400 held beyond that were given back).
  const prelude = `
let calls = 0;
const llm = {
  async generate(prompt: string, options: { maxTokens: number }) {
    calls += 1;
    return { text: 'ok', inputTokens: prompt.length, outputTokens: options.maxTokens / 5 };
  },
};
const prompt = 'x'.repeat(Number(process.env.PROMPT_TOKENS));
const userId = process.env.USER_ID ?? '';
const countTokens = (text: string): number => text.length;
`;
  const epilogue = `
const rest = await sluice.check('llm', { model: 'large', user: userId }, { costs: { output_tokens: 9900 } });
console.log(JSON.stringify({ calls, reply: reply?.text ?? null, refunded: rest.allowed }));
sluice.close();
`;
  const dir = mkdtempSync(join(build, 'docs-'));
  writeFileSync(join(dir, 'docs.ts'), prelude + example.replace("'127.0.0.1:8081'", `'${sluice.target}'`) + epilogue);
  const compiled = await runNode([TSC, '--strict', '--module', 'NodeNext', '--moduleResolution', 'NodeNext', '--target', 'ES2022', '--types', 'node', '--skipLibCheck', '--rootDir', dir, '--outDir', dir, join(dir, 'docs.ts')]);
  assert.equal(compiled.code, 0, compiled.stdout + compiled.stderr);
  const user = `docs-${randomBytes(4).toString('hex')}`;
  const fits = await runNode([join(dir, 'docs.js')], { PROMPT_TOKENS: '1200', USER_ID: user });
  assert.equal(fits.code, 0, fits.stdout + fits.stderr);
  assert.deepEqual(JSON.parse(fits.stdout), { calls: 1, reply: 'ok', refunded: true });
  // Over the 50 000 input tokens a minute: the model is not called.
  const over = await runNode([join(dir, 'docs.js')], { PROMPT_TOKENS: '60000', USER_ID: `${user}-over` });
  assert.equal(over.code, 0, over.stdout + over.stderr);
  assert.deepEqual(JSON.parse(over.stdout), { calls: 0, reply: null, refunded: true });
});
