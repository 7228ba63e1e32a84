// A BullMQ deployment moves from redis-server to Kite while it runs (run by
// test_migration.py::test_bullmq_migration, which starts both servers).
//
// Environment: REDIS_PORT (redis-server with data), KITE_PORT (a fresh Kite).
//
// On Redis: a queue with waiting, prioritized and delayed jobs (the delay runs past the
// switch), a worker (concurrency 4, short lockDuration and stalledInterval) and a producer
// adding jobs one at a time; an add counts as acknowledged when its promise resolved (the
// producer's connection has a 500 ms commandTimeout, so an add held by CLIENT PAUSE is not
// acknowledged and is retried against the current server). The recipe: REPLICAOF <redis>
// on Kite, master_link_status:up; CLIENT PAUSE 60000 WRITE on Redis; Kite's
// slave_repl_offset equals Redis's master_repl_offset; REPLICAOF NO ONE on Kite; producer
// and worker move to Kite (the worker left on Redis is closed: its jobs in flight stay
// active on Kite until their locks expire and Kite's worker takes them as stalled). At the
// end every acknowledged job (and every seeded one) is completed on Kite with its return
// value.
//
// Prints "PASS bullmq-migration ..." or "FAIL bullmq-migration: ..."; exits 1 on failure.

import { Queue, Worker, Job } from 'bullmq';
import IORedis from 'ioredis';
import { createRequire } from 'node:module';

// The polling helpers every Node framework suite shares.
const { sleep, waitFor } = createRequire(import.meta.url)('../frameworks/harness.js');

const redisPort = Number(process.env.REDIS_PORT);
const kitePort = Number(process.env.KITE_PORT);
if (!redisPort || !kitePort) {
    console.error('usage: REDIS_PORT=p KITE_PORT=q node bullmq_migration.mjs');
    process.exit(2);
}

const t0 = Date.now();
const since = () => `${((Date.now() - t0) / 1000).toFixed(2)} s`;
const timeline = [];
const note = (what) => timeline.push(`${since()} ${what}`);
class Check extends Error {}
const bounded = (p, ms) => Promise.race([Promise.resolve(p).catch((e) => e), sleep(ms)]);

const errors = new Map();
function noteError(e) {
    const msg = (e && e.message ? e.message : String(e)).slice(0, 160);
    errors.set(msg, (errors.get(msg) || 0) + 1);
}

const info = async (client) => {
    const out = {};
    for (const line of (await client.info('replication')).split('\r\n')) {
        const i = line.indexOf(':');
        if (i > 0) out[line.slice(0, i)] = line.slice(i + 1);
    }
    return out;
};

const conn = (port, extra = {}) => ({ host: '127.0.0.1', port, maxRetriesPerRequest: null, ...extra });
const NAME = 'migrating';
const workerOpts = { concurrency: 4, lockDuration: 2000, stalledInterval: 500, maxStalledCount: 1000 };
const processor = async (job) => {
    await sleep(2);
    return job.data.n;
};

const expected = new Map(); // job id -> n: seeded and acknowledged jobs
const admin = { redis: new IORedis(conn(redisPort)), kite: new IORedis(conn(kitePort)) };
const queues = {
    // The producer's queues: a 500 ms command timeout (a paused add is not acknowledged).
    redis: new Queue(NAME, { connection: conn(redisPort, { maxRetriesPerRequest: 1, commandTimeout: 500 }) }),
    kite: new Queue(NAME, { connection: conn(kitePort, { maxRetriesPerRequest: 1, commandTimeout: 500 }) }),
};
for (const q of Object.values(queues)) q.on('error', noteError);
let target = 'redis';
let stop = false;
let notAcked = 0;
const ackedOn = { redis: 0, kite: 0 };

async function producer() {
    let n = 100000;
    while (!stop) {
        const where = target;
        try {
            const job = await queues[where].add('produced', { n }, { attempts: 50 });
            expected.set(job.id, n);
            ackedOn[where]++;
            n++;
        } catch (e) {
            noteError(e);
            notAcked++;
            await sleep(10);
        }
    }
}

let status = 0;
const workers = [];
try {
    // Seed: 300 waiting, 50 prioritized, 50 delayed past the switch.
    const seed = [];
    for (let n = 0; n < 400; n++) {
        const opts = n < 300 ? {} : n < 350 ? { priority: 1 + (n % 7) } : { delay: 2500 };
        seed.push({ name: 'seeded', data: { n }, opts: { attempts: 50, ...opts } });
    }
    const seeded = await queues.redis.addBulk(seed);
    seeded.forEach((j, i) => expected.set(j.id, seed[i].data.n));
    note(`seeded ${seeded.length} jobs on Redis`);

    const wRedis = new Worker(NAME, processor, { connection: conn(redisPort), ...workerOpts });
    wRedis.on('error', noteError);
    workers.push(wRedis);
    const prod = producer();
    await waitFor('100 jobs acknowledged by Redis', () => ackedOn.redis >= 100, 30_000);

    // 1. Kite follows Redis.
    await admin.kite.call('REPLICAOF', '127.0.0.1', String(redisPort));
    await waitFor("Kite's master_link_status:up", async () => (await info(admin.kite)).master_link_status === 'up', 60_000);
    note('Kite replicating');
    const before = ackedOn.redis;
    await waitFor('100 more jobs acknowledged by Redis while Kite replicates', () => ackedOn.redis >= before + 100, 30_000);

    // 2. Pause writes on Redis; Kite catches up.
    await admin.redis.call('CLIENT', 'PAUSE', '60000', 'WRITE');
    note(`CLIENT PAUSE WRITE on Redis after ${ackedOn.redis} acknowledged adds`);
    let offsets = {};
    await waitFor("Kite's slave_repl_offset to equal Redis's master_repl_offset", async () => {
        const r = await info(admin.redis);
        const k = await info(admin.kite);
        offsets = { redis: r.master_repl_offset, kite: k.slave_repl_offset };
        return r.master_repl_offset === k.slave_repl_offset;
    }, 30_000).catch((e) => {
        throw new Check(`${e.message}; offsets ${JSON.stringify(offsets)}`);
    });
    note(`offsets equal (${JSON.stringify(offsets)})`);

    // 3. Kite becomes the master; clients move.
    await admin.kite.call('REPLICAOF', 'NO', 'ONE');
    const role = await admin.kite.call('ROLE');
    if (role[0] !== 'master') throw new Check(`ROLE on Kite after REPLICAOF NO ONE: ${JSON.stringify(role)}`);
    target = 'kite';
    await bounded(wRedis.close(true), 2000);
    const wKite = new Worker(NAME, processor, { connection: conn(kitePort), ...workerOpts });
    wKite.on('error', noteError);
    workers.push(wKite);
    note('switched to Kite');
    await waitFor('200 jobs acknowledged by Kite', () => ackedOn.kite >= 200, 30_000);
    stop = true;
    await prod;
    note(`producer stopped: acknowledged ${ackedOn.redis} on Redis, ${ackedOn.kite} on Kite, ${notAcked} adds not acknowledged`);

    // Every seeded and acknowledged job ends completed on Kite with its return value.
    const check = new Queue(NAME, { connection: conn(kitePort) });
    try {
        let pending = [...expected.keys()];
        let byState = {};
        await waitFor('every seeded and acknowledged job to be completed on Kite', async () => {
            const states = await Promise.all(pending.map((id) => check.getJobState(id)));
            byState = {};
            pending = pending.filter((id, i) => {
                if (states[i] === 'completed') return false;
                (byState[states[i]] ||= []).push(id);
                return true;
            });
            return pending.length === 0;
        }, 60_000, 250).catch((e) => {
            throw new Check(`${pending.length} of ${expected.size} jobs not completed on Kite; by state: `
                + `${JSON.stringify(byState).slice(0, 400)} (${e.message})`);
        });
        const wrong = [];
        for (const [id, n] of expected) {
            const job = await Job.fromId(check, id);
            if (!job || job.data.n !== n || job.returnvalue !== n) {
                wrong.push(`${id}: ${job ? `data ${JSON.stringify(job.data)}, returnvalue ${JSON.stringify(job.returnvalue)}` : 'missing'}, want ${n}`);
                if (wrong.length >= 10) break;
            }
        }
        if (wrong.length) throw new Check(`jobs with the wrong data or return value on Kite: ${wrong.join('; ')}`);
        console.log(`PASS bullmq-migration: ${expected.size} jobs (${seeded.length} seeded, ${ackedOn.redis} added on Redis, `
            + `${ackedOn.kite} on Kite) all completed on Kite (${since()})`);
    } finally {
        await bounded(check.close(), 2000);
    }
} catch (e) {
    status = 1;
    stop = true;
    console.log(`FAIL bullmq-migration: ${e instanceof Check || e.constructor.name === 'Failure' ? e.message : e.stack}`);
}
console.log('timeline:\n  ' + timeline.join('\n  '));
if (errors.size) {
    console.log('errors seen (count, message):');
    for (const [m, c] of [...errors].slice(0, 12)) console.log(`  ${c} × ${m}`);
}
for (const w of workers) await bounded(w.close(true), 2000);
process.exit(status);
