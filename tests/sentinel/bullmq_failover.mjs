// BullMQ through a Sentinel failover (run by test_failover.py::test_bullmq_failover, which
// starts a Kite master, two Kite replicas and three Sentinels, and afterwards checks the
// promotion, the other replica following, and the configuration files).
//
// Environment: SENTINEL_PORTS (comma-separated), MASTER_PID and MASTER_PORT of the master.
//
// A BullMQ Queue (producer) and Worker connect with ioredis in Sentinel mode
// (`sentinels`, `name: 'mymaster'`). The producer adds jobs one at a time; after each add
// it sends WAIT 1 1000 on the same ioredis connection and counts the job as acknowledged
// only when WAIT answered >= 1 and the connection was not closed in between (ioredis
// resends a command in flight on a new connection after a reconnect, and WAIT there would
// vouch for nothing). A job whose add or WAIT failed is added again (a new job). After 150
// acknowledged jobs this program kills the master with SIGKILL; the producer and the
// worker carry on through Sentinel's failover until 150 more jobs are acknowledged. Then
// every acknowledged job must end up completed (with its return value) on the new master:
// a completion the dead master did not pass on is redone by the worker once the job's
// lock expires (short lockDuration and stalledInterval).
//
// Prints "PASS bullmq-failover ..." or "FAIL bullmq-failover: ..."; exits 1 on failure.

import { Queue, Worker, Job } from 'bullmq';
import IORedis from 'ioredis';
import { createRequire } from 'node:module';

// The polling helpers every Node framework suite shares.
const { sleep, waitFor } = createRequire(import.meta.url)('../frameworks/harness.js');

const sentinelPorts = (process.env.SENTINEL_PORTS || '').split(',').filter(Boolean).map(Number);
const masterPid = Number(process.env.MASTER_PID);
const masterPort = Number(process.env.MASTER_PORT);
if (sentinelPorts.length === 0 || !masterPid || !masterPort) {
    console.error('usage: SENTINEL_PORTS=p1,p2,p3 MASTER_PID=pid MASTER_PORT=port node bullmq_failover.mjs');
    process.exit(2);
}

const BEFORE = 150; // acknowledged jobs before the kill
const AFTER = 150; // acknowledged jobs after the kill
const t0 = Date.now();
const since = () => `${((Date.now() - t0) / 1000).toFixed(2)} s`;
const timeline = [];
const note = (what) => timeline.push(`${since()} ${what}`);
class Check extends Error {}

const bounded = (p, ms) => Promise.race([Promise.resolve(p).catch((e) => e), sleep(ms)]);

const errors = new Map(); // message -> count
function noteError(e) {
    const msg = (e && e.message ? e.message : String(e)).slice(0, 160);
    errors.set(msg, (errors.get(msg) || 0) + 1);
}

// The connection options a Sentinel deployment of BullMQ uses (ioredis's documentation:
// reconnect on READONLY, so a client left on a demoted master finds the new one).
const connection = {
    sentinels: sentinelPorts.map((port) => ({ host: '127.0.0.1', port })),
    name: 'mymaster',
    maxRetriesPerRequest: null,
    retryStrategy: (n) => Math.min(50 * n, 500),
    sentinelRetryStrategy: (n) => Math.min(50 * n, 500),
    reconnectOnError: (err) => (err.message.startsWith('READONLY') ? 2 : false),
};

const name = `failover-${process.pid}`;
const queue = new Queue(name, { connection });
queue.on('error', noteError);
const completedEvents = new Set();
const worker = new Worker(name, async (job) => job.data.n, {
    connection,
    concurrency: 8,
    lockDuration: 3000,
    stalledInterval: 1000,
    maxStalledCount: 1000,
});
worker.on('error', noteError);
worker.on('completed', (job) => completedEvents.add(job.id));

const acked = new Map(); // job id -> n
let ackedAtKill = -1;
let notAcked = 0;
let killed = false;

async function producer(client, deadline) {
    let epoch = 0;
    for (const ev of ['close', 'reconnecting', 'end']) client.on(ev, () => epoch++);
    for (let n = 0; ; n++) {
        for (;;) {
            if (Date.now() > deadline) throw new Check(`producer: job ${n} not acknowledged before the deadline`);
            const e0 = epoch;
            try {
                const job = await queue.add('job', { n }, { attempts: 50 });
                const replicas = await client.call('WAIT', 1, 1000);
                if (Number(replicas) >= 1 && epoch === e0) {
                    acked.set(job.id, n);
                    break;
                }
                notAcked++;
            } catch (e) {
                noteError(e);
                notAcked++;
                await sleep(20);
            }
        }
        if (!killed && acked.size >= BEFORE) {
            killed = true;
            ackedAtKill = acked.size;
            process.kill(masterPid, 'SIGKILL');
            note(`master (pid ${masterPid}, port ${masterPort}) killed with SIGKILL after ${acked.size} acknowledged jobs`);
        }
        if (killed && acked.size - ackedAtKill >= AFTER) return;
    }
}

let status = 0;
try {
    await queue.waitUntilReady();
    await worker.waitUntilReady();
    const client = await queue.getBackend().client;
    note('queue and worker ready');
    await producer(client, Date.now() + 90_000);
    note(`producer done: ${acked.size} acknowledged (${acked.size - ackedAtKill} after the kill), ${notAcked} adds not acknowledged`);

    // The sentinels name another master.
    const s = new IORedis({ host: '127.0.0.1', port: sentinelPorts[0], lazyConnect: true, maxRetriesPerRequest: 1 });
    try {
        const [, port] = await s.call('SENTINEL', 'get-master-addr-by-name', 'mymaster');
        if (Number(port) === masterPort) throw new Check(`Sentinel still names the killed master ${masterPort}`);
        note(`Sentinel names port ${port}`);
    } finally {
        s.disconnect();
    }

    // Every acknowledged job ends completed on the new master, with its return value.
    const ids = [...acked.keys()];
    let pending = ids;
    let byState = {};
    try {
        await waitFor('every acknowledged job to be completed', async () => {
            const states = await Promise.all(pending.map((id) => queue.getJobState(id)));
            byState = {};
            const left = [];
            pending.forEach((id, i) => {
                if (states[i] !== 'completed') {
                    left.push(id);
                    (byState[states[i]] ||= []).push(id);
                }
            });
            pending = left;
            return left.length === 0;
        }, 60_000, 250);
    } catch (e) {
        throw new Check(`${pending.length} of ${ids.length} acknowledged jobs not completed on the new master; `
            + `their states: ${JSON.stringify(byState).slice(0, 400)} (${e.message})`);
    }
    const wrong = [];
    for (const id of ids) {
        const job = await Job.fromId(queue, id);
        if (!job) wrong.push(`${id}: missing`);
        else if (job.data.n !== acked.get(id) || job.returnvalue !== acked.get(id)) {
            wrong.push(`${id}: data ${JSON.stringify(job.data)}, returnvalue ${JSON.stringify(job.returnvalue)}, want ${acked.get(id)}`);
        }
        if (wrong.length >= 10) break;
    }
    if (wrong.length) throw new Check(`acknowledged jobs with the wrong data or return value: ${wrong.join('; ')}`);
    const notSeen = ids.filter((id) => !completedEvents.has(id));
    if (notSeen.length) throw new Check(`${notSeen.length} completed jobs never fired 'completed' on the worker: ${notSeen.slice(0, 10)}`);
    console.log(`PASS bullmq-failover: ${ids.length} acknowledged jobs (${acked.size - ackedAtKill} after the kill) all completed (${since()})`);
} catch (e) {
    status = 1;
    console.log(`FAIL bullmq-failover: ${e instanceof Check || e.constructor.name === 'Failure' ? e.message : e.stack}`);
}
console.log('timeline:\n  ' + timeline.join('\n  '));
if (errors.size) {
    console.log('errors seen (count, message):');
    for (const [m, c] of [...errors].slice(0, 12)) console.log(`  ${c} × ${m}`);
}
await bounded(worker.close(true), 5000);
await bounded(queue.close(), 5000);
process.exit(status);
