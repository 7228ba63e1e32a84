// The observe suite's BullMQ workload (see run.sh): node bullmq.mjs redis://127.0.0.1:PORT
//
// A Queue "emails" (prefix "bull") gets OBS_BQ_JOBS jobs, OBS_BQ_DELAYED of them delayed an
// hour; KITE QUEUES (read over RESP3, as maps) and INFO queues show bull:emails as a BullMQ
// queue with its waiting and delayed jobs; a Worker (concurrency 4) runs the rest,
// OBS_BQ_FAIL of them failing on purpose (attempts 1), and the states, counters and
// consumers are checked after it. The worker is closed at the end: the dashboard check
// pushes more jobs and watches the depth grow.
import { Queue, Worker } from 'bullmq';
import Redis from 'ioredis';
import {
    check, eq, waitFor, scenarios, kiteQueues, kiteQueue, infoQueues, jobs, envInt, toMap,
} from './kite.mjs';

const [url] = process.argv.slice(2);
if (!url) {
    console.error('usage: node bullmq.mjs redis://127.0.0.1:PORT');
    process.exit(2);
}
const u = new URL(url);
const connection = { host: u.hostname, port: Number(u.port) };
const N = envInt('OBS_BQ_JOBS', 50);
const DELAYED = envInt('OBS_BQ_DELAYED', 5);
const FAIL = envInt('OBS_BQ_FAIL', 3);
const READY = N - DELAYED;
const NAME = 'bull:emails';

// RESP3 with maps decoded as objects, so KITE QUEUES's maps are seen as maps.
const kite = new Redis({ ...connection, protocol: 3, replyMapping: 'resp3', maxRetriesPerRequest: 3 });
const queue = new Queue('emails', { connection, prefix: 'bull' });
queue.on('error', (e) => console.error(`queue error: ${e.message}`));
let worker = null;
const s = scenarios('bullmq');

const counts = () => queue.getJobCounts('wait', 'active', 'delayed', 'completed', 'failed', 'paused', 'prioritized');

await s.run(`add ${N} jobs to "emails" (${DELAYED} delayed 1 h), no worker`, async () => {
    // Failing jobs are spread among the ready ones: the 3rd, the middle one, the last one.
    const failing = new Set([2, Math.floor(READY / 2), READY - 1].slice(0, FAIL));
    for (let i = 0; i < N; i++) {
        const delayed = i >= READY;
        await queue.add('email', { i, fail: failing.has(i) }, {
            attempts: 1,
            removeOnComplete: false,
            removeOnFail: false,
            ...(delayed ? { delay: 3_600_000 } : {}),
        });
    }
    const c = await counts();
    eq([c.wait, c.delayed, c.active, c.completed, c.failed], [READY, DELAYED, 0, 0, 0],
        'BullMQ getJobCounts wait, delayed, active, completed, failed');
});

await s.run('KITE QUEUES (RESP3 maps) before the worker: bullmq, waiting and delayed', async () => {
    const raw = await kite.call('KITE', 'QUEUES', NAME);
    check(Array.isArray(raw) && raw.length === 1, `KITE QUEUES ${NAME}: ${JSON.stringify(raw)}`);
    check(raw[0] !== null && typeof raw[0] === 'object' && !Array.isArray(raw[0]),
        `over RESP3 an entry of KITE QUEUES is not a map: ${JSON.stringify(raw[0]).slice(0, 200)}`);
    const q = await kiteQueue(kite, NAME);
    eq([q.framework, q.type, q.db], ['bullmq', 'list', 0], `${NAME} framework, type, db`);
    eq([q.depth, q.pushed, q.popped, q.consumers], [READY, READY, 0, 0], `${NAME} depth, pushed, popped, consumers`);
    eq([jobs(q, 'waiting'), jobs(q, 'delayed'), jobs(q, 'active'), jobs(q, 'completed'), jobs(q, 'failed')],
        [READY, DELAYED, 0, 0, 0], `${NAME} jobs waiting, delayed, active, completed, failed`);
    check(Number.isInteger(q.oldest_age_ms) && q.oldest_age_ms >= 0 && q.oldest_age_ms < 60_000,
        `${NAME} oldest_age_ms ${q.oldest_age_ms}`);
    check(q.wait_p50_ms === null && q.wait_p99_ms === null, `${NAME} wait quantiles before a pop: ${q.wait_p50_ms}, ${q.wait_p99_ms}`);
    // One row per framework queue: its other keys (:delayed, :marker, :events, ...) are
    // states of bull:emails, not queues of their own.
    eq(Object.keys(await kiteQueues(kite, 'bull:*')), [NAME], 'KITE QUEUES bull:*');
    const all = Object.keys(await kiteQueues(kite));
    check(all.includes('queue:default'), `the Sidekiq queues are gone from KITE QUEUES: ${JSON.stringify(all)}`);
});

await s.run('INFO queues: the bull:emails row', async () => {
    const info = await infoQueues(kite);
    const row = info.rows.find((r) => r.name === NAME);
    check(row, `no ${NAME} row in INFO queues:\n${info.text}`);
    eq([row.framework, row.type, row.depth, row.pushed, row.popped, row.jobs_waiting, row.jobs_delayed],
        ['bullmq', 'list', String(READY), String(READY), '0', String(READY), String(DELAYED)],
        `${NAME} framework, type, depth, pushed, popped, jobs_waiting, jobs_delayed`);
    const names = info.rows.map((r) => r.name);
    eq(names, [...names].sort(), 'INFO queues rows sorted by name');
});

const done = { completed: 0, failed: 0 };
await s.run(`a Worker (concurrency 4) runs the ${READY} ready jobs, ${FAIL} failing on purpose`, async () => {
    worker = new Worker('emails', async (job) => {
        if (job.data.fail) throw new Error(`job ${job.data.i} fails on purpose`);
        return job.data.i;
    }, { connection, prefix: 'bull', concurrency: 4 });
    worker.on('error', (e) => console.error(`worker error: ${e.message}`));
    worker.on('completed', () => done.completed++);
    worker.on('failed', () => done.failed++);
    await waitFor(`${READY} jobs finished`, async () => {
        const c = await counts();
        return c.completed + c.failed >= READY ? c : null;
    }, 60_000);
    const c = await counts();
    eq([c.wait, c.active, c.delayed, c.completed, c.failed], [0, 0, DELAYED, READY - FAIL, FAIL],
        'BullMQ getJobCounts wait, active, delayed, completed, failed');
    await waitFor('the worker events', () => done.completed + done.failed === READY, 5_000);
    eq([done.completed, done.failed], [READY - FAIL, FAIL], 'worker events completed, failed');
});

await s.run('KITE QUEUES after the worker: states, counters, wait times', async () => {
    // The states are read when reported; the last job's move to completed/failed may
    // trail the count above by a moment.
    const q = await waitFor('bull:emails to settle', async () => {
        const q = await kiteQueue(kite, NAME);
        const st = ['waiting', 'active', 'delayed', 'completed', 'failed'].map((x) => jobs(q, x));
        eq(st, [0, 0, DELAYED, READY - FAIL, FAIL], `${NAME} jobs waiting, active, delayed, completed, failed`);
        return q;
    }, 10_000);
    eq([q.depth, q.pushed, q.popped], [0, READY, READY], `${NAME} depth, pushed, popped`);
    check(q.oldest_age_ms === null, `${NAME} oldest_age_ms of an empty queue: ${q.oldest_age_ms} (want null)`);
    check(typeof q.wait_p50_ms === 'number' && q.wait_p50_ms >= 0 && q.wait_p50_ms < 120_000,
        `${NAME} wait_p50_ms ${q.wait_p50_ms}`);
    check(typeof q.wait_p99_ms === 'number' && q.wait_p99_ms >= q.wait_p50_ms, `${NAME} wait_p99_ms ${q.wait_p99_ms}`);
    check(typeof q.pop_rate === 'number' && q.pop_rate >= 0, `${NAME} pop_rate ${q.pop_rate}`);
    const row = (await infoQueues(kite)).rows.find((r) => r.name === NAME);
    check(row, `no ${NAME} row in INFO queues`);
    eq([row.depth, row.popped, row.oldest_age_ms, row.jobs_completed, row.jobs_failed, row.jobs_delayed],
        ['0', String(READY), '-1', String(READY - FAIL), String(FAIL), String(DELAYED)],
        `INFO queues ${NAME} depth, popped, oldest_age_ms, jobs_completed, jobs_failed, jobs_delayed`);
});

await s.run('consumers: the idle worker, blocked on its marker, counts; 0 once it is closed', async () => {
    check(worker, 'no worker (the scenario above failed)');
    await waitFor(`${NAME} consumers >= 1`, async () => (await kiteQueue(kite, NAME)).consumers >= 1, 15_000);
    await worker.close();
    worker = null;
    await waitFor(`${NAME} consumers back to 0`, async () => (await kiteQueue(kite, NAME)).consumers === 0, 10_000);
    // KITE QUEUE: the single-queue form.
    const one = toMap(await kite.call('KITE', 'QUEUE', NAME), 'KITE QUEUE');
    eq([String(one.name), Number(one.depth), Number(one.popped)], [NAME, 0, READY], 'KITE QUEUE bull:emails name, depth, popped');
    check(Array.isArray(one.history), `KITE QUEUE history: ${JSON.stringify(one.history)}`);
    eq(await kite.call('KITE', 'QUEUE', 'bull:no-such-queue'), null, 'KITE QUEUE bull:no-such-queue');
});

const close = (x) => Promise.race([Promise.resolve().then(() => x.close()), new Promise((r) => setTimeout(r, 10_000))]);
if (worker) await close(worker);
await close(queue);
kite.disconnect();
process.exit(s.done());
