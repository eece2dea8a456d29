// The TypeScript client (built into dist/) against a real sluice process: each call's answer checked against what
// the server must have counted.
//
// - Decisions from both services on the same counters, GetRemaining's exact answers (and that it consumes nothing).
// - WaitForPermit: a wait that ends in a permit, one that cannot end in time, a timeout shorter than the wait
//   (DeadlineExceeded) and an AbortSignal that gives up the wait (Aborted): nothing consumed in the last three.
// - Check and Report; reservations: settled at the actual cost, at the estimate, refunded when the callback throws
//   (its error rethrown as it was), left to expire, refused as BudgetExceeded, concurrent ones against one budget.
// - A refund that cannot be sent, a server that is down, and each status a caller meets as its error class.
// - Run-time lists and top offenders.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import {
  Aborted,
  BudgetExceeded,
  Client,
  DeadlineExceeded,
  InvalidArgument,
  NotFound,
  RpcError,
  SluiceError,
  Unauthenticated,
  Unavailable,
  refundErrorOf,
} from 'sluice-client';

import { Sluice, freePort } from './harness.mjs';

const TOKEN = 'client-node-token';
const HOUR_MS = 3_600_000;

// Hour-long fixed windows, so no window ends during a test; `tick` is the one per-second limit, for a wait that ends.
export const CONFIG = `\
domain: shop
lists:
  - name: blocked
    key: remote_address
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3, name: user_per_hour}
  - key: tick
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 1000, name: tokens_per_hour}
`;

/** A descriptor value no other test has used: every test starts from a full allowance on the shared server. */
const fresh = (prefix) => `${prefix}-${randomBytes(4).toString('hex')}`;

let sluice;
let client;

before(async () => {
  sluice = await Sluice.start({ files: { 'shop.yaml': CONFIG }, args: ['--admin-token', TOKEN] });
  client = new Client(sluice.target, { adminToken: TOKEN });
});

after(async () => {
  client?.close();
  if (sluice !== undefined) assert.equal(await sluice.stop(), 0, `sluice did not exit cleanly:\n${sluice.output}`);
});

const tokensLeft = async (key) => (await client.getRemaining('shop', key))[0].remaining;

describe('decisions', () => {
  test('both services count on the same counter', async () => {
    const user = { user: fresh('u') };
    const answers = [
      await client.shouldRateLimit('shop', user),
      await client.shouldRateLimitEnvoy('shop', [user]),
      await client.shouldRateLimit('shop', [Object.entries(user)]),
      await client.shouldRateLimitEnvoy('shop', user),
    ];
    assert.deepEqual(answers.map((a) => a.code), ['OK', 'OK', 'OK', 'OVER_LIMIT']);
    assert.deepEqual(answers.map((a) => a.allowed), [true, true, true, false]);
    assert.deepEqual(answers.map((a) => a.statuses[0].remaining), [2, 1, 0, 0]);
    const status = answers[3].statuses[0];
    assert.deepEqual(status.limit, { name: 'user_per_hour', requestsPerUnit: 3, unit: 'HOUR' });
    assert.ok(status.resetAfterMs > 0 && status.resetAfterMs <= HOUR_MS, `${status.resetAfterMs}`);
    assert.equal(answers[3].raw.overall_code, 'OVER_LIMIT');
  });

  test('hitsAddend counts that many', async () => {
    const user = { user: fresh('u') };
    assert.equal((await client.shouldRateLimit('shop', user, { hitsAddend: 2 })).statuses[0].remaining, 1);
    assert.equal((await client.shouldRateLimit('shop', user, { hitsAddend: 2n })).allowed, false);
    assert.equal((await client.shouldRateLimit('shop', user)).statuses[0].remaining, 0);
  });

  test('GetRemaining is exact and consumes nothing', async () => {
    const user = { user: fresh('u') };
    await client.shouldRateLimit('shop', user);
    await client.shouldRateLimit('shop', user);
    for (let i = 0; i < 3; i++) {
      const [left, unmatched] = await client.getRemaining('shop', [user, { colour: 'blue' }]);
      assert.ok(left.matched && !left.unlimited && !left.never);
      assert.equal(left.remaining, 1);
      assert.deepEqual(left.limit, {
        name: 'user_per_hour',
        requestsPerUnit: 3,
        unit: 'HOUR',
        unitMultiplier: 1,
        algorithm: 'fixed_window',
        burst: 3,
      });
      assert.equal(left.retryAfterMs, 0);
      assert.ok(left.resetAfterMs > 0 && left.resetAfterMs <= HOUR_MS);
      assert.ok(!unmatched.matched && unmatched.limit === null);
    }
    // A cost of 2 needs the next window: its retry time is the window's reset; 4 never fits in 3.
    const [two] = await client.getRemaining('shop', user, { cost: 2 });
    assert.ok(two.retryAfterMs > 0 && Math.abs(two.retryAfterMs - two.resetAfterMs) < 1000, JSON.stringify(two));
    const [four] = await client.getRemaining('shop', user, { cost: 4 });
    assert.ok(four.never && four.retryAfterMs === null);
    assert.equal((await client.shouldRateLimit('shop', user)).statuses[0].remaining, 0);
  });
});

describe('waiting for a permit', () => {
  test('a wait ends in the next window', async () => {
    const tick = { tick: fresh('t') };
    // Spend the second's one hit (a second try when the first lands at the very end of a second).
    let refused = false;
    for (let i = 0; i < 3 && !refused; i++) refused = !(await client.shouldRateLimit('shop', tick)).allowed;
    assert.ok(refused);
    const started = performance.now();
    const permit = await client.waitForPermit('shop', tick, { maxWaitMs: 2000 });
    assert.ok(permit.allowed, JSON.stringify(permit));
    assert.ok(permit.waitedMs <= 1000, `${permit.waitedMs}`);
    assert.ok(performance.now() - started >= permit.waitedMs - 1);
    assert.equal((await client.shouldRateLimit('shop', tick)).allowed, false, 'the permit counted the new second hit');
  });

  test('a wait that cannot end in time answers at once, consuming nothing', async () => {
    const user = { user: fresh('u') };
    await client.shouldRateLimit('shop', user, { hitsAddend: 2 });
    const started = performance.now();
    const permit = await client.waitForPermit('shop', user, { maxWaitMs: 2000, hitsAddend: 2 });
    assert.ok(performance.now() - started < 1000);
    assert.equal(permit.allowed, false);
    assert.equal(permit.decision.code, 'OVER_LIMIT');
    assert.equal(await tokensLeft(user), 1);
  });

  test('a timeout shorter than the wait throws DeadlineExceeded, consuming nothing', async () => {
    const user = { user: fresh('u') };
    await client.shouldRateLimit('shop', user, { hitsAddend: 2 });
    // 2 more fit only in the next window, within the hour the call may wait but after the 300 ms it may last.
    const error = await client
      .waitForPermit('shop', user, { maxWaitMs: HOUR_MS, hitsAddend: 2, timeoutMs: 300 })
      .then(() => assert.fail('the wait passed'), (e) => e);
    assert.ok(error instanceof DeadlineExceeded, String(error));
    assert.ok(error instanceof RpcError && error instanceof SluiceError);
    assert.equal(error.method, 'WaitForPermit');
    assert.equal(await tokensLeft(user), 1, 'the abandoned wait consumed nothing');
  });

  test('an AbortSignal gives up the wait, consuming nothing', async () => {
    const user = { user: fresh('u') };
    await client.shouldRateLimit('shop', user, { hitsAddend: 2 });
    const controller = new AbortController();
    const reason = new Error('the job was cancelled');
    setTimeout(() => controller.abort(reason), 200);
    const started = performance.now();
    const error = await client
      .waitForPermit('shop', user, { maxWaitMs: HOUR_MS, hitsAddend: 2, signal: controller.signal })
      .then(() => assert.fail('the wait passed'), (e) => e);
    const elapsed = performance.now() - started;
    assert.ok(error instanceof Aborted, String(error));
    assert.ok(error instanceof SluiceError);
    assert.equal(error.name, 'AbortError');
    assert.equal(error.cause, reason);
    assert.equal(error.method, 'WaitForPermit');
    assert.ok(elapsed >= 150 && elapsed < 2000, `gave up after ${elapsed} ms`);
    assert.equal(await tokensLeft(user), 1, 'the abandoned wait consumed nothing');
    // The server let the waiter go: waits on the same descriptors are served in order, and one that fits passes at
    // once instead of queueing behind the abandoned one.
    const next = performance.now();
    assert.ok((await client.waitForPermit('shop', user, { maxWaitMs: 5000 })).allowed);
    assert.ok(performance.now() - next < 1000);
  });

  test('a signal aborted already sends nothing', async () => {
    const user = { user: fresh('u') };
    const error = await client
      .shouldRateLimit('shop', user, { signal: AbortSignal.abort() })
      .then(() => assert.fail('the call was sent'), (e) => e);
    assert.ok(error instanceof Aborted);
    assert.equal(await tokensLeft(user), 3, 'nothing counted');
  });
});

describe('cost budgets', () => {
  test('Check counts nothing, Report is never refused', async () => {
    const key = { tokens: fresh('k') };
    assert.ok((await client.check('shop', key, { cost: 1000 })).allowed);
    assert.ok(!(await client.check('shop', key, { cost: 1001 })).allowed);
    assert.equal(await tokensLeft(key), 1000, 'Check counts nothing');
    assert.equal((await client.report('shop', key, { cost: 1200 })).statuses[0].remaining, 0);
    assert.ok(!(await client.check('shop', key, { cost: 1 })).allowed);
  });

  test('withReservation settles the actual cost and answers what the callback returns', async () => {
    const key = { tokens: fresh('k') };
    let held;
    const value = await client.withReservation('shop', key, { estimate: 600 }, async (r) => {
      held = r;
      assert.ok(r.id.length > 0);
      assert.equal(await tokensLeft(key), 400, 'the estimate is held while the callback runs');
      r.actual = 100;
      return 'reply';
    });
    assert.equal(value, 'reply');
    assert.ok(held.settled.settled);
    assert.deepEqual(held.settled.settlements, [{ estimate: 600, actual: 100, charged: 0, refunded: 500 }]);
    assert.equal(await tokensLeft(key), 900);
  });

  test('withReservation charges beyond the estimate, and the estimate when no actual is set', async () => {
    const key = { tokens: fresh('k') };
    const over = await client.withReservation('shop', key, { estimate: 100 }, (r) => {
      r.actual = 250;
      return r;
    });
    assert.deepEqual(over.settled.settlements[0], { estimate: 100, actual: 250, charged: 150, refunded: 0 });
    const none = await client.withReservation('shop', key, { estimate: 300 }, (r) => r);
    assert.deepEqual(none.settled.settlements[0], { estimate: 300, actual: 300, charged: 0, refunded: 0 });
    assert.equal(await tokensLeft(key), 1000 - 250 - 300);
  });

  test('withReservation refunds when the callback throws, and rethrows its error as it was', async () => {
    const key = { tokens: fresh('k') };
    class ModelError extends Error {}
    const thrown = new ModelError('model failed');
    let whole;
    await assert.rejects(
      client.withReservation('shop', key, { estimate: 600 }, async (r) => {
        whole = r;
        throw thrown;
      }),
      (e) => e === thrown && e instanceof ModelError && refundErrorOf(e) === undefined,
    );
    assert.equal(whole.settled.settlements[0].refunded, 600);
    assert.equal(await tokensLeft(key), 1000);
    // What the callback recorded before it threw is kept; the rest comes back.
    let part;
    await assert.rejects(
      client.withReservation('shop', key, { estimate: 600 }, (r) => {
        part = r;
        r.actual = 50;
        throw new Error('stream broke after 50 tokens');
      }),
      /stream broke/,
    );
    assert.equal(part.settled.settlements[0].refunded, 550);
    assert.equal(await tokensLeft(key), 950);
  });

  test("onError: 'expire' leaves the reservation held", async () => {
    const key = { tokens: fresh('k') };
    let held;
    await assert.rejects(
      client.withReservation('shop', key, { estimate: 600, ttlMs: 60_000, onError: 'expire' }, (r) => {
        held = r;
        throw new Error('billed anyway');
      }),
      /billed anyway/,
    );
    assert.equal(held.settled, null);
    assert.equal(held.reserved.ttlMs, 60_000);
    assert.equal(await tokensLeft(key), 400, 'the estimate stays held');
    assert.ok((await client.settle('shop', key, held.id, { actual: 0 })).settled);
    assert.equal(await tokensLeft(key), 1000);
    assert.ok(!(await client.settle('shop', key, held.id, { actual: 0 })).settled, 'a reservation settles once');
  });

  test('a reservation over budget throws BudgetExceeded without running the callback', async () => {
    const key = { tokens: fresh('k') };
    let ran = false;
    const error = await client
      .withReservation('shop', key, { estimate: 1001 }, () => {
        ran = true;
      })
      .then(() => assert.fail('reserved over budget'), (e) => e);
    assert.ok(error instanceof BudgetExceeded && error instanceof SluiceError);
    assert.match(error.message, /tokens_per_hour/);
    assert.equal(error.statuses[0].code, 'OVER_LIMIT');
    assert.ok(!ran);
    assert.equal(await tokensLeft(key), 1000, 'nothing held');
    const refused = await client.reserve('shop', key, { estimate: 1001 });
    assert.ok(!refused.allowed && refused.id === '');
  });

  test('a reservation that meets no limit holds and settles nothing', async () => {
    const r = await client.withReservation('shop', { colour: 'blue' }, { estimate: 10 }, (r) => r);
    assert.equal(r.id, '');
    assert.equal(r.settled, null);
  });

  test('concurrent reservations never overspend one budget, and strand nothing', async () => {
    const key = { tokens: fresh('k') };
    // 25 callers reserve 100 of 1000 at once; each admitted one holds its reservation until every caller has had its
    // answer, so exactly 10 can be held together, and the other 15 are refused.
    const callers = 25;
    let answered = 0;
    let admitted = 0;
    let release;
    const allAnswered = new Promise((r) => (release = r));
    const answer = () => {
      answered += 1;
      if (answered === callers) release();
    };
    const outcomes = await Promise.allSettled(
      Array.from({ length: callers }, (_, i) =>
        client
          .withReservation('shop', key, { estimate: 100 }, async (r) => {
            admitted += 1;
            answer();
            await allAnswered;
            r.actual = 30 + i;
            return r;
          })
          .catch((e) => {
            answer();
            throw e;
          }),
      ),
    );
    const held = outcomes.filter((o) => o.status === 'fulfilled').map((o) => o.value);
    const refused = outcomes.filter((o) => o.status === 'rejected').map((o) => o.reason);
    assert.equal(admitted, 10);
    assert.equal(held.length, 10);
    assert.ok(refused.every((e) => e instanceof BudgetExceeded), String(refused.find((e) => !(e instanceof BudgetExceeded))));
    assert.ok(held.every((r) => r.settled.settled));
    const spent = held.reduce((sum, r) => sum + r.settled.settlements[0].actual, 0);
    assert.equal(await tokensLeft(key), 1000 - spent, 'every estimate settled to its actual cost');
  });
});

describe('failures', () => {
  test('a refund that cannot be sent is attached to the callback error, which is rethrown', async () => {
    const server = await Sluice.start({ files: { 'shop.yaml': CONFIG } });
    const own = new Client(server.target, { timeoutMs: 2000 });
    try {
      const thrown = new Error('model failed');
      let held;
      const error = await own
        .withReservation('shop', { tokens: 'k' }, { estimate: 10 }, async (r) => {
          held = r;
          assert.equal(await server.stop(), 0);
          throw thrown;
        })
        .then(() => assert.fail('resolved'), (e) => e);
      assert.equal(error, thrown, 'the callback error, unchanged');
      const failure = refundErrorOf(error);
      assert.ok(failure instanceof Unavailable, String(failure));
      assert.equal(failure.method, 'Settle');
      assert.equal(error.sluiceRefundError, failure);
      assert.equal(held.refundError, failure);
      assert.equal(held.settled, null);
    } finally {
      own.close();
      await server.stop();
    }
  });

  test('a server that is down is Unavailable, at once', async () => {
    const nobody = new Client(`127.0.0.1:${await freePort()}`, { timeoutMs: 3000 });
    try {
      const started = performance.now();
      const error = await nobody.shouldRateLimit('shop', { user: 'a' }).then(() => assert.fail('answered'), (e) => e);
      assert.ok(error instanceof Unavailable && error instanceof RpcError, String(error));
      assert.equal(error.codeName, 'UNAVAILABLE');
      assert.equal(error.method, 'ShouldRateLimit');
      assert.match(error.message, /^ShouldRateLimit: UNAVAILABLE: /);
      assert.ok(performance.now() - started < 2500, 'failed before the timeout');
    } finally {
      nobody.close();
    }
  });

  test('errors name the input', async () => {
    const rejects = (promise, Class, pattern) =>
      assert.rejects(promise, (e) => e instanceof Class && pattern.test(e.message), `${Class.name} ${pattern}`);
    await rejects(client.shouldRateLimit('', { user: 'a' }), InvalidArgument, /^ShouldRateLimit: INVALID_ARGUMENT: .*domain is empty/);
    await rejects(client.reserve('shop', { tokens: fresh('k') }, { estimate: 0 }), InvalidArgument, /^Reserve: INVALID_ARGUMENT: estimate: descriptors\[0\]/);
    await rejects(
      client.addListEntries('shop', 'blocked', ['192.0.2.1', '10.0.0.0/40']),
      InvalidArgument,
      /values\[1\]: '10\.0\.0\.0\/40' is not a CIDR range/,
    );
    // Refused before any call, worded as the server words it.
    await rejects(client.getRemaining('shop', { user: 'a' }, { cost: -1 }), InvalidArgument, /^GetRemaining: INVALID_ARGUMENT: cost: -1 is not between 0 and/);
    await rejects(client.check('shop', { user: 'a' }, { cost: 1.5 }), InvalidArgument, /cost: expected a whole number/);
    await rejects(client.shouldRateLimit('shop', [{ user: 'a' }, [['user']]]), InvalidArgument, /descriptors\[1\]\.entries\[0\]: expected a \[key, value\] pair/);
    await rejects(client.shouldRateLimit('shop', [42]), InvalidArgument, /descriptors\[0\]: expected an object or \[key, value\] pairs/);
    await rejects(client.waitForPermit('shop', { user: 'a' }, { maxWaitMs: -5 }), InvalidArgument, /maxWaitMs: -5 ms is not a duration/);
    await rejects(client.withReservation('shop', { tokens: 'k' }, { estimate: 1, onError: 'ignore' }, () => 0), InvalidArgument, /onError: 'ignore'/);
    await rejects(client.getListEntries('shop', 'allowed'), NotFound, /no list 'allowed'/);
    const stranger = new Client(sluice.target, { adminToken: 'wrong' });
    try {
      await rejects(stranger.getListEntries('shop', 'blocked'), Unauthenticated, /UNAUTHENTICATED/);
    } finally {
      stranger.close();
    }
  });
});

describe('lists and offenders', () => {
  test('run-time lists', async () => {
    const address = '198.51.100.9';
    assert.ok((await client.shouldRateLimit('shop', { remote_address: address })).allowed);
    assert.equal(await client.addListEntries('shop', 'blocked', ['198.51.100.0/24', '192.0.2.77'], { ttlMs: HOUR_MS }), 2);
    assert.equal(await client.addListEntries('shop', 'blocked', ['203.0.113.5']), 1);
    const entries = new Map((await client.getListEntries('shop', 'blocked')).map((e) => [e.value, e.expiresInMs]));
    const ranged = entries.get('198.51.100.0/24');
    assert.ok(ranged > HOUR_MS - 30_000 && ranged <= HOUR_MS, `${ranged}`);
    assert.equal(entries.get('203.0.113.5'), null, 'added without a ttl: until removed');
    const denied = await client.shouldRateLimit('shop', { remote_address: address });
    assert.ok(!denied.allowed);
    assert.ok(denied.headers.some(([k, v]) => k === 'X-Sluice-List-Deny' && v === 'blocked'), JSON.stringify(denied.headers));
    assert.equal(await client.removeListEntries('shop', 'blocked', ['198.51.100.0/24', '192.0.2.77', '203.0.113.5']), 3);
    assert.ok((await client.shouldRateLimit('shop', { remote_address: address })).allowed);
  });

  test('top offenders', async () => {
    const user = fresh('noisy');
    for (let i = 0; i < 5; i++) await client.shouldRateLimit('shop', { user });
    // Each instance adds what it counted into the store every 5 seconds.
    const deadline = Date.now() + 15_000;
    for (;;) {
      const rule = (await client.topOffenders('shop', { span: 'minute', limit: 1000 })).find((r) => r.rule === 'shop.user');
      const hits = rule?.hits.find((o) => o.value === `user=${user}`)?.count;
      const denied = rule?.denied.find((o) => o.value === `user=${user}`)?.count;
      if (hits === 5 && denied === 2) break;
      assert.ok(Date.now() < deadline, `user=${user} not among the offenders: ${JSON.stringify(rule)}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.ok((await client.topOffenders('shop', { span: 'hour', limit: 1000 })).length > 0);
  });
});
