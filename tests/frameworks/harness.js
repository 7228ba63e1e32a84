// Tiny scenario runner shared by the Node framework suites (bee-queue, bull). No
// dependencies. Each scenario prints one PASS or FAIL line; finish() sets the exit code.
'use strict';

const LABEL = process.env.FW_CONFIG || 'server';
let failures = 0;

class Failure extends Error {}

function assert(cond, msg) {
  if (!cond) throw new Failure(msg);
}

function assertEq(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Failure(`${what}: expected ${e}, got ${a}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls fn() until it returns a truthy value or the deadline passes; the last value seen
// goes into the error message.
async function waitFor(what, fn, timeoutMs = 60000, everyMs = 50) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = `error: ${e && e.message}`;
    }
    if (Date.now() > deadline) {
      throw new Failure(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${JSON.stringify(last)})`);
    }
    await sleep(everyMs);
  }
}

function withTimeout(promise, ms, what) {
  let t;
  const timer = new Promise((_, reject) => {
    t = setTimeout(() => reject(new Failure(`${what} did not finish within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timer]).finally(() => clearTimeout(t));
}

// Runs one scenario with an overall time limit; never throws.
async function scenario(name, fn, limitMs = 120000) {
  const t0 = Date.now();
  try {
    await withTimeout(Promise.resolve().then(fn), limitMs, name);
    console.log(`PASS [${LABEL}] ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failures += 1;
    const msg = e instanceof Failure ? e.message : (e && e.stack) || String(e);
    console.log(`FAIL [${LABEL}] ${name}: ${msg}`);
  }
}

// A library's stray rejection (a connection closed while the suite shuts down...) is
// logged, not fatal: the scenarios' own checks decide PASS or FAIL.
process.on('unhandledRejection', (e) => {
  console.error(`unhandled rejection: ${(e && e.message) || e}`);
});

function finish() {
  console.log(failures ? `${failures} scenario(s) failed [${LABEL}]` : `all scenarios passed [${LABEL}]`);
  process.exit(failures ? 1 : 0);
}

// The whole suite may not outlive this; a hang prints what was running.
function watchdog(ms) {
  const t = setTimeout(() => {
    console.log(`FAIL [${LABEL}] suite did not finish within ${ms} ms`);
    process.exit(2);
  }, ms);
  t.unref();
}

module.exports = { assert, assertEq, sleep, waitFor, withTimeout, scenario, finish, watchdog };
