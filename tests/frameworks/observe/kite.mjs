// Helpers shared by bullmq.mjs and dashboard.mjs: checks, bounded waits, and Kite's own
// commands (KITE QUEUES, INFO queues) read into plain objects.

export class Check extends Error {}

export function check(cond, msg) {
    if (!cond) throw new Check(msg);
}

export function eq(actual, expected, what) {
    const a = JSON.stringify(actual);
    const e = JSON.stringify(expected);
    if (a !== e) throw new Check(`${what}: got ${a}, want ${e}`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `fn` until it returns truthy; a Check thrown inside counts as "not yet" until the
// deadline, and its message goes into the error then.
export async function waitFor(what, fn, ms = 15_000, every = 100) {
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
            const detail = last instanceof Error ? ` (last: ${last.message})` : ` (last: ${JSON.stringify(last)})`;
            throw new Check(`timed out after ${ms} ms waiting for ${what}${detail}`);
        }
        await sleep(every);
    }
}

// Runs one scenario: prints PASS/FAIL and counts it.
export function scenarios(suite) {
    const label = process.env.FW_CONFIG || 'server';
    const res = { passed: 0, failed: 0 };
    res.run = async (name, fn) => {
        const t0 = Date.now();
        try {
            await fn();
            res.passed++;
            console.log(`PASS [${label}] ${suite}: ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
        } catch (e) {
            res.failed++;
            const msg = e instanceof Check ? e.message : (e && e.stack) || String(e);
            console.log(`FAIL [${label}] ${suite}: ${name}: ${msg}`);
        }
    };
    res.done = (extra = '') => {
        console.log(`${suite}: ${res.passed} passed, ${res.failed} failed [${label}]${extra}`);
        return res.failed === 0 ? 0 : 1;
    };
    return res;
}

const str = (x) => (Buffer.isBuffer(x) ? x.toString('utf8') : x);

// A reply map: a RESP3 map (a Map or plain object, by the client's reply mapping) or a
// RESP2 flat array of field, value pairs.
export function toMap(x, what = 'reply') {
    if (x instanceof Map) return Object.fromEntries([...x].map(([k, v]) => [String(str(k)), v]));
    if (Array.isArray(x)) {
        check(x.length % 2 === 0, `${what}: a flat array of odd length ${x.length}`);
        const o = {};
        for (let i = 0; i < x.length; i += 2) o[String(str(x[i]))] = x[i + 1];
        return o;
    }
    check(x !== null && typeof x === 'object' && !Buffer.isBuffer(x), `${what}: not a map: ${JSON.stringify(x)}`);
    return { ...x };
}

const INTS = ['db', 'depth', 'pushed', 'popped', 'consumers', 'oldest_age_ms'];
const DOUBLES = ['push_rate', 'pop_rate', 'wait_p50_ms', 'wait_p99_ms'];

// One queue's map with numbers as numbers (doubles arrive as strings over RESP2), null
// kept null, and `jobs` as { state: number }.
export function normQueue(raw) {
    const m = toMap(raw, 'KITE QUEUES entry');
    for (const k of Object.keys(m)) m[k] = str(m[k]);
    for (const k of [...INTS, ...DOUBLES]) if (m[k] !== null && m[k] !== undefined) m[k] = Number(m[k]);
    const jobs = m.jobs === null || m.jobs === undefined ? {} : toMap(m.jobs, `jobs of ${m.name}`);
    m.jobs = Object.fromEntries(Object.entries(jobs).map(([k, v]) => [k, Number(str(v))]));
    return m;
}

// KITE QUEUES [pattern] → { name: queue }, checking that the order is by name.
export async function kiteQueues(redis, pattern) {
    const raw = await redis.call('KITE', 'QUEUES', ...(pattern ? [pattern] : []));
    check(Array.isArray(raw), `KITE QUEUES: not an array: ${JSON.stringify(raw)}`);
    const rows = raw.map(normQueue);
    const names = rows.map((q) => q.name);
    eq(names, [...names].sort(), 'KITE QUEUES order (sorted by name)');
    return Object.fromEntries(rows.map((q) => [q.name, q]));
}

export async function kiteQueue(redis, name) {
    const qs = await kiteQueues(redis);
    check(qs[name], `KITE QUEUES has no ${name} (has ${JSON.stringify(Object.keys(qs))})`);
    return qs[name];
}

// A queue's jobs in a state (a state missing from the map counts as 0).
export const jobs = (q, state) => q.jobs[state] ?? 0;

const unescape = (s) => s.replace(/%([0-9A-Fa-f]{2})/g, (_, h) => String.fromCharCode(parseInt(h, 16)));

// INFO queues → { fields, rows: [{ name, ... }], frameworks: { sidekiq: {...} }, text }.
export async function infoQueues(redis) {
    const text = String(str(await redis.call('INFO', 'queues')));
    const out = { fields: {}, rows: [], frameworks: {}, text };
    check(text.includes('# Queues'), `INFO queues has no '# Queues' section: ${text.slice(0, 200)}`);
    for (let line of text.split('\n')) {
        line = line.trim();
        if (!line || line.startsWith('#')) continue;
        const i = line.indexOf(':');
        const key = line.slice(0, i);
        const value = line.slice(i + 1);
        const pairs = () => Object.fromEntries(value.split(',').map((kv) => {
            const j = kv.indexOf('=');
            return [kv.slice(0, j), unescape(kv.slice(j + 1))];
        }));
        if (/^queue\d+$/.test(key)) out.rows.push({ _key: key, ...pairs() });
        else if (key.startsWith('framework_')) out.frameworks[key.slice('framework_'.length)] = pairs();
        else out.fields[key] = value;
    }
    return out;
}

export const envInt = (name, dflt) => Number.parseInt(process.env[name] ?? String(dflt), 10);
