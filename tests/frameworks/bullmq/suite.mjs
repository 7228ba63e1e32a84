// BullMQ end-to-end suite: drives the real BullMQ (with ioredis) against one server and
// checks end results of each scenario. Usage: node suite.mjs REDIS_URL PREFIX [SCENARIO...]
// Prints one "PASS name" or "FAIL name: reason" line per scenario; exits 1 on any failure.
// REDIS_URL may carry user:password@ and the rediss:// scheme (TLS; see connection.mjs).
//
// Every wait is a bounded poll with a generous deadline; assertions are on outcomes
// (each job processed exactly once, counts, values, order), never on speed.

import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { Queue, Worker, FlowProducer, QueueEvents, Job } from 'bullmq';
import Redis from 'ioredis';
import { connectionFor } from './connection.mjs';

const [url, prefix, ...only] = process.argv.slice(2);
if (!url || !prefix) {
    console.error('usage: node suite.mjs REDIS_URL PREFIX [SCENARIO...]');
    process.exit(2);
}
const connection = connectionFor(url);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SCENARIO_DEADLINE_MS = 90_000;

// ---------------------------------------------------------------------------------------
// helpers

class Check extends Error {}

function check(cond, msg) {
    if (!cond) throw new Check(msg);
}

function eq(actual, expected, what) {
    const a = JSON.stringify(actual);
    const e = JSON.stringify(expected);
    if (a !== e) throw new Check(`${what}: got ${a}, want ${e}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `fn` (sync or async) until it returns truthy; fails with `what` after `ms`.
async function waitFor(what, fn, ms = 60_000, every = 50) {
    const end = Date.now() + ms;
    let last;
    for (;;) {
        try {
            last = await fn();
            if (last) return last;
        } catch (e) {
            last = e;
        }
        if (Date.now() > end) {
            const detail = last instanceof Error ? ` (last error: ${last.message})` : '';
            throw new Check(`timed out after ${ms} ms waiting for ${what}${detail}`);
        }
        await sleep(every);
    }
}

// Per-scenario resources, closed when the scenario ends (pass or fail).
class Scope {
    constructor(name) {
        this.name = name;
        this.items = [];
        this.errors = [];
    }
    track(x) {
        this.items.push(x);
        if (typeof x.on === 'function') {
            // BullMQ emits 'error' for failed commands (e.g. a script the server refused);
            // keep them to report, and so they don't crash the process.
            x.on('error', (e) => {
                if (this.errors.length < 20) this.errors.push(e && e.message ? e.message : String(e));
            });
        }
        return x;
    }
    queue(name, opts = {}) {
        return this.track(new Queue(name, { connection, prefix, ...opts }));
    }
    worker(name, fn, opts = {}) {
        return this.track(new Worker(name, fn, { connection, prefix, ...opts }));
    }
    flow() {
        return this.track(new FlowProducer({ connection, prefix }));
    }
    events(name) {
        return this.track(new QueueEvents(name, { connection, prefix }));
    }
    async close() {
        // Workers first (they hold the blocking connections), then everything else; each
        // group in parallel and bounded, so a hung server cannot stall the suite here.
        const closeAll = (xs) =>
            Promise.race([Promise.allSettled(xs.map((x) => Promise.resolve().then(() => x.close()))), sleep(10_000)]);
        await closeAll(this.items.filter((x) => x instanceof Worker));
        await closeAll(this.items.filter((x) => !(x instanceof Worker)));
    }
}

// Every scenario gets unique queue names so leftovers of one cannot disturb another.
let qseq = 0;
const qname = (base) => `${base}-${++qseq}`;

// Records the jobs a processor saw; `exactlyOnce` checks the set against what was added.
class Seen {
    constructor() {
        this.count = new Map();
        this.order = [];
    }
    add(id) {
        this.count.set(id, (this.count.get(id) || 0) + 1);
        this.order.push(id);
    }
    get size() {
        return this.count.size;
    }
    exactlyOnce(expectedIds, what) {
        const dups = [...this.count].filter(([, n]) => n > 1).map(([id]) => id);
        check(dups.length === 0, `${what}: ${dups.length} jobs processed more than once (e.g. ${dups.slice(0, 5)})`);
        const want = new Set(expectedIds.map(String));
        const missing = [...want].filter((id) => !this.count.has(id));
        check(missing.length === 0, `${what}: ${missing.length} jobs never processed (e.g. ${missing.slice(0, 5)})`);
        const extra = [...this.count.keys()].filter((id) => !want.has(id));
        check(extra.length === 0, `${what}: unexpected jobs processed (${extra.slice(0, 5)})`);
    }
}

async function scanKeys(pattern) {
    const r = new Redis({ ...connection, lazyConnect: false, maxRetriesPerRequest: 3 });
    try {
        const keys = [];
        let cursor = '0';
        do {
            const [next, batch] = await r.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
            keys.push(...batch);
            cursor = next;
        } while (cursor !== '0');
        return keys;
    } finally {
        r.disconnect();
    }
}

// Names the BullMQ script (its file in bullmq's commands dir, e.g. addStandardJob-9) that
// an error message refers to, by the SHA1 of an EVALSHA or the opening text of an EVAL.
const scriptIndex = (() => {
    const bySha = new Map();
    const byText = [];
    try {
        const scripts = createRequire(import.meta.url)('bullmq/dist/cjs/scripts');
        for (const { name, content, keys } of Object.values(scripts)) {
            const file = `${name}-${keys}`;
            bySha.set(createHash('sha1').update(content).digest('hex'), file);
            byText.push([content.replace(/\s+/g, ' ').slice(0, 100), file]);
        }
    } catch {
        // layout changed: messages just go unannotated
    }
    return { bySha, byText };
})();

function nameScripts(msg) {
    const names = new Set();
    for (const m of msg.matchAll(/\b[0-9a-f]{40}\b/g)) if (scriptIndex.bySha.has(m[0])) names.add(scriptIndex.bySha.get(m[0]));
    const flat = msg.replace(/\s+/g, ' ');
    for (const [text, file] of scriptIndex.byText) {
        const i = flat.indexOf('--[[');
        if (i >= 0) {
            const piece = flat.slice(i, i + 60);
            if (text.startsWith(piece.replace(/'.*$/, '').trimEnd())) names.add(file);
        }
    }
    return names.size ? `[script ${[...names].join(', ')}] ${msg}` : msg;
}

// Glob-escapes a key prefix for SCAN MATCH.
const globEscape = (s) => s.replace(/[*?[\]\\]/g, (c) => '\\' + c);

// ---------------------------------------------------------------------------------------
// scenarios

const scenarios = [];
const scenario = (name, fn) => scenarios.push({ name, fn });

scenario('add-and-addBulk', async (s) => {
    const name = qname('add');
    const q = s.queue(name);
    const single = [];
    for (let i = 0; i < 50; i++) single.push(await q.add('one', { i }));
    const bulk = await q.addBulk(
        Array.from({ length: 150 }, (_, i) => ({ name: 'bulk', data: { i }, opts: i % 3 === 0 ? { jobId: `custom-${i}` } : {} })),
    );
    eq(bulk.length, 150, 'addBulk returned jobs');
    const ids = [...single, ...bulk].map((j) => j.id);
    eq(new Set(ids).size, 200, 'distinct job ids');
    check(bulk[3].id === 'custom-3', `custom jobId kept: got ${bulk[3].id}`);
    // A duplicate custom jobId adds nothing.
    await q.add('bulk', { i: 999 }, { jobId: 'custom-3' });
    const counts = await q.getJobCounts('waiting', 'active', 'delayed');
    eq(counts, { waiting: 200, active: 0, delayed: 0 }, 'counts after add');
    const j = await q.getJob('custom-3');
    eq(j.data, { i: 3 }, 'data of custom-3 (duplicate add must not overwrite)');
    eq(j.name, 'bulk', 'name of custom-3');
    const w = await q.getWaiting(0, -1);
    eq(w.map((x) => x.id).sort(), [...ids].sort(), 'getWaiting ids');
});

scenario('workers-concurrency-1-and-50', async (s) => {
    // Three queues processed at once: one at concurrency 1, one at 50, one with two
    // competing workers at 50 each.
    const specs = [
        { name: qname('c1'), n: 500, workers: [1] },
        { name: qname('c50'), n: 2000, workers: [50] },
        { name: qname('c2x50'), n: 1500, workers: [50, 50] },
    ];
    for (const sp of specs) {
        const q = s.queue(sp.name);
        sp.q = q;
        sp.seen = new Seen();
        sp.ids = [];
        // Half with addBulk in chunks, half with concurrent single adds.
        const half = Math.floor(sp.n / 2);
        for (let off = 0; off < half; off += 250) {
            const chunk = Array.from({ length: Math.min(250, half - off) }, (_, k) => ({ name: 'j', data: { n: off + k } }));
            for (const j of await q.addBulk(chunk)) sp.ids.push(j.id);
        }
        for (let off = half; off < sp.n; off += 100) {
            const batch = [];
            for (let k = off; k < Math.min(off + 100, sp.n); k++) batch.push(q.add('j', { n: k }));
            for (const j of await Promise.all(batch)) sp.ids.push(j.id);
        }
        eq(new Set(sp.ids).size, sp.n, `${sp.name}: distinct ids`);
    }
    let maxActive = 0;
    for (const sp of specs) {
        let active = 0;
        for (const c of sp.workers) {
            s.worker(
                sp.name,
                async (job) => {
                    active++;
                    maxActive = Math.max(maxActive, active);
                    sp.seen.add(job.id);
                    if (job.data.n % 7 === 0) await sleep(1);
                    active--;
                    return job.data.n * 2;
                },
                { concurrency: c },
            );
        }
    }
    for (const sp of specs) {
        await waitFor(`${sp.name}: ${sp.n} completed`, async () => (await sp.q.getCompletedCount()) >= sp.n, 90_000, 200);
    }
    for (const sp of specs) {
        sp.seen.exactlyOnce(sp.ids, sp.name);
        const counts = await sp.q.getJobCounts('completed', 'failed', 'waiting', 'active', 'delayed');
        eq(counts, { completed: sp.n, failed: 0, waiting: 0, active: 0, delayed: 0 }, `${sp.name}: counts`);
        // Return values stored with the jobs.
        const sample = await sp.q.getCompleted(0, 49);
        for (const j of sample) eq(j.returnvalue, j.data.n * 2, `${sp.name}: returnvalue of job ${j.id}`);
    }
});

scenario('concurrency-1-is-serial', async (s) => {
    const name = qname('serial');
    const q = s.queue(name);
    await q.addBulk(Array.from({ length: 40 }, (_, i) => ({ name: 'j', data: { i } })));
    let active = 0;
    let max = 0;
    const seen = new Seen();
    s.worker(
        name,
        async (job) => {
            active++;
            max = Math.max(max, active);
            await sleep(2);
            seen.add(job.data.i);
            active--;
        },
        { concurrency: 1 },
    );
    await waitFor('40 completed', async () => (await q.getCompletedCount()) === 40);
    eq(max, 1, 'max jobs in flight at concurrency 1');
    // FIFO order at concurrency 1.
    eq(seen.order, Array.from({ length: 40 }, (_, i) => i), 'processing order');
});

scenario('delayed-jobs', async (s) => {
    const name = qname('delayed');
    const q = s.queue(name);
    const delays = [0, 300, 600, 900, 1200, 1500, 1800, 2000];
    const jobs = [];
    for (let r = 0; r < 3; r++) for (const d of delays) jobs.push(await q.add('d', { d, r }, { delay: d }));
    const delayedNow = await q.getDelayedCount();
    check(delayedNow >= 15, `delayed count right after add: ${delayedNow}, want at least 15`);
    const seen = new Seen();
    const early = [];
    s.worker(
        name,
        async (job) => {
            seen.add(job.id);
            // Not before its delay (10 ms allowance for clock granularity).
            if (Date.now() < job.timestamp + job.data.d - 10) early.push(`${job.id}: ${job.timestamp + job.data.d - Date.now()} ms early`);
        },
        { concurrency: 10 },
    );
    await waitFor('all delayed jobs completed', async () => (await q.getCompletedCount()) === jobs.length, 60_000, 100);
    seen.exactlyOnce(
        jobs.map((j) => j.id),
        'delayed',
    );
    eq(early, [], 'jobs processed before their delay');
    eq(await q.getDelayedCount(), 0, 'delayed count at the end');
});

scenario('priorities', async (s) => {
    const name = qname('prio');
    const q = s.queue(name);
    // Added while no worker runs; then one worker at concurrency 1 must take them by
    // priority (1 = highest), FIFO within a priority, jobs without priority first.
    const added = [];
    let seq = 0;
    for (let i = 0; i < 60; i++) {
        const p = [3, 1, 7, 2, 0, 5][i % 6];
        const job = await q.add('p', { p, seq: seq++ }, p ? { priority: p } : {});
        added.push({ id: job.id, p, seq: job.data.seq });
    }
    const c = await q.getJobCounts('prioritized', 'waiting');
    eq(c, { prioritized: 50, waiting: 10 }, 'prioritized/waiting counts');
    const seen = new Seen();
    s.worker(name, async (job) => seen.add(job.id), { concurrency: 1 });
    await waitFor('60 completed', async () => (await q.getCompletedCount()) === 60);
    const expected = [...added].sort((a, b) => a.p - b.p || a.seq - b.seq).map((a) => a.id);
    seen.exactlyOnce(expected, 'priorities');
    eq(seen.order, expected, 'processing order by priority');
});

scenario('retries-backoff', async (s) => {
    const name = qname('retry');
    const q = s.queue(name);
    const attemptsAt = new Map(); // job id -> [times]
    s.worker(
        name,
        async (job) => {
            const list = attemptsAt.get(job.id) || [];
            list.push(Date.now());
            attemptsAt.set(job.id, list);
            if (job.data.kind === 'always') throw new Error(`boom ${job.attemptsMade}`);
            if (job.data.kind === 'twice' && list.length <= 2) throw new Error('not yet');
            return 'ok';
        },
        { concurrency: 5 },
    );
    const exp = await q.add('x', { kind: 'always' }, { attempts: 4, backoff: { type: 'exponential', delay: 100 } });
    const fixed = await q.add('x', { kind: 'always' }, { attempts: 3, backoff: { type: 'fixed', delay: 200 } });
    const twice = await q.add('x', { kind: 'twice' }, { attempts: 5, backoff: { type: 'fixed', delay: 100 } });
    const once = await q.add('x', { kind: 'always' }); // attempts default 1
    const expectState = async (job, state) =>
        waitFor(`job ${job.id} ${state}`, async () => (await q.getJobState(job.id)) === state, 60_000, 100);
    await expectState(exp, 'failed');
    await expectState(fixed, 'failed');
    await expectState(twice, 'completed');
    await expectState(once, 'failed');

    const e = await q.getJob(exp.id);
    eq(e.attemptsMade, 4, 'exponential: attemptsMade');
    eq(e.failedReason, 'boom 3', 'exponential: failedReason');
    eq(e.stacktrace.length > 0, true, 'exponential: stacktrace saved');
    eq(attemptsAt.get(exp.id).length, 4, 'exponential: processor runs');
    const f = await q.getJob(fixed.id);
    eq(f.attemptsMade, 3, 'fixed: attemptsMade');
    eq(attemptsAt.get(fixed.id).length, 3, 'fixed: processor runs');
    const t = await q.getJob(twice.id);
    eq(t.returnvalue, 'ok', 'twice: returnvalue');
    eq(attemptsAt.get(twice.id).length, 3, 'twice: processor runs');
    eq(t.attemptsMade, 3, 'twice: attemptsMade');
    const o = await q.getJob(once.id);
    eq(o.attemptsMade, 1, 'no retries: attemptsMade');
    eq(attemptsAt.get(once.id).length, 1, 'no retries: processor runs');

    // Backoff is a lower bound on the gap between attempts (small allowance for clocks).
    const gaps = (id) => attemptsAt.get(id).slice(1).map((t2, i) => t2 - attemptsAt.get(id)[i]);
    gaps(exp.id).forEach((g, i) => check(g >= 100 * 2 ** i - 15, `exponential: gap ${i + 1} was ${g} ms, want >= ${100 * 2 ** i}`));
    gaps(fixed.id).forEach((g, i) => check(g >= 200 - 15, `fixed: gap ${i + 1} was ${g} ms, want >= 200`));
    eq(await q.getJobCounts('failed', 'completed', 'delayed', 'waiting'), { failed: 3, completed: 1, delayed: 0, waiting: 0 }, 'counts');
});

scenario('rate-limiter', async (s) => {
    const name = qname('limit');
    const q = s.queue(name);
    const n = 60;
    const jobs = await q.addBulk(Array.from({ length: n }, (_, i) => ({ name: 'r', data: { i } })));
    const seen = new Seen();
    // Two workers sharing the queue's limit.
    for (let k = 0; k < 2; k++) {
        s.worker(name, async (job) => seen.add(job.id), { concurrency: 5, limiter: { max: 10, duration: 250 } });
    }
    await waitFor(`${n} completed`, async () => (await q.getCompletedCount()) === n, 60_000, 100);
    seen.exactlyOnce(
        jobs.map((j) => j.id),
        'rate limited',
    );
    eq(await q.getJobCounts('completed', 'failed', 'waiting', 'delayed', 'active'), { completed: n, failed: 0, waiting: 0, delayed: 0, active: 0 }, 'counts');
});

scenario('job-scheduler-every', async (s) => {
    const name = qname('sched');
    const q = s.queue(name);
    const seen = new Seen();
    const names = new Set();
    s.worker(name, async (job) => {
        seen.add(job.id);
        names.add(`${job.name}:${job.data.tag}`);
    });
    const first = await q.upsertJobScheduler('every-300', { every: 300 }, { name: 'tick', data: { tag: 'a' } });
    check(first && first.id, 'upsertJobScheduler returned the first job');
    eq(await q.getJobSchedulersCount(), 1, 'schedulers after upsert');
    const sched = await q.getJobScheduler('every-300');
    eq(sched && sched.every, 300, 'getJobScheduler every');
    await waitFor('at least 5 runs', () => seen.size >= 5, 30_000, 100);
    // Upserting again updates the template, no second scheduler.
    await q.upsertJobScheduler('every-300', { every: 300 }, { name: 'tick', data: { tag: 'b' } });
    eq(await q.getJobSchedulersCount(), 1, 'schedulers after second upsert');
    await waitFor('a run with the updated template', () => names.has('tick:b'), 30_000, 100);
    eq(await q.removeJobScheduler('every-300'), true, 'removeJobScheduler');
    eq(await q.getJobSchedulersCount(), 0, 'schedulers after remove');
    await waitFor('no job of the scheduler left delayed', async () => (await q.getDelayedCount()) === 0, 10_000);
    const dups = [...seen.count].filter(([, c]) => c > 1);
    eq(dups, [], 'scheduler jobs processed more than once');
});

scenario('repeat-cron-pattern', async (s) => {
    // Cron-pattern repetition (BullMQ 6 folds repeatable jobs into job schedulers).
    const name = qname('cron');
    const q = s.queue(name);
    const seen = new Seen();
    const runAt = new Map();
    s.worker(name, async (job) => {
        seen.add(job.id);
        runAt.set(job.id, Date.now());
    });
    await q.upsertJobScheduler('each-second', { pattern: '* * * * * *' }, { name: 'cron', data: { x: 1 } });
    await waitFor('at least 3 cron runs', () => seen.size >= 3, 30_000, 100);
    await q.removeJobScheduler('each-second');
    eq(await q.getJobSchedulersCount(), 0, 'schedulers after remove');
    const dups = [...seen.count].filter(([, c]) => c > 1);
    eq(dups, [], 'cron jobs processed more than once');
    // Distinct seconds: one job per cron slot.
    // One job per cron slot: ids carry the slot's time, whole seconds, none processed early.
    for (const [id] of seen.count) {
        const m = /^repeat:each-second:(\d+)$/.exec(id);
        check(m, `cron job id ${id}`);
        check(Number(m[1]) % 1000 === 0, `cron slot ${m[1]} is not a whole second`);
        check(runAt.get(id) >= Number(m[1]) - 10, `cron job ${id} processed ${Number(m[1]) - runAt.get(id)} ms early`);
    }

    // A scheduler with a limit stops after that many jobs.
    const name2 = qname('limited');
    const q2 = s.queue(name2);
    const seen2 = new Seen();
    s.worker(name2, async (job) => seen2.add(job.id));
    await q2.upsertJobScheduler('limited', { every: 200, limit: 3 }, { name: 'lim' });
    await waitFor('3 limited runs', async () => (await q2.getCompletedCount()) >= 3, 30_000, 100);
    await waitFor('limited scheduler has nothing pending', async () => (await q2.getJobCounts('delayed', 'waiting', 'active', 'prioritized')).delayed === 0, 10_000, 100);
    eq(await q2.getCompletedCount(), 3, 'jobs of a scheduler with limit 3');
    eq(seen2.size, 3, 'limited runs seen by the worker');
});

scenario('flow-producer-cross-queue', async (s) => {
    const parentQ = qname('flow-parent');
    const childA = qname('flow-child-a');
    const childB = qname('flow-child-b');
    const grandQ = qname('flow-grand');
    const flow = s.flow();
    const done = new Set(); // child job keys whose processor has returned
    const parentSeen = new Seen();
    const problems = [];
    const childFn = async (job) => {
        await sleep(job.data.v % 5);
        const v = job.data.v * 10;
        done.add(`${job.queueName}:${job.id}`);
        return v;
    };
    s.worker(childA, childFn, { concurrency: 10 });
    s.worker(childB, childFn, { concurrency: 10 });
    s.worker(grandQ, childFn, { concurrency: 10 });
    const parents = new Map();
    s.worker(
        parentQ,
        async (job) => {
            parentSeen.add(job.id);
            const expect = parents.get(job.data.flow);
            const values = await job.getChildrenValues();
            const got = Object.entries(values)
                .map(([k, v]) => `${k}=${v}`)
                .sort();
            const want = expect.children.map((c) => `${prefix}:${c.queue}:${c.id}=${c.v * 10}`).sort();
            if (JSON.stringify(got) !== JSON.stringify(want)) problems.push(`flow ${job.data.flow}: children values ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
            for (const c of expect.children) if (!done.has(`${c.queue}:${c.id}`)) problems.push(`flow ${job.data.flow}: parent ran before child ${c.queue}:${c.id} finished`);
            return 'parent-done';
        },
        { concurrency: 5 },
    );
    const nflows = 20;
    const roots = [];
    for (let f = 0; f < nflows; f++) {
        const tree = await flow.add({
            name: 'parent',
            queueName: parentQ,
            data: { flow: f },
            children: [
                { name: 'a', queueName: childA, data: { v: f * 3 + 1 } },
                { name: 'b', queueName: childB, data: { v: f * 3 + 2 } },
                {
                    name: 'b2',
                    queueName: childB,
                    data: { v: f * 3 + 3 },
                    // b2 is itself a parent: it waits for a grandchild in a fourth queue.
                    children: [{ name: 'g', queueName: grandQ, data: { v: 1000 + f } }],
                },
            ],
        });
        roots.push(tree.job.id);
        parents.set(f, {
            children: tree.children.map((c) => ({ queue: c.job.queueName, id: c.job.id, v: c.job.data.v })),
        });
    }
    const pq = s.queue(parentQ);
    await waitFor(`${nflows} parents completed`, async () => (await pq.getCompletedCount()) === nflows, 60_000, 100);
    parentSeen.exactlyOnce(roots, 'parents');
    eq(problems, [], 'flow problems');
    for (const [qn, n] of [
        [childA, nflows],
        [childB, 2 * nflows],
        [grandQ, nflows],
    ]) {
        const q = s.queue(qn);
        eq(await q.getJobCounts('completed', 'failed', 'waiting', 'waiting-children'), { completed: n, failed: 0, waiting: 0, 'waiting-children': 0 }, `${qn} counts`);
    }
    const root = await Job.fromId(pq, roots[0]);
    eq(root.returnvalue, 'parent-done', 'parent returnvalue');
    const deps = await root.getDependenciesCount();
    eq(deps.processed, 3, 'parent processed dependencies');
    eq(deps.unprocessed, 0, 'parent unprocessed dependencies');
});

scenario('queue-events', async (s) => {
    const name = qname('events');
    const q = s.queue(name);
    const qe = s.events(name);
    await qe.waitUntilReady();
    const completed = new Map();
    const failed = new Map();
    const progress = new Map();
    const active = new Set();
    qe.on('completed', ({ jobId, returnvalue }) => completed.set(jobId, returnvalue));
    qe.on('failed', ({ jobId, failedReason }) => failed.set(jobId, failedReason));
    qe.on('progress', ({ jobId, data }) => progress.set(jobId, [...(progress.get(jobId) || []), data]));
    qe.on('active', ({ jobId }) => active.add(jobId));
    // Give the XREAD BLOCK of QueueEvents a moment to be in place (events are read from
    // the stream's end at the time the reader starts).
    await sleep(200);
    s.worker(
        name,
        async (job) => {
            if (job.data.progress) {
                await job.updateProgress(30);
                await job.updateProgress({ step: 'two' });
            }
            if (job.data.fail) throw new Error(`failed-${job.data.i}`);
            return { double: job.data.i * 2 };
        },
        { concurrency: 4 },
    );
    const jobs = [];
    for (let i = 0; i < 30; i++) jobs.push(await q.add('e', { i, fail: i % 5 === 0, progress: i % 3 === 0 }));
    const ok = jobs.filter((j) => !j.data.fail);
    const bad = jobs.filter((j) => j.data.fail);
    await waitFor('completed events', () => ok.every((j) => completed.has(j.id)), 60_000);
    await waitFor('failed events', () => bad.every((j) => failed.has(j.id)), 60_000);
    const withProgress = jobs.filter((j) => j.data.progress);
    await waitFor('progress events', () => withProgress.every((j) => (progress.get(j.id) || []).length >= 2), 60_000);
    for (const j of ok) eq(completed.get(j.id), { double: j.data.i * 2 }, `completed event returnvalue of ${j.id}`);
    for (const j of bad) eq(failed.get(j.id), `failed-${j.data.i}`, `failed event reason of ${j.id}`);
    for (const j of withProgress) eq(progress.get(j.id), [30, { step: 'two' }], `progress events of ${j.id}`);
    check(
        [...completed.keys()].every((id) => !failed.has(id)),
        'a job both completed and failed',
    );
    eq(active.size, 30, 'active events');
    // waitUntilFinished, built on the same events.
    const late = await q.add('e', { i: 100 });
    eq(await late.waitUntilFinished(qe, 30_000), { double: 200 }, 'waitUntilFinished result');
});

scenario('progress-and-logs', async (s) => {
    const name = qname('logs');
    const q = s.queue(name);
    const jobs = [];
    for (let i = 0; i < 10; i++) jobs.push(await q.add('l', { i }));
    s.worker(
        name,
        async (job) => {
            await job.updateProgress(10);
            await job.log(`start ${job.data.i}`);
            await job.updateProgress({ pct: 50, note: 'half' });
            await job.log(`middle ${job.data.i}`);
            await job.log(`end ${job.data.i}`);
            return job.data.i;
        },
        { concurrency: 3 },
    );
    await waitFor('10 completed', async () => (await q.getCompletedCount()) === 10);
    for (const j of jobs) {
        const got = await q.getJob(j.id);
        eq(got.progress, { pct: 50, note: 'half' }, `progress of ${j.id}`);
        const logs = await q.getJobLogs(j.id);
        eq(logs, { logs: [`start ${j.data.i}`, `middle ${j.data.i}`, `end ${j.data.i}`], count: 3 }, `logs of ${j.id}`);
    }
    // Ranges and descending order.
    const d = await q.getJobLogs(jobs[0].id, 0, 1, false);
    eq(d.logs, ['end 0', 'middle 0'], 'descending log range');
    // Logs added from outside a worker (on a queue without one), with keepLogs trimming.
    const q2 = s.queue(qname('logs-noworker'));
    const extra = await q2.add('l2', {});
    for (let k = 0; k < 5; k++) await q2.addJobLog(extra.id, `row ${k}`, 3);
    const kept = await q2.getJobLogs(extra.id);
    eq(kept, { logs: ['row 2', 'row 3', 'row 4'], count: 3 }, 'keepLogs 3');
    await q2.updateJobProgress(extra.id, 77);
    eq((await q2.getJob(extra.id)).progress, 77, 'Queue.updateJobProgress');
});

scenario('pause-resume', async (s) => {
    const name = qname('pause');
    const q = s.queue(name);
    const seen = new Seen();
    const w = s.worker(name, async (job) => seen.add(job.id), { concurrency: 5 });
    await w.waitUntilReady();
    // Processing works before the pause.
    const warm = await q.add('w', {});
    await waitFor('warm-up job completed', async () => (await q.getJobState(warm.id)) === 'completed');
    await q.pause();
    eq(await q.isPaused(), true, 'isPaused after pause');
    const jobs = await q.addBulk(Array.from({ length: 30 }, (_, i) => ({ name: 'p', data: { i } })));
    const delayed = await q.add('p', { i: 'delayed' }, { delay: 300 });
    // While paused nothing may be processed (the delayed job also comes due meanwhile).
    await sleep(1500);
    eq(seen.size, 1, 'jobs processed while paused');
    const c = await q.getJobCounts('paused', 'waiting', 'completed', 'delayed');
    eq(c.completed, 1, 'completed while paused');
    eq(c.paused + c.waiting + c.delayed, 31, 'paused+waiting+delayed while paused');
    await q.resume();
    eq(await q.isPaused(), false, 'isPaused after resume');
    await waitFor('all completed after resume', async () => (await q.getCompletedCount()) === 32);
    seen.exactlyOnce([warm.id, ...jobs.map((j) => j.id), delayed.id], 'pause/resume');
    // Worker-local pause: the worker stops fetching, queue stays unpaused.
    await w.pause();
    const more = await q.addBulk(Array.from({ length: 5 }, (_, i) => ({ name: 'p2', data: { i } })));
    await sleep(500);
    eq(seen.size, 32, 'processed while worker paused');
    w.resume();
    await waitFor('jobs after worker resume', async () => (await q.getCompletedCount()) === 37);
    seen.exactlyOnce([warm.id, ...jobs.map((j) => j.id), delayed.id, ...more.map((j) => j.id)], 'worker pause/resume');
});

// Puts a queue in a known state: 4 completed, 2 failed, 5 waiting, 3 delayed, 2 prioritized.
async function knownState(s, name) {
    const q = s.queue(name);
    const done = await q.addBulk([
        ...Array.from({ length: 4 }, (_, i) => ({ name: 'ok', data: { i } })),
        ...Array.from({ length: 2 }, (_, i) => ({ name: 'bad', data: { i } })),
    ]);
    const w = s.worker(name, async (job) => {
        if (job.name === 'bad') throw new Error('bad job');
        return job.data.i;
    });
    await waitFor('4 completed and 2 failed', async () => {
        const c = await q.getJobCounts('completed', 'failed');
        return c.completed === 4 && c.failed === 2;
    });
    await w.close();
    const waiting = await q.addBulk(Array.from({ length: 5 }, (_, i) => ({ name: 'wait', data: { i } })));
    const delayed = [];
    for (let i = 0; i < 3; i++) delayed.push(await q.add('later', { i }, { delay: 600_000 }));
    const prio = [];
    for (let i = 0; i < 2; i++) prio.push(await q.add('prio', { i }, { priority: 5 + i }));
    return { q, done, waiting, delayed, prio };
}

scenario('counts-and-getters', async (s) => {
    const name = qname('getters');
    const { q, done, waiting, delayed, prio } = await knownState(s, name);
    eq(
        await q.getJobCounts('completed', 'failed', 'waiting', 'delayed', 'prioritized', 'active', 'paused', 'waiting-children'),
        { completed: 4, failed: 2, waiting: 5, delayed: 3, prioritized: 2, active: 0, paused: 0, 'waiting-children': 0 },
        'getJobCounts',
    );
    eq(await q.getJobCountByTypes('waiting', 'delayed'), 8, 'getJobCountByTypes waiting+delayed');
    eq(await q.count(), 10, 'count (waiting+delayed+prioritized+paused)');
    const ids = (list) => list.map((j) => j.id).sort();
    eq(ids(await q.getWaiting()), ids(waiting), 'getWaiting');
    eq(ids(await q.getDelayed()), ids(delayed), 'getDelayed');
    eq(ids(await q.getPrioritized()), ids(prio), 'getPrioritized');
    eq(ids(await q.getCompleted()), ids(done.filter((j) => j.name === 'ok')), 'getCompleted');
    eq(ids(await q.getFailed()), ids(done.filter((j) => j.name === 'bad')), 'getFailed');
    eq(ids(await q.getJobs(['waiting', 'delayed'])), ids([...waiting, ...delayed]), 'getJobs waiting+delayed');
    eq(await q.getWaitingCount(), 5, 'getWaitingCount');
    eq(await q.getFailedCount(), 2, 'getFailedCount');
    eq(await q.getActiveCount(), 0, 'getActiveCount');
    const j = await q.getJob(delayed[1].id);
    eq([j.name, j.data, j.opts.delay], ['later', { i: 1 }, 600_000], 'getJob fields');
    eq(await q.getJobState(delayed[1].id), 'delayed', 'getJobState delayed');
    eq(await q.getJobState(done[0].id), 'completed', 'getJobState completed');
    eq(await q.getJobState(done[5].id), 'failed', 'getJobState failed');
    eq(await q.getJobState(waiting[0].id), 'waiting', 'getJobState waiting');
    eq(await q.getJobState(prio[0].id), 'prioritized', 'getJobState prioritized');
    eq(await q.getJob('no-such-job'), undefined, 'getJob of a missing id');
    eq(await q.getJobState('no-such-job'), 'unknown', 'getJobState of a missing id');
    // Job operations: promote a delayed job, change a priority, remove a job.
    await j.promote();
    eq(await q.getJobState(j.id), 'waiting', 'state after promote');
    const p = await q.getJob(prio[1].id);
    await p.changePriority({ priority: 1 });
    eq((await q.getJob(prio[1].id)).priority, 1, 'priority after changePriority');
    await (await q.getJob(waiting[4].id)).remove();
    eq(await q.getJob(waiting[4].id), undefined, 'job after remove');
    eq(await q.getJobCounts('waiting', 'delayed', 'prioritized'), { waiting: 5, delayed: 2, prioritized: 2 }, 'counts after promote/remove');
    // Retrying a failed job moves it back to wait.
    const f = await q.getJob(done[4].id);
    await f.retry();
    eq(await q.getJobState(f.id), 'waiting', 'state after retry');
});

scenario('clean-drain-obliterate', async (s) => {
    const name = qname('clean');
    const { q, waiting, delayed, prio } = await knownState(s, name);
    const pattern = `${globEscape(prefix)}:${globEscape(name)}:*`;
    const before = await scanKeys(pattern);
    check(before.length > 10, `keys of the queue before obliterate: ${before.length}`);
    const cleanedDone = await q.clean(0, 100, 'completed');
    eq(cleanedDone.length, 4, 'clean completed');
    const cleanedFailed = await q.clean(0, 1, 'failed');
    eq(cleanedFailed.length, 1, 'clean failed with limit 1');
    eq(await q.getJobCounts('completed', 'failed'), { completed: 0, failed: 1 }, 'counts after clean');
    for (const id of cleanedDone) eq(await q.getJob(id), undefined, `cleaned job ${id} gone`);
    // drain() leaves delayed jobs; drain(true) takes them too.
    await q.drain();
    eq(await q.getJobCounts('waiting', 'prioritized', 'delayed'), { waiting: 0, prioritized: 0, delayed: 3 }, 'counts after drain');
    for (const j of [...waiting, ...prio]) eq(await q.getJob(j.id), undefined, `drained job ${j.id} gone`);
    await q.drain(true);
    eq(await q.getJobCounts('waiting', 'prioritized', 'delayed'), { waiting: 0, prioritized: 0, delayed: 0 }, 'counts after drain(true)');
    for (const j of delayed) eq(await q.getJob(j.id), undefined, `drained delayed job ${j.id} gone`);
    // Obliterate a queue with more state in it.
    await q.addBulk(Array.from({ length: 50 }, (_, i) => ({ name: 'x', data: { i } })));
    await q.add('x', {}, { delay: 600_000 });
    await q.upsertJobScheduler('sch', { every: 60_000 });
    await q.obliterate();
    const after = await scanKeys(pattern);
    eq(after, [], 'keys of the queue after obliterate');
    // Another queue's keys are untouched by it.
    const other = await scanKeys(`${globEscape(prefix)}:*`);
    check(other.length > 0, 'other queues keep their keys');
});

scenario('obliterate-with-active-job', async (s) => {
    const name = qname('oblit');
    const q = s.queue(name);
    let release;
    const gate = new Promise((r) => (release = r));
    let started = false;
    const w = s.worker(name, async () => {
        started = true;
        await gate;
    });
    await q.addBulk(Array.from({ length: 20 }, (_, i) => ({ name: 'o', data: { i } })));
    await waitFor('a job active', () => started);
    let refused = null;
    try {
        await q.obliterate();
    } catch (e) {
        refused = e.message;
    }
    check(refused && /active/i.test(refused), `obliterate without force while a job is active should be refused, got ${refused}`);
    await q.obliterate({ force: true });
    release();
    await w.close();
    eq(await scanKeys(`${globEscape(prefix)}:${globEscape(name)}:*`), [], 'keys after forced obliterate');
});

scenario('stalled-job-recovery', async (s) => {
    const name = qname('stalled');
    const q = s.queue(name);
    const job = await q.add('victim', { v: 42 });
    const other = await q.addBulk(Array.from({ length: 5 }, (_, i) => ({ name: 'other', data: { i } })));
    // A worker in a child process takes the job and hangs; we SIGKILL it mid-job.
    const child = spawn(process.execPath, [path.join(HERE, 'stalled-worker.mjs'), url, prefix, name], {
        stdio: ['ignore', 'pipe', 'inherit'],
    });
    let childOut = '';
    child.stdout.on('data', (d) => (childOut += d));
    const exited = new Promise((r) => child.on('exit', r));
    try {
        await waitFor('child worker took a job', () => childOut.includes('started'), 30_000);
        eq(await q.getActiveCount(), 1, 'active jobs while the child holds one');
    } finally {
        child.kill('SIGKILL');
    }
    await exited;
    const takenByChild = childOut.match(/started (\S+)/)[1];
    eq(takenByChild, job.id, 'job taken by the child');
    // The survivor: short stalled interval; the dead worker's lock (2 s) must expire first.
    const seen = new Seen();
    const stalledEvents = [];
    const completedEvents = [];
    const w = s.worker(name, async (j) => {
        seen.add(j.id);
        return j.data.v ?? j.data.i;
    }, { stalledInterval: 500, lockDuration: 5000 });
    w.on('stalled', (id) => stalledEvents.push(id));
    w.on('completed', (j) => completedEvents.push(j.id));
    await waitFor('victim job completed by the survivor', async () => (await q.getJobState(job.id)) === 'completed', 60_000, 100);
    await waitFor('all jobs completed', async () => (await q.getCompletedCount()) === 6, 30_000, 100);
    seen.exactlyOnce([job.id, ...other.map((j) => j.id)], 'survivor');
    eq(completedEvents.filter((id) => id === job.id).length, 1, 'completed events for the victim');
    eq(stalledEvents, [job.id], 'stalled events');
    const done = await q.getJob(job.id);
    eq(done.returnvalue, 42, 'victim returnvalue');
    eq(done.stalledCounter, 1, 'victim stalledCounter');
    eq(await q.getJobCounts('completed', 'failed', 'active', 'waiting'), { completed: 6, failed: 0, active: 0, waiting: 0 }, 'counts');
});

// ---------------------------------------------------------------------------------------

async function main() {
    const todo = only.length ? scenarios.filter((sc) => only.includes(sc.name)) : scenarios;
    if (only.length && todo.length !== only.length) {
        console.error(`unknown scenario in ${only}; known: ${scenarios.map((sc) => sc.name)}`);
        process.exit(2);
    }
    let failures = 0;
    for (const sc of todo) {
        const scope = new Scope(sc.name);
        const t0 = Date.now();
        let error = null;
        let timer;
        try {
            await Promise.race([
                sc.fn(scope),
                new Promise((_, rej) => (timer = setTimeout(() => rej(new Check(`scenario deadline ${SCENARIO_DEADLINE_MS} ms`)), SCENARIO_DEADLINE_MS))),
            ]);
        } catch (e) {
            error = e;
        } finally {
            clearTimeout(timer);
        }
        await scope.close();
        const secs = ((Date.now() - t0) / 1000).toFixed(1);
        if (error) {
            failures++;
            const msg = error instanceof Check ? error.message : nameScripts(`${error.name}: ${error.message}`);
            console.log(`FAIL ${sc.name} (${secs}s): ${msg}`);
            const errs = [...new Set(scope.errors)].slice(0, 5);
            for (const e of errs) console.log(`     error event: ${nameScripts(e)}`);
        } else {
            console.log(`PASS ${sc.name} (${secs}s)`);
        }
    }
    console.log(`${failures === 0 ? 'OK' : 'FAILED'}: ${todo.length - failures}/${todo.length} scenarios passed (prefix ${prefix})`);
    process.exit(failures === 0 ? 0 : 1);
}

main().catch((e) => {
    console.log(`FAIL suite: ${e.stack || e}`);
    process.exit(1);
});
