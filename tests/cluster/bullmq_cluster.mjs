// BullMQ on Redis Cluster through a reshard and a failover (run by
// test_bullmq.py::test_bullmq_reshard_and_failover, which builds 3 masters + 3 replicas,
// moves the queue's slot and SIGKILLs the master serving it while this program runs).
//
// Environment:
//   CLUSTER_PORTS  the masters' ports (comma-separated): the ioredis Cluster startup nodes
//   ALL_PORTS      every node's port (masters and replicas), for the acknowledgement probe
//   TAG            the hash tag's content; the queue prefix is `{TAG}` (BullMQ's documented
//                  way to keep a queue's keys in one slot of a Redis Cluster)
//   JOBS           jobs to add at least (default 3000)
//   RATE           the producer's ceiling, in jobs per second (default 150)
//
// A BullMQ Queue (producer) and a Worker run on two ioredis `Cluster` clients. The producer
// adds jobs one at a time, `{ uid }` in each job's data (uid unique per add attempt), no
// faster than RATE. After each add that returned a job id, the job is *acknowledged* only
// if a probe on a plain connection to the node serving the tag's slot (SET {TAG}:ack, then
// WAIT 1 1000 on the same connection, no reconnect in between: the probe connection never
// reconnects) answered the SET without a redirection and WAIT >= 1. Replication is one
// ordered stream per master, so the probe's WAIT vouches for the add before it that this
// master applied. (During the reshard, an add that ioredis sent with ASKING to the
// importing node can be followed by a probe that the migrating node still answers: that
// acknowledgement is made good by the probes the new owner answers afterwards, before the
// test kills it; test_bullmq.py waits for 300 acknowledged jobs after the reshard.) A job
// that got an id but no acknowledgement (its master died before the probe answered) may be
// lost with its master, as with real Redis's asynchronous replication; it is reported.
// Once the test says KILLED, the probe's SET alone acknowledges (WAIT 0): the promoted
// replica has no replica of its own and nothing else is killed, and a SET answered without
// redirection after the kill can only come from the promoted replica (the probe of an add
// that the killed master answered just before dying goes to the dead node and fails).
//
// Protocol with the test (lines): this program prints `READY`, then `PROGRESS added=<n>
// acked=<n> errors=<n>` every 200 ms; the test writes `RESHARD_START`, `RESHARDED`,
// `KILLED` and `FAILOVER_DONE` to its stdin as it goes (each goes into the timeline with the
// counts at that moment). The producer stops once it has added JOBS jobs,
// FAILOVER_DONE has come and 200 more jobs were acknowledged after it (so jobs flow through
// the whole reshard and failover). Then every acknowledged job must be completed, with its
// uid as return value, and no job failed. A job can run twice: a worker's completion that
// the killed master had not passed on to its replica leaves the job active on the promoted
// replica; once its lock expires (lockDuration 3000) BullMQ's stalled-job check moves it
// back to wait and it runs again. An add that failed on the client side (e.g. "Too many
// Cluster redirections" while the master is down) may still have been applied; it gets
// no id here and its job may complete too. Both are counted and reported.
//
// Prints `PASS bullmq-cluster ...` or `FAIL bullmq-cluster: ...`, then a `SUMMARY {json}`
// line; exits 1 on failure.

import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';
import readline from 'node:readline';
import { createRequire } from 'node:module';

const { sleep, waitFor } = createRequire(import.meta.url)('../frameworks/harness.js');
const { Cluster } = IORedis;

const masterPorts = (process.env.CLUSTER_PORTS || '').split(',').filter(Boolean).map(Number);
const allPorts = (process.env.ALL_PORTS || process.env.CLUSTER_PORTS || '').split(',').filter(Boolean).map(Number);
const TAG = process.env.TAG;
const JOBS = Number(process.env.JOBS || 3000);
const RATE = Number(process.env.RATE || 150);
if (masterPorts.length === 0 || !TAG) {
    console.error('usage: CLUSTER_PORTS=p1,p2,p3 ALL_PORTS=... TAG=bull node bullmq_cluster.mjs');
    process.exit(2);
}
const PREFIX = `{${TAG}}`;
const ACK_KEY = `${PREFIX}:ack`;
const AFTER_FAILOVER = 200;

const t0 = Date.now();
const since = () => `${((Date.now() - t0) / 1000).toFixed(2)} s`;
const timeline = [];
const note = (what) => timeline.push(`${since()} ${what}`);
class Check extends Error {}
const bounded = (p, ms) => Promise.race([Promise.resolve(p).catch((e) => e), sleep(ms)]);

// Everything must be over well before the test's own deadline.
setTimeout(() => {
    console.log(`FAIL bullmq-cluster: did not finish within 420 s (${since()})`);
    console.log('timeline:\n  ' + timeline.join('\n  '));
    process.exit(2);
}, 420_000).unref();

const errors = new Map(); // "where: message" -> count
function noteError(where, e) {
    const msg = `${where}: ${(e && e.message ? e.message : String(e)).slice(0, 160)}`;
    errors.set(msg, (errors.get(msg) || 0) + 1);
}

// Signals from the test.
const signals = {};
readline.createInterface({ input: process.stdin }).on('line', (line) => {
    const what = line.trim();
    if (!what) return;
    signals[what] = { at: Date.now(), added: added.length, acked: acked.size };
    note(`test says ${what} (added ${added.length}, acknowledged ${acked.size})`);
});

// ioredis Cluster as BullMQ documents it: maxRetriesPerRequest null on the node
// connections; startup nodes are the masters (all on 127.0.0.1, no natMap).
const clusterOptions = {
    redisOptions: { maxRetriesPerRequest: null, connectTimeout: 2000 },
    clusterRetryStrategy: (n) => Math.min(100 * n, 1000),
    retryDelayOnFailover: 200,
    retryDelayOnClusterDown: 200,
    retryDelayOnTryAgain: 50,
    maxRedirections: 32,
    slotsRefreshTimeout: 2000,
};
const startup = masterPorts.map((port) => ({ host: '127.0.0.1', port }));
const queueConn = new Cluster(startup, clusterOptions);
const workerConn = new Cluster(startup, clusterOptions);
queueConn.on('error', (e) => noteError('queue cluster', e));
workerConn.on('error', (e) => noteError('worker cluster', e));

const QNAME = 'jobs';
const queue = new Queue(QNAME, { connection: queueConn, prefix: PREFIX });
queue.on('error', (e) => noteError('queue', e));

// Keyed by "id/uid": a job id can be handed out twice when the master that counted it died
// before its replica had the count (the job added with it is then lost, unacknowledged).
const runs = new Map(); // "id/uid" -> times the processor ran that job
const worker = new Worker(QNAME, async (job) => {
    const k = `${job.id}/${job.data.uid}`;
    runs.set(k, (runs.get(k) || 0) + 1);
    return job.data.uid;
}, {
    connection: workerConn,
    prefix: PREFIX,
    concurrency: 8,
    lockDuration: 3000,
    stalledInterval: 1000,
    maxStalledCount: 1000,
});
worker.on('error', (e) => noteError('worker', e));
const stalled = new Set();
worker.on('stalled', (id) => stalled.add(id));

// --- the acknowledgement probe -----------------------------------------------------------
// One plain connection per node, never reconnecting (retryStrategy null): SET and WAIT go
// out together on it, so WAIT counts the replicas that have this connection's SET.
const probeConns = new Map();
let probePort = masterPorts[0];
let probeSeq = 0;
function probeConn(port) {
    let c = probeConns.get(port);
    if (!c || c.status === 'end' || c.status === 'close') {
        if (c) c.disconnect();
        c = new IORedis({
            host: '127.0.0.1', port, retryStrategy: () => null, maxRetriesPerRequest: 0,
            connectTimeout: 1000, commandTimeout: 3000, autoResendUnfulfilledCommands: false,
            enableReadyCheck: false,
        });
        c.on('error', () => {});
        probeConns.set(port, c);
    }
    return c;
}
function nextPort() {
    const i = allPorts.indexOf(probePort);
    probePort = allPorts[(i + 1) % allPorts.length];
}
// true when the node serving the tag's slot applied the SET and (before the kill) a replica
// has it. After the kill the promoted replica is a master without a replica (nothing is
// killed any more): its SET alone acknowledges.
async function probe() {
    const c = probeConn(probePort);
    const replicasWanted = signals.KILLED ? 0 : 1;
    let res;
    try {
        res = await c.pipeline().set(ACK_KEY, String(++probeSeq)).call('WAIT', replicasWanted, 1000).exec();
    } catch (e) {
        noteError(`probe ${probePort}`, e);
        nextPort();
        return false;
    }
    const [setErr] = res[0];
    if (setErr) {
        const m = /^(MOVED|ASK) \d+ ([\d.]+):(\d+)/.exec(setErr.message);
        if (m && m[1] === 'MOVED') probePort = Number(m[3]);
        else {
            noteError(`probe ${probePort}`, setErr);
            if (!m) nextPort();
        }
        return false;
    }
    const [waitErr, replicas] = res[1];
    if (waitErr) {
        noteError(`probe WAIT ${probePort}`, waitErr);
        return false;
    }
    return Number(replicas) >= replicasWanted;
}

// --- the producer ------------------------------------------------------------------------
const added = []; // [job id, uid] in the order the adds returned
const acked = new Map(); // job id -> uid
const ackedKeys = new Set(); // "id/uid"
let attempts = 0;
let addErrors = 0;
let notAcked = 0;

function producerDone() {
    const f = signals.FAILOVER_DONE;
    return added.length >= JOBS && f && acked.size >= f.acked + AFTER_FAILOVER;
}

async function producer(deadline) {
    const gap = 1000 / RATE;
    let next = Date.now();
    while (!producerDone()) {
        if (Date.now() > deadline) {
            throw new Check(`producer: not done before its deadline (added ${added.length}, acknowledged ${acked.size}, `
                + `signals ${Object.keys(signals).join(',') || 'none'})`);
        }
        const wait = next - Date.now();
        if (wait > 0) await sleep(wait);
        next = Math.max(next + gap, Date.now() - 1000);
        const uid = attempts++;
        let job;
        try {
            job = await queue.add('job', { uid }, { attempts: 50 });
        } catch (e) {
            noteError('add', e);
            addErrors++;
            await sleep(50);
            continue;
        }
        added.push([job.id, uid]);
        if (await probe()) {
            acked.set(job.id, uid);
            ackedKeys.add(`${job.id}/${uid}`);
        }
        else notAcked++;
    }
}

let progressTimer = null;
let status = 0;
let summary = {};
try {
    await queue.waitUntilReady();
    await worker.waitUntilReady();
    note('queue and worker ready');
    console.log('READY');
    progressTimer = setInterval(() => {
        console.log(`PROGRESS added=${added.length} acked=${acked.size} errors=${addErrors}`);
    }, 200);
    await producer(Date.now() + 240_000);
    note(`producer done: ${added.length} jobs added (${attempts} attempts, ${addErrors} adds failed), `
        + `${acked.size} acknowledged, ${notAcked} added but not acknowledged`);
    console.log(`PROGRESS added=${added.length} acked=${acked.size} errors=${addErrors}`);
    clearInterval(progressTimer);
    progressTimer = null;

    // Every acknowledged job ends completed.
    const ids = [...acked.keys()];
    let pending = [...new Set(added.map(([id]) => id))];
    let byState = {};
    const stateOf = async (list) => {
        const out = [];
        for (let i = 0; i < list.length; i += 500) {
            out.push(...await Promise.all(list.slice(i, i + 500).map((id) => queue.getJobState(id))));
        }
        return out;
    };
    try {
        await waitFor('every acknowledged job to be completed', async () => {
            const states = await stateOf(pending);
            byState = {};
            const left = [];
            pending.forEach((id, i) => {
                if (states[i] !== 'completed') {
                    left.push(id);
                    (byState[states[i]] ||= []).push(id);
                }
            });
            pending = left;
            // Done when no acknowledged job is left; an unacknowledged one may be lost for
            // good ('unknown') but must not stay waiting or active.
            return left.every((id) => !acked.has(id) && byState.unknown && byState.unknown.includes(id));
        }, 120_000, 500);
    } catch (e) {
        const ackedLeft = pending.filter((id) => acked.has(id));
        throw new Check(`${ackedLeft.length} of ${ids.length} acknowledged jobs not completed (e.g. `
            + `${ackedLeft.slice(0, 10)}); states of the jobs not completed: `
            + `${JSON.stringify(byState).slice(0, 600)} (${e.message})`);
    }
    // An unacknowledged job is lost when its id is gone or now names another job (the id
    // counter went back with the killed master).
    const completed = await queue.getJobs(['completed'], 0, -1);
    const byId = new Map(completed.map((j) => [j.id, j]));
    const lostUnacked = added.filter(([id, uid]) => !ackedKeys.has(`${id}/${uid}`) && !(byId.get(id) && byId.get(id).data.uid === uid));
    note(`all acknowledged jobs completed; ${lostUnacked.length} unacknowledged jobs are gone`);

    // Completed jobs carry their uid as data and return value; none failed.
    const wrong = [];
    for (const [id, uid] of acked) {
        const job = byId.get(id);
        if (!job) wrong.push(`${id}: not in the completed list`);
        else if (job.data.uid !== uid || job.returnvalue !== uid) {
            wrong.push(`${id}: data ${JSON.stringify(job.data)}, returnvalue ${JSON.stringify(job.returnvalue)}, want ${uid}`);
        }
        if (wrong.length >= 10) break;
    }
    if (wrong.length) throw new Check(`acknowledged jobs with the wrong data or return value: ${wrong.join('; ')}`);
    const failedCount = await queue.getFailedCount();
    if (failedCount) {
        const failed = await queue.getJobs(['failed'], 0, 5);
        throw new Check(`${failedCount} jobs failed, e.g. ${failed.map((j) => `${j.id}: ${j.failedReason}`).join('; ')}`);
    }
    // Every completed job is one the producer tried to add (a uid never sent would be
    // corruption).
    const strangers = completed.filter((j) => !(Number.isInteger(j.data.uid) && j.data.uid >= 0 && j.data.uid < attempts));
    if (strangers.length) throw new Check(`completed jobs with a uid never added: ${strangers.slice(0, 5).map((j) => JSON.stringify(j.data))}`);
    const notRun = [...acked].filter(([id, uid]) => !runs.has(`${id}/${uid}`));
    if (notRun.length) throw new Check(`${notRun.length} completed acknowledged jobs never ran in this worker: ${notRun.slice(0, 10).map(([id]) => id)}`);

    const addedKeys = new Set(added.map(([id, uid]) => `${id}/${uid}`));
    const reruns = [...runs.values()].filter((n) => n > 1).length;
    const withoutId = completed.filter((j) => !addedKeys.has(`${j.id}/${j.data.uid}`)).length;
    const perUid = new Map();
    for (const j of completed) perUid.set(j.data.uid, (perUid.get(j.data.uid) || 0) + 1);
    const uidTwice = [...perUid.values()].filter((n) => n > 1).length;
    summary = {
        attempts, added: added.length, acked: acked.size, notAcked, addErrors,
        completed: completed.length, lostUnacked: lostUnacked.length,
        reruns, stalled: stalled.size, completedWithoutId: withoutId, uidInTwoJobs: uidTwice,
        lostIds: lostUnacked.slice(0, 20).map(([id]) => id),
    };
    console.log(`PASS bullmq-cluster: ${acked.size} acknowledged jobs of ${added.length} added all completed; `
        + `${lostUnacked.length} unacknowledged lost, ${reruns} jobs ran twice or more, ${stalled.size} stalled, `
        + `${withoutId} completed jobs whose add had failed, ${uidTwice} uids in two completed jobs (${since()})`);
} catch (e) {
    status = 1;
    summary = { attempts, added: added.length, acked: acked.size, notAcked, addErrors };
    console.log(`FAIL bullmq-cluster: ${e instanceof Check || e.constructor.name === 'Failure' ? e.message : e.stack}`);
}
if (progressTimer) clearInterval(progressTimer);
console.log(`SUMMARY ${JSON.stringify(summary)}`);
console.log('timeline:\n  ' + timeline.join('\n  '));
if (errors.size) {
    console.log('errors seen (count, where: message):');
    for (const [m, c] of [...errors].sort((a, b) => b[1] - a[1]).slice(0, 20)) console.log(`  ${c} × ${m}`);
}
await bounded(worker.close(true), 5000);
await bounded(queue.close(), 5000);
for (const c of probeConns.values()) c.disconnect();
queueConn.disconnect();
workerConn.disconnect();
process.exit(status);
