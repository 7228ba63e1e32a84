// BullMQ durability check: kill -9 the server in the middle of a workload, restart it on the
// same data, and check that no acknowledged job was lost.
//
// Usage: node kill9.mjs REDIS_URL PREFIX, with FW_STATE and FW_LIB in the environment
// (lib.sh's fw_start_durable_server: the server runs with appendonly yes and appendfsync
// always, which promises that no reply to a write leaves the server before the write is
// on disk). KILL9_SEED=N replays a run (the seed picks the moment of the kill and the
// queue names); every run prints its seed.
//
// Producers add jobs to three queues (add with plain, prioritized and delayed jobs, and
// addBulk) and record every job whose add promise resolved; a worker per queue runs a
// trivial processor and records every job whose 'completed' event fired (BullMQ emits it
// after moveToFinished returned). At a seeded moment 300-1500 ms in, the server gets
// SIGKILL; the clients' calls in flight fail, are retried by ioredis after the restart or
// given up; nothing new is added. After `lib.sh restart` (same port, same --dir, PONG
// rather than -LOADING), every acknowledged job must:
//   1. still exist with the data it was added with, in a state a job can be in
//      (waiting, active, completed, failed, delayed, prioritized, waiting-children);
//      'active' is allowed because the killed server's workers' jobs are stalled;
//   2. be completed if its completion was acknowledged;
//   3. end completed once a fresh worker (short stalled interval, so the stalled jobs of
//      the first workers come back) has drained the queues.
// A job added twice around the crash (ioredis resends a command whose reply was lost) is
// a second job, not a loss; a job run twice (stalled, then run again) is not checked here.
// Prints "PASS kill9 ..." or "FAIL kill9 ...: what was lost"; exits 1 on failure.

import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Queue, Worker, Job } from 'bullmq';

const [url, prefix] = process.argv.slice(2);
const { FW_STATE: state, FW_LIB: lib } = process.env;
if (!url || !prefix || !state || !lib) {
    console.error('usage: FW_STATE=DIR FW_LIB=lib.sh node kill9.mjs REDIS_URL PREFIX');
    process.exit(2);
}
const { hostname: host, port: portText } = new URL(url);
const connection = { host, port: Number(portText) };
const label = process.env.FW_CONFIG || 'server';

const seed = process.env.KILL9_SEED ? Number(process.env.KILL9_SEED) >>> 0 : (Math.random() * 2 ** 32) >>> 0;
// mulberry32: a small seeded generator, so that a failing run can be replayed.
let rngState = seed;
function rng() {
    rngState = (rngState + 0x6d2b79f5) >>> 0;
    let t = rngState;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const t0 = Date.now();
const since = () => `${Date.now() - t0} ms`;

class Check extends Error {}

// Polls `fn` until it returns truthy; fails with `what` after `ms`.
async function waitFor(what, fn, ms, every = 100) {
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

// Resolves with `p`'s outcome, or after `ms` with `fallback` (closing a client of a server
// that is gone can hang; a bounded wait keeps the run bounded).
const bounded = (p, ms, fallback) => Promise.race([Promise.resolve(p).catch((e) => e), sleep(ms).then(() => fallback)]);

// Runs `fn` over `items`, `width` at a time.
async function inChunks(items, width, fn) {
    const out = [];
    for (let i = 0; i < items.length; i += width) out.push(...(await Promise.all(items.slice(i, i + width).map(fn))));
    return out;
}

const errors = new Map(); // message -> [count, ms since the start when first seen], from 'error' events and failed calls
function noteError(e) {
    const msg = (e && e.message ? e.message : String(e)).slice(0, 160);
    const seen = errors.get(msg);
    if (seen) seen[0]++;
    else errors.set(msg, [1, Date.now() - t0]);
}

// ---------------------------------------------------------------------------------------
// the workload

const QUEUES = 3;
const ATTEMPTS = 10; // a job whose moveToFinished failed in the crash goes back to wait
const names = Array.from({ length: QUEUES }, (_, i) => `kill9-${seed.toString(16)}-${i}`);
const queues = names.map((n) => new Queue(n, { connection, prefix }));
for (const q of queues) q.on('error', noteError);

const added = names.map(() => new Map()); // acknowledged adds: job id -> data
const reused = []; // an id acknowledged for two different adds
const completed = names.map(() => new Set()); // acknowledged completions: job id
let killed = false;

function ack(qi, id, data) {
    const prev = added[qi].get(id);
    if (prev && JSON.stringify(prev) !== JSON.stringify(data)) reused.push(`${names[qi]}:${id}`);
    added[qi].set(id, data);
}

// One producer: single adds cycling through plain, prioritized and delayed jobs (the delay
// runs past the restart, so those jobs sit in the delayed set across the crash), or
// addBulk batches of 25. Stops adding once the server was killed; the call in flight then
// settles either way (resolved means acknowledged).
async function producer(qi, p, bulk) {
    const q = queues[qi];
    let n = 0;
    while (!killed) {
        try {
            if (bulk) {
                const batch = Array.from({ length: 25 }, () => ({ name: 'bulk', data: { p, n: n++ }, opts: { attempts: ATTEMPTS } }));
                const jobs = await q.addBulk(batch);
                jobs.forEach((j, k) => ack(qi, j.id, batch[k].data));
            } else {
                const data = { p, n: n++ };
                const kind = n % 3;
                const opts = { attempts: ATTEMPTS, ...(kind === 1 ? { priority: 1 + (n % 5) } : kind === 2 ? { delay: 1500 } : {}) };
                const job = await q.add('single', data, opts);
                ack(qi, job.id, data);
            }
        } catch (e) {
            noteError(e);
            if (!killed) await sleep(20);
        }
    }
}

function startWorker(qi, opts, onCompleted) {
    const w = new Worker(names[qi], async (job) => job.data.n, { connection, prefix, ...opts });
    w.on('error', noteError);
    if (onCompleted) w.on('completed', (job) => onCompleted(job.id));
    return w;
}

const readPid = () => Number(readFileSync(path.join(state, 'pid'), 'utf8').trim());

function restartServer() {
    return new Promise((resolve, reject) => {
        execFile('bash', [lib, 'restart'], { env: process.env, timeout: 90_000 }, (err, stdout, stderr) => {
            if (err) reject(new Check(`restart failed: ${err.message} ${stderr}`));
            else resolve(stdout.trim());
        });
    });
}

// ---------------------------------------------------------------------------------------

async function main() {
    const killAfter = 300 + Math.floor(rng() * 1200);
    console.log(`kill9 [${label}, prefix ${prefix}]: seed ${seed} (KILL9_SEED=${seed} replays it), kill after ${killAfter} ms`);

    // The first workers: locks of 2 s, so that their jobs left active by the crash
    // are stalled soon after (they are closed once the server is back).
    const firstWorkers = names.map((_, qi) =>
        startWorker(qi, { concurrency: 10, lockDuration: 2000, stalledInterval: 1000 }, (id) => completed[qi].add(id)),
    );
    await Promise.all(firstWorkers.map((w) => w.waitUntilReady()));
    await Promise.all(queues.map((q) => q.waitUntilReady()));
    const producers = [];
    for (let qi = 0; qi < QUEUES; qi++) producers.push(producer(qi, 0, false), producer(qi, 1, true));

    await sleep(killAfter);
    const pid = readPid();
    killed = true;
    process.kill(pid, 'SIGKILL');
    const addedAtKill = added.reduce((s, m) => s + m.size, 0);
    const completedAtKill = completed.reduce((s, c) => s + c.size, 0);
    console.log(`  ${since()}: SIGKILL to pid ${pid}: ${addedAtKill} adds and ${completedAtKill} completions acknowledged so far`);

    const tRestart = Date.now();
    const newPid = await restartServer();
    console.log(`  ${since()}: restarted as pid ${newPid} in ${Date.now() - tRestart} ms (PONG)`);

    // The calls in flight at the kill settle: resolved after ioredis reconnects and resends,
    // or rejected. ioredis waits at least a second before reconnecting.
    const settled = await bounded(Promise.all(producers).then(() => true), 60_000, false);
    if (settled !== true) throw new Check('producers did not settle within 60 s of the restart');
    await Promise.all(firstWorkers.map((w) => bounded(w.close(true), 10_000)));
    const nAdded = added.reduce((s, m) => s + m.size, 0);
    const nCompleted = completed.reduce((s, c) => s + c.size, 0);
    console.log(`  ${since()}: ${nAdded} adds and ${nCompleted} completions acknowledged in all; checking`);

    const lost = [];
    const wrongData = [];
    const notCompleted = [];
    const states = {};
    const ALLOWED = new Set(['waiting', 'active', 'completed', 'failed', 'delayed', 'prioritized', 'waiting-children']);
    for (let qi = 0; qi < QUEUES; qi++) {
        const q = queues[qi];
        await inChunks([...added[qi]], 100, async ([id, data]) => {
            const job = await Job.fromId(q, id);
            const st = job ? await job.getState() : 'missing';
            states[st] = (states[st] || 0) + 1;
            if (!job || !ALLOWED.has(st)) {
                lost.push(`${names[qi]}:${id} (${st})`);
            } else if (JSON.stringify(job.data) !== JSON.stringify(data)) {
                wrongData.push(`${names[qi]}:${id} has ${JSON.stringify(job.data)}, was added with ${JSON.stringify(data)}`);
            }
            if (completed[qi].has(id) && st !== 'completed') notCompleted.push(`${names[qi]}:${id} (${st})`);
        });
        // A completion acknowledged for a job whose add was not (its add resolved too late
        // for us, or was resent) is still checked.
        await inChunks([...completed[qi]].filter((id) => !added[qi].has(id)), 100, async (id) => {
            const st = await q.getJobState(id);
            if (st !== 'completed') notCompleted.push(`${names[qi]}:${id} (${st}; add not acknowledged)`);
        });
    }
    console.log(`  states after the restart: ${JSON.stringify(states)}`);
    const problems = [];
    const some = (xs) => `${xs.slice(0, 10).join(', ')}${xs.length > 10 ? ', ...' : ''}`;
    if (lost.length) problems.push(`${lost.length} acknowledged adds lost: ${some(lost)}`);
    if (wrongData.length) problems.push(`${wrongData.length} acknowledged jobs with other data: ${some(wrongData)}`);
    if (reused.length) problems.push(`${reused.length} job ids acknowledged for two different adds: ${some(reused)}`);
    if (notCompleted.length) problems.push(`${notCompleted.length} acknowledged completions undone: ${some(notCompleted)}`);
    if (problems.length) throw new Check(problems.join('; '));

    // Drain: a fresh worker per queue. Its stalled checker (every second) moves the first
    // workers' jobs back to wait once their 2 s locks expire; a high maxStalledCount keeps
    // those jobs from being failed for it.
    const drainers = names.map((_, qi) => startWorker(qi, { concurrency: 20, stalledInterval: 1000, maxStalledCount: 100 }));
    try {
        for (let qi = 0; qi < QUEUES; qi++) {
            let counts;
            await waitFor(
                `${names[qi]} drained`,
                async () => {
                    counts = await queues[qi].getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'waiting-children', 'paused');
                    return Object.values(counts).every((v) => v === 0);
                },
                45_000,
                200,
            ).catch((e) => {
                throw new Check(`${e.message}; counts then: ${JSON.stringify(counts)}`);
            });
        }
        const unfinished = [];
        for (let qi = 0; qi < QUEUES; qi++) {
            await inChunks([...added[qi].keys()], 100, async (id) => {
                const st = await queues[qi].getJobState(id);
                if (st !== 'completed') {
                    const job = st === 'failed' ? await Job.fromId(queues[qi], id) : null;
                    unfinished.push(`${names[qi]}:${id} (${st}${job ? `: ${job.failedReason}` : ''})`);
                }
            });
        }
        if (unfinished.length) throw new Check(`${unfinished.length} acknowledged jobs did not end completed: ${some(unfinished)}`);
    } finally {
        await Promise.all(drainers.map((w) => bounded(w.close(), 10_000)));
    }
    console.log(`  ${since()}: all ${nAdded} acknowledged jobs completed`);
}

let status = 0;
try {
    await main();
    console.log(`PASS kill9 [${label}, prefix ${prefix}] seed ${seed} (${since()})`);
} catch (e) {
    status = 1;
    console.log(`FAIL kill9 [${label}, prefix ${prefix}] seed ${seed}: ${e instanceof Check ? e.message : e.stack}`);
}
if (errors.size) {
    // KILL9_VERBOSE=1: all of them.
    const top = [...errors].sort((a, b) => b[1][0] - a[1][0]).slice(0, process.env.KILL9_VERBOSE ? Infinity : 5);
    console.log(
        `  client errors (expected around the kill; ${errors.size} distinct): ${top.map(([m, [n, at]]) => `${n}x ${m} (first at ${at} ms)`).join(' | ')}`,
    );
}
await Promise.all(queues.map((q) => bounded(q.close(), 5_000)));
process.exit(status);
