// Bull 4 against a Redis-protocol server: node suite.js redis://127.0.0.1:PORT
// Every job records each of its executions in Redis (HINCRBY on a key of the suite's
// own); the scenarios check those records and Bull's own counts and job state, not just
// that no error was raised.
'use strict';

const EventEmitter = require('events');
const Redis = require('ioredis');
const Queue = require('bull');
const { assert, assertEq, sleep, waitFor, scenario, finish, watchdog } = require('../harness');

const url = process.argv[2];
if (!url) {
  console.error('usage: node suite.js redis://127.0.0.1:PORT');
  process.exit(2);
}
watchdog(300000);
// Many job.finished() waits share one connection's emitter.
EventEmitter.defaultMaxListeners = 100;

const rc = new Redis(url);
rc.on('error', (e) => console.error('bookkeeping client:', e.message));

const queues = [];
function queue(name) {
  // drainDelay: seconds an idle worker blocks in BRPOPLPUSH before looking again.
  const q = new Queue(name, url, { settings: { drainDelay: 1, guardInterval: 1000 } });
  q.on('error', (e) => console.error(`queue ${name}:`, e.message));
  queues.push(q);
  return q;
}

async function hgetallNum(key) {
  const h = await rc.hgetall(key);
  const out = {};
  for (const [k, v] of Object.entries(h)) out[k] = Number(v);
  return out;
}

async function counts(q) {
  return q.getJobCounts();
}

async function main() {
  await scenario('exactly once: 2000 jobs (100 add, 1900 addBulk) over 3 workers, concurrency 5', async () => {
    const name = 'once';
    const p = queue(name);
    const ws = [queue(name), queue(name), queue(name)];
    await Promise.all([p, ...ws].map((q) => q.isReady()));
    const inflight = [0, 0, 0];
    const peak = [0, 0, 0];
    ws.forEach((w, i) =>
      w.process(5, async (job) => {
        inflight[i] += 1;
        peak[i] = Math.max(peak[i], inflight[i]);
        try {
          await rc.hincrby('bu:once:exec', String(job.data.n), 1);
          await sleep(2);
          return job.data.n * 2;
        } finally {
          inflight[i] -= 1;
        }
      })
    );
    const first = [];
    for (let n = 0; n < 100; n++) first.push(await p.add({ n }));
    const bulk = [];
    for (let n = 100; n < 2000; n++) bulk.push({ data: { n } });
    const added = await p.addBulk(bulk);
    assertEq(new Set(added.map((j) => j.id)).size, 1900, 'distinct ids from addBulk');

    const c = await waitFor('2000 completed', async () => {
      const x = await counts(p);
      return x.completed === 2000 && x.waiting === 0 && x.active === 0 ? x : null;
    });
    assertEq([c.failed, c.delayed], [0, 0], 'failed, delayed');
    const exec = await hgetallNum('bu:once:exec');
    assertEq(Object.keys(exec).length, 2000, 'distinct jobs executed');
    assertEq(Object.entries(exec).filter(([, v]) => v !== 1), [], 'jobs not executed exactly once');
    for (let k = 0; k < 3; k++) assert(peak[k] <= 5, `worker ${k} ran ${peak[k]} jobs at once, concurrency 5`);
    assert(Math.max(...peak) >= 2, `no worker ran two jobs at once (peaks ${peak})`);
    const j = await p.getJob(first[7].id);
    assertEq([await j.getState(), j.returnvalue, j.attemptsMade], ['completed', 14, 0], 'state, return value, attempts of job 7');
    assertEq(await first[3].finished(), 6, 'finished() of job 3');
  });

  await scenario('retries: fixed backoff 300 ms, 2 failures then success', async () => {
    const name = 'retry';
    const p = queue(name);
    const w = queue(name);
    await Promise.all([p.isReady(), w.isReady()]);
    w.process(4, async (job) => {
      const n = await rc.hincrby('bu:retry:att', job.id, 1);
      await rc.rpush(`bu:retry:t:${job.id}`, String(Date.now()));
      if (n <= 2) throw new Error(`attempt ${n} fails`);
      return `ok after ${n}`;
    });
    const jobs = [];
    for (let i = 0; i < 10; i++) {
      jobs.push(await p.add({ i }, { attempts: 3, backoff: { type: 'fixed', delay: 300 } }));
    }
    const results = await Promise.all(jobs.map((j) => j.finished()));
    assertEq(results, Array(10).fill('ok after 3'), 'results');
    const att = await hgetallNum('bu:retry:att');
    for (const job of jobs) {
      assertEq(att[job.id], 3, `executions of job ${job.id}`);
      const times = (await rc.lrange(`bu:retry:t:${job.id}`, 0, -1)).map(Number);
      for (let k = 1; k < times.length; k++) {
        // Not a timing test: a retry must not come back before its backoff.
        assert(times[k] - times[k - 1] >= 290, `job ${job.id} retried after ${times[k] - times[k - 1]} ms, backoff 300`);
      }
      const again = await p.getJob(job.id);
      assertEq([again.attemptsMade, again.stacktrace.length], [2, 2], `attemptsMade, stacktraces of job ${job.id}`);
    }
    const c = await waitFor('counts settle', async () => {
      const x = await counts(p);
      return x.completed === 10 && x.active === 0 ? x : null;
    });
    assertEq([c.failed, c.delayed, c.waiting], [0, 0, 0], 'failed, delayed, waiting');
  });

  await scenario('retries: exponential backoff exhausted ends failed; job.retry() runs it again', async () => {
    const name = 'expo';
    const p = queue(name);
    const w = queue(name);
    await Promise.all([p.isReady(), w.isReady()]);
    const globalFailed = [];
    p.on('global:failed', (id, reason) => globalFailed.push([id, reason]));
    w.process(2, async (job) => {
      const n = await rc.hincrby('bu:expo:att', job.id, 1);
      await rc.rpush(`bu:expo:t:${job.id}`, String(Date.now()));
      if (n <= 4) throw new Error(`attempt ${n} fails`);
      return 'revived';
    });
    const job = await p.add({}, { attempts: 4, backoff: { type: 'exponential', delay: 100 } });
    let err = null;
    await job.finished().catch((e) => (err = e));
    assert(err, 'job did not fail');
    assertEq(err.message, 'attempt 4 fails', 'failure reason');
    const failed = await p.getJob(job.id);
    assertEq([await failed.getState(), failed.attemptsMade, failed.failedReason], ['failed', 4, 'attempt 4 fails'], 'state, attemptsMade, failedReason');
    const times = (await rc.lrange(`bu:expo:t:${job.id}`, 0, -1)).map(Number);
    [100, 200, 400].forEach((d, k) =>
      assert(times[k + 1] - times[k] >= d - 10, `retry ${k + 1} came after ${times[k + 1] - times[k]} ms, backoff ${d}`)
    );
    await waitFor('global:failed event', () => globalFailed.length === 1);
    assertEq(globalFailed[0], [String(job.id), 'attempt 4 fails'], 'global:failed');
    const c = await counts(p);
    assertEq([c.failed, c.completed], [1, 0], 'failed, completed');
    await failed.retry();
    assertEq(await failed.finished(), 'revived', 'result after retry()');
    assertEq((await hgetallNum('bu:expo:att'))[job.id], 5, 'executions');
    const c2 = await waitFor('counts after retry', async () => {
      const x = await counts(p);
      return x.completed === 1 ? x : null;
    });
    assertEq([c2.failed, c2.active, c2.waiting], [0, 0, 0], 'failed, active, waiting');
  });

  await scenario('delayed jobs: each runs once, not early; a far one stays delayed', async () => {
    const name = 'delayed';
    const p = queue(name);
    const w = queue(name);
    await Promise.all([p.isReady(), w.isReady()]);
    w.process(4, async (job) => {
      await rc.hincrby('bu:delayed:exec', job.id, 1);
      await rc.hset('bu:delayed:at', job.id, String(Date.now()));
    });
    const due = new Map();
    for (let i = 0; i < 12; i++) {
      const delay = 300 + i * 150;
      const job = await p.add({ i }, { delay });
      due.set(job.id, job.timestamp + delay);
    }
    const far = await p.add({ far: true }, { delay: 3600 * 1000 });
    await waitFor('12 delayed jobs completed', async () => {
      const x = await counts(p);
      return x.completed === 12 && x.active === 0 ? x : null;
    });
    const exec = await hgetallNum('bu:delayed:exec');
    const at = await hgetallNum('bu:delayed:at');
    for (const [id, when] of due) {
      assertEq(exec[id], 1, `executions of delayed job ${id}`);
      assert(at[id] >= when, `job ${id} ran ${when - at[id]} ms before its time`);
    }
    assertEq(exec[far.id], undefined, 'the far job ran');
    const delayed = await p.getDelayed();
    assertEq(delayed.map((j) => j.id), [far.id], 'delayed jobs');
    assertEq(await far.getState(), 'delayed', 'state of the far job');
    await far.remove();
    const c = await counts(p);
    assertEq([c.delayed, c.waiting, c.active, c.failed], [0, 0, 0, 0], 'delayed, waiting, active, failed');
  });

  await scenario('progress: local and global events in order, then the result', async () => {
    const name = 'progress';
    const p = queue(name);
    const w = queue(name);
    await Promise.all([p.isReady(), w.isReady()]);
    const local = new Map();
    w.on('progress', (job, prog) => {
      if (!local.has(job.id)) local.set(job.id, []);
      local.get(job.id).push(prog);
    });
    const global = new Map();
    p.on('global:progress', (id, prog) => {
      if (!global.has(String(id))) global.set(String(id), []);
      global.get(String(id)).push(prog);
    });
    const completed = new Map();
    p.on('global:completed', (id, result) => completed.set(String(id), JSON.parse(result)));
    w.process(3, async (job) => {
      for (const pct of [10, 40, 70, 100]) await job.progress(pct);
      return { n: job.data.n };
    });
    const jobs = [];
    for (let n = 0; n < 5; n++) jobs.push(await p.add({ n }));
    await waitFor('5 global:completed events', () => completed.size === 5);
    for (const job of jobs) {
      const id = String(job.id);
      assertEq(global.get(id), [10, 40, 70, 100], `global progress of job ${id}`);
      assertEq(local.get(job.id), [10, 40, 70, 100], `local progress of job ${id}`);
      assertEq(completed.get(id), { n: job.data.n }, `result of job ${id}`);
      const again = await p.getJob(job.id);
      assertEq(again.progress(), 100, `stored progress of job ${id}`);
    }
  });

  await scenario('repeatable jobs: every 300 ms with limit 6 runs exactly 6 times; removeRepeatable', async () => {
    const name = 'repeat';
    const p = queue(name);
    const w = queue(name);
    await Promise.all([p.isReady(), w.isReady()]);
    w.process(2, async (job) => {
      await rc.hincrby('bu:repeat:exec', job.id, 1);
      await rc.incr(`bu:repeat:runs:${job.data.kind}`);
    });
    await p.add({ kind: 'limited' }, { repeat: { every: 300, limit: 6 } });
    const yearly = { cron: '0 0 1 1 *' };
    await p.add('yearly', { kind: 'yearly' }, { repeat: yearly });
    await waitFor('6 runs', async () => Number(await rc.get('bu:repeat:runs:limited')) >= 6);
    const exec = await hgetallNum('bu:repeat:exec');
    assertEq(Object.keys(exec).length, 6, `distinct repeat job ids (${Object.keys(exec)})`);
    assertEq(Object.values(exec).filter((v) => v !== 1), [], 'repeat jobs not executed exactly once');
    const c = await waitFor('limited runs settle', async () => {
      const x = await counts(p);
      return x.completed === 6 && x.active === 0 ? x : null;
    });
    assertEq([c.delayed, c.failed], [1, 0], 'delayed (the yearly one), failed');
    const reps = await p.getRepeatableJobs();
    const yearlyRep = reps.find((r) => r.name === 'yearly');
    assert(yearlyRep && yearlyRep.cron === yearly.cron, `repeatable jobs: ${JSON.stringify(reps)}`);
    await p.removeRepeatable('yearly', yearly);
    const after = await p.getRepeatableJobs();
    assert(!after.find((r) => r.name === 'yearly'), `still repeatable: ${JSON.stringify(after)}`);
    assertEq((await counts(p)).delayed, 0, 'delayed after removeRepeatable');
    assertEq(await rc.get('bu:repeat:runs:yearly'), null, 'the yearly job ran');
    assertEq(Number(await rc.get('bu:repeat:runs:limited')), 6, 'runs of the limited job');
  });
}

main()
  .catch((e) => console.log(`FAIL suite: ${e.stack}`))
  .finally(async () => {
    await Promise.all(queues.map((q) => q.close().catch(() => {})));
    rc.disconnect();
    await sleep(50);
    finish();
  });
