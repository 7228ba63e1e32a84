// bee-queue against a Redis-protocol server: node suite.js redis://127.0.0.1:PORT
// Every job records each of its executions in Redis (HINCRBY on a key of the suite's
// own); the scenarios check those records and bee-queue's own counts, not just that no
// error was raised.
'use strict';

const util = require('util');
const redis = require('redis');
const Queue = require('bee-queue');
const { assert, assertEq, sleep, waitFor, scenario, finish, watchdog } = require('../harness');

const url = process.argv[2];
if (!url) {
  console.error('usage: node suite.js redis://127.0.0.1:PORT');
  process.exit(2);
}
watchdog(300000);

// A plain client for the suite's own bookkeeping.
const rc = redis.createClient({ url });
const cmd = (name, ...args) => util.promisify(rc.send_command).call(rc, name, args);
rc.on('error', (e) => console.error('bookkeeping client:', e.message));

const queues = [];
function queue(name, settings) {
  const q = new Queue(name, Object.assign({ redis: { url } }, settings));
  q.on('error', (e) => console.error(`queue ${name}:`, e.message));
  queues.push(q);
  return q;
}
// A producer that hears job events; workers that send them.
const producer = (name) => queue(name, { isWorker: false, getEvents: true });
const worker = (name, extra) =>
  queue(name, Object.assign({ getEvents: false, activateDelayedJobs: true, stallInterval: 5000 }, extra));

async function hgetallNum(key) {
  const h = (await cmd('HGETALL', key)) || {};
  const out = {};
  for (const [k, v] of Object.entries(h)) out[k] = Number(v);
  return out;
}

async function main() {
  await scenario('exactly once: 2000 jobs (100 save, 1900 saveAll) over 3 workers x 4', async () => {
    const name = 'once';
    const p = producer(name);
    const ws = [worker(name), worker(name), worker(name)];
    await Promise.all([p.ready(), ...ws.map((w) => w.ready())]);
    ws.forEach((w, i) =>
      w.process(4, async (job) => {
        await cmd('HINCRBY', 'bq:once:exec', String(job.data.n), 1);
        await cmd('HINCRBY', 'bq:once:by', String(i), 1);
        return job.data.n * 2;
      })
    );
    for (let n = 0; n < 100; n++) await p.createJob({ n }).save();
    const batch = [];
    for (let n = 100; n < 2000; n++) batch.push(p.createJob({ n }));
    const errors = await p.saveAll(batch);
    assertEq(errors.size, 0, 'saveAll errors');
    const ids = new Set(batch.map((j) => j.id));
    assertEq(ids.size, 1900, 'distinct ids from saveAll');

    const health = await waitFor('2000 succeeded', async () => {
      const h = await p.checkHealth();
      return h.succeeded === 2000 && h.waiting === 0 && h.active === 0 ? h : null;
    });
    assertEq([health.failed, health.delayed], [0, 0], 'failed, delayed');
    assertEq(health.newestJob, 2000, 'newest job id');
    const exec = await hgetallNum('bq:once:exec');
    assertEq(Object.keys(exec).length, 2000, 'distinct jobs executed');
    const twice = Object.entries(exec).filter(([, c]) => c !== 1);
    assertEq(twice, [], 'jobs not executed exactly once');
    const by = await hgetallNum('bq:once:by');
    assertEq(Object.values(by).reduce((a, b) => a + b, 0), 2000, 'executions over workers');
    const some = await p.getJobs('succeeded', { size: 5000 });
    assertEq(some.length, 2000, 'getJobs(succeeded)');
    const j = await p.getJob(some[0].id);
    assertEq(j.status, 'succeeded', 'status of a finished job');
  });

  await scenario('retries: fixed backoff 300 ms, 2 failures then success', async () => {
    const name = 'retry';
    const p = producer(name);
    const w = worker(name);
    await Promise.all([p.ready(), w.ready()]);
    w.process(4, async (job) => {
      const n = await cmd('HINCRBY', 'bq:retry:att', job.id, 1);
      await cmd('RPUSH', `bq:retry:t:${job.id}`, String(Date.now()));
      if (n <= 2) throw new Error(`attempt ${n} fails`);
      return `ok after ${n}`;
    });
    const jobs = [];
    const results = new Map();
    let retrying = 0;
    for (let i = 0; i < 10; i++) {
      const job = p.createJob({ i }).retries(2).backoff('fixed', 300);
      job.on('retrying', () => retrying++);
      job.on('succeeded', (r) => results.set(job.id, r));
      await job.save();
      jobs.push(job);
    }
    await waitFor('10 succeeded events', () => results.size === 10);
    const att = await hgetallNum('bq:retry:att');
    for (const job of jobs) {
      assertEq(att[job.id], 3, `attempts of job ${job.id}`);
      assertEq(results.get(job.id), 'ok after 3', `result of job ${job.id}`);
      const times = (await cmd('LRANGE', `bq:retry:t:${job.id}`, 0, -1)).map(Number);
      for (let k = 1; k < times.length; k++) {
        // Not a timing test: a retry must not come back before its backoff.
        assert(times[k] - times[k - 1] >= 290, `job ${job.id} retried after ${times[k] - times[k - 1]} ms, backoff 300`);
      }
    }
    await waitFor('retrying events', () => retrying === 20);
    const h = await p.checkHealth();
    assertEq([h.succeeded, h.failed, h.delayed, h.waiting, h.active], [10, 0, 0, 0, 0], 'succeeded, failed, delayed, waiting, active');
  });

  await scenario('retries: exponential backoff exhausted ends failed; Job.retry runs it again', async () => {
    const name = 'expo';
    const p = producer(name);
    const w = worker(name);
    await Promise.all([p.ready(), w.ready()]);
    w.process(2, async (job) => {
      const n = await cmd('HINCRBY', 'bq:expo:att', job.id, 1);
      await cmd('RPUSH', `bq:expo:t:${job.id}`, String(Date.now()));
      if (n <= 4) throw new Error(`attempt ${n} fails`);
      return 'revived';
    });
    const job = p.createJob({}).retries(3).backoff('exponential', 100);
    let failedErr = null;
    let done = null;
    job.on('failed', (e) => (failedErr = e));
    // A job that ended failed is dropped from the producer's table: hear the queue.
    p.on('job succeeded', (id, r) => {
      if (id === job.id) done = r;
    });
    await job.save();
    await waitFor('failed event', () => failedErr);
    assertEq(failedErr.message, 'attempt 4 fails', 'error of the last attempt');
    const h = await waitFor('failed count 1', async () => {
      const x = await p.checkHealth();
      return x.failed === 1 && x.active === 0 ? x : null;
    });
    assertEq(h.succeeded, 0, 'succeeded');
    assertEq((await hgetallNum('bq:expo:att'))[job.id], 4, 'attempts');
    const times = (await cmd('LRANGE', `bq:expo:t:${job.id}`, 0, -1)).map(Number);
    [100, 200, 400].forEach((d, k) =>
      assert(times[k + 1] - times[k] >= d - 10, `retry ${k + 1} came after ${times[k + 1] - times[k]} ms, backoff ${d}`)
    );
    const stored = await p.getJob(job.id);
    assertEq(stored.status, 'failed', 'stored status');
    assert(stored.options.stacktraces.length === 4, `stacktraces: ${stored.options.stacktraces.length}`);
    await stored.retry();
    await waitFor('succeeded after Job.retry', () => done);
    assertEq(done, 'revived', 'result');
    const h2 = await waitFor('counts after retry', async () => {
      const x = await p.checkHealth();
      return x.succeeded === 1 ? x : null;
    });
    assertEq([h2.failed, h2.waiting, h2.active], [0, 0, 0], 'failed, waiting, active');
    assertEq((await hgetallNum('bq:expo:att'))[job.id], 5, 'attempts');
  });

  await scenario('delayed jobs: activateDelayedJobs runs each once, not early; far one stays delayed', async () => {
    const name = 'delayed';
    const p = producer(name);
    const w = worker(name, { delayedDebounce: 100 });
    await Promise.all([p.ready(), w.ready()]);
    w.process(4, async (job) => {
      await cmd('HINCRBY', 'bq:delayed:exec', job.id, 1);
      await cmd('HSET', 'bq:delayed:at', job.id, String(Date.now()));
    });
    const due = new Map();
    const base = Date.now();
    for (let i = 0; i < 12; i++) {
      const at = base + 300 + i * 150;
      const job = await p.createJob({ i }).delayUntil(at).save();
      due.set(job.id, at);
    }
    const far = await p.createJob({ far: true }).delayUntil(Date.now() + 3600 * 1000).save();
    await waitFor('12 delayed jobs done', async () => {
      const h = await p.checkHealth();
      return h.succeeded === 12 ? h : null;
    });
    const exec = await hgetallNum('bq:delayed:exec');
    const at = await hgetallNum('bq:delayed:at');
    for (const [id, when] of due) {
      assertEq(exec[id], 1, `executions of delayed job ${id}`);
      assert(at[id] >= when, `job ${id} ran ${when - at[id]} ms before its time`);
    }
    assertEq(exec[far.id], undefined, 'the far job ran');
    const delayed = await p.getJobs('delayed', { start: 0, end: 10 });
    assertEq(delayed.map((j) => j.id), [far.id], 'delayed set');
    const h = await p.checkHealth();
    assertEq([h.delayed, h.waiting, h.active, h.failed], [1, 0, 0, 0], 'delayed, waiting, active, failed');
    await p.removeJob(far.id);
    assertEq((await p.checkHealth()).delayed, 0, 'delayed after removeJob');
  });

  await scenario('progress events reach the producer in order, then the result', async () => {
    const name = 'progress';
    const p = producer(name);
    const w = worker(name);
    await Promise.all([p.ready(), w.ready()]);
    w.process(4, async (job) => {
      for (const pct of [10, 40, 70, 100]) await job.reportProgress({ pct, n: job.data.n });
      return { n: job.data.n, done: true };
    });
    const seen = new Map();
    const queueLevel = [];
    p.on('job progress', (id, prog) => queueLevel.push([id, prog.pct]));
    const results = new Map();
    const jobs = [];
    for (let n = 0; n < 5; n++) {
      const job = p.createJob({ n });
      seen.set(n, []);
      job.on('progress', (prog) => seen.get(n).push(prog.pct));
      job.on('succeeded', (r) => results.set(n, r));
      await job.save();
      jobs.push(job);
    }
    await waitFor('5 results', () => results.size === 5);
    for (let n = 0; n < 5; n++) {
      assertEq(seen.get(n), [10, 40, 70, 100], `progress of job ${n}`);
      assertEq(results.get(n), { n, done: true }, `result of job ${n}`);
    }
    assertEq(queueLevel.length, 20, 'queue-level progress events');
    const j = await p.getJob(jobs[0].id);
    assertEq(j.status, 'succeeded', 'status');
  });
}

main()
  .catch((e) => console.log(`FAIL suite: ${e.stack}`))
  .finally(async () => {
    await Promise.all(queues.map((q) => q.close(2000).catch(() => {})));
    rc.quit();
    await sleep(50);
    finish();
  });
