// The observe suite's dashboard check (see run.sh), with playwright-core driving Debian's
// chromium (headless, --no-sandbox; no browser download):
//
//     node dashboard.mjs redis://127.0.0.1:PORT     against Kite (after bullmq.mjs)
//     node dashboard.mjs --selftest                 against a stand-in page (no Kite)
//
// The page contract (from the dashboard's implementer): <body data-refreshes="N">, N
// growing after every successful poll of /api/state; one <tr data-queue="NAME"> per queue
// with <td data-field="depth"> (numbers under 1000 shown plainly), and data-field cells
// "pushed", "popped", "consumers"; a click on a row, or the address
// #/queue/<encodeURIComponent(NAME)>, shows <section id="queue-detail" data-queue="NAME">
// with <td data-state="waiting"> (and the other states). Light and dark follow the
// browser's setting.
//
// Checks the table against KITE QUEUES, a live update after OBS_BQ_MORE more jobs (no
// reload), the queue page (by a click at 1280x800, by its address at 390x844), dark mode,
// no page errors and no request leaving 127.0.0.1. Screenshots: dashboard.png,
// dashboard-dark.png, dashboard-phone.png, queue-detail.png, queue-detail-phone.png in
// OBS_ARTIFACTS (default target/observe-artifacts). --selftest serves a stand-in page that
// follows the contract, with fake data, from node itself: it proves that chromium launches
// here and that these checks pass against a page that does what they expect.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { check, eq, waitFor, scenarios, kiteQueues, jobs, envInt } from './kite.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SELFTEST = process.argv.includes('--selftest');
const url = process.argv.slice(2).find((a) => !a.startsWith('--'));
if (!SELFTEST && !url) {
    console.error('usage: node dashboard.mjs redis://127.0.0.1:PORT | --selftest');
    process.exit(2);
}
const ARTIFACTS = process.env.OBS_ARTIFACTS || path.resolve(HERE, '../../../target/observe-artifacts');
const CHROMIUM = process.env.OBS_CHROMIUM || '/usr/bin/chromium';
const MORE = envInt('OBS_BQ_MORE', 7);
const NAME = 'bull:emails';
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
fs.mkdirSync(ARTIFACTS, { recursive: true });

// --- what the page should show: Kite (KITE QUEUES, BullMQ) or the stand-in --------------

async function kiteBackend(redisUrl) {
    const { Queue } = await import('bullmq');
    const { default: Redis } = await import('ioredis');
    const u = new URL(redisUrl);
    const connection = { host: u.hostname, port: Number(u.port) };
    const kite = new Redis({ ...connection, maxRetriesPerRequest: 3 });
    const queue = new Queue('emails', { connection, prefix: 'bull' });
    queue.on('error', (e) => console.error(`queue error: ${e.message}`));
    return {
        base: `http://127.0.0.1:${u.port}`,
        queues: () => kiteQueues(kite),
        async pushMore(n) {
            for (let i = 0; i < n; i++) {
                await queue.add('email', { i: 1000 + i, fail: false }, { removeOnComplete: false });
            }
        },
        async close() {
            await Promise.race([queue.close(), new Promise((r) => setTimeout(r, 5000))]);
            kite.disconnect();
        },
    };
}

// A stand-in for Kite's dashboard: the page contract, with the state bullmq.mjs leaves.
function standinState() {
    const q = (name, framework, depth, pushed, popped, consumers, j = {}) => ({
        name, framework, type: 'list', db: 0, depth, pushed, popped, consumers,
        push_rate: 0, pop_rate: 0, oldest_age_ms: depth ? 5000 : null, wait_p50_ms: 1, wait_p99_ms: 2, jobs: j,
    });
    return {
        queues: [
            q('bull:emails', 'bullmq', 0, 45, 45, 0, { waiting: 0, active: 0, delayed: 5, completed: 42, failed: 3 }),
            q('queue:critical', 'sidekiq', 0, 15, 15, 2, { waiting: 0 }),
            q('queue:default', 'sidekiq', 0, 40, 40, 2, { waiting: 0 }),
            q('queue:low', 'sidekiq', 4, 4, 0, 0, { waiting: 4 }),
        ],
    };
}

const STANDIN_HTML = `<!doctype html>
<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>stand-in dashboard</title>
<style>
:root { color-scheme: light dark; --bg: #fafafa; --fg: #1a1a1a; --line: #ddd; }
@media (prefers-color-scheme: dark) { :root { --bg: #15171a; --fg: #e8e8e8; --line: #333; } }
body { background: var(--bg); color: var(--fg); font: 14px system-ui, sans-serif; margin: 0; padding: 16px; }
.wrap { overflow-x: auto; } table { border-collapse: collapse; } .wrap table { min-width: 600px; }
td, th { border-bottom: 1px solid var(--line); padding: 6px 10px; text-align: right; }
tr[data-queue] { cursor: pointer; } td:first-child, th:first-child { text-align: left; }
</style></head>
<body data-refreshes="0"><h1>Queues</h1><main id="main"></main>
<script>
let state = null, refreshes = 0;
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => '&#' + c.charCodeAt(0) + ';');
function render() {
  const main = document.getElementById('main');
  if (!state) return;
  const m = location.hash.match(/^#\\/queue\\/(.*)$/);
  if (m) {
    const name = decodeURIComponent(m[1]);
    const q = state.queues.find((x) => x.name === name);
    main.innerHTML = '<section id="queue-detail" data-queue="' + esc(name) + '"><h2>' + esc(name) + '</h2><table>' +
      Object.entries(q ? q.jobs : {}).map(([k, v]) => '<tr><th>' + esc(k) + '</th><td data-state="' + esc(k) + '">' + v + '</td></tr>').join('') +
      '</table><a href="#/">back</a></section>';
    return;
  }
  main.innerHTML = '<div class="wrap"><table><tr><th>queue</th><th>depth</th><th>pushed</th><th>popped</th><th>consumers</th></tr>' +
    state.queues.map((q) => '<tr data-queue="' + esc(q.name) + '"><td>' + esc(q.name) + '</td>' +
      ['depth', 'pushed', 'popped', 'consumers'].map((f) => '<td data-field="' + f + '">' + q[f] + '</td>').join('') + '</tr>').join('') +
    '</table></div>';
  for (const tr of main.querySelectorAll('tr[data-queue]')) {
    tr.addEventListener('click', () => { location.hash = '#/queue/' + encodeURIComponent(tr.dataset.queue); });
  }
}
async function poll() {
  try {
    const r = await fetch('/api/state');
    if (r.ok) { state = await r.json(); refreshes++; document.body.dataset.refreshes = refreshes; render(); }
  } catch (e) {}
  setTimeout(poll, 1000);
}
addEventListener('hashchange', render);
poll();
</script></body></html>`;

async function standinBackend() {
    const state = standinState();
    const server = http.createServer((req, res) => {
        const p = new URL(req.url, 'http://x').pathname;
        if (p === '/') {
            res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
            res.end(STANDIN_HTML);
        } else if (p === '/api/state') {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify(state));
        } else {
            res.writeHead(404, { 'content-type': 'text/plain' });
            res.end('not found');
        }
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    return {
        base: `http://127.0.0.1:${server.address().port}`,
        queues: async () => Object.fromEntries(state.queues.map((q) => [q.name, structuredClone(q)])),
        async pushMore(n) {
            const q = state.queues.find((x) => x.name === NAME);
            q.depth += n;
            q.pushed += n;
            q.jobs.waiting += n;
        },
        async close() {
            server.closeAllConnections();
            await new Promise((r) => server.close(r));
        },
    };
}

// --- page helpers ----------------------------------------------------------------------

const rowSel = (name) => `tr[data-queue="${name.replace(/["\\]/g, '\\$&')}"]`;
const cellSel = (name, field) => `${rowSel(name)} td[data-field="${field}"]`;
const stateSel = (name, st) => `section#queue-detail[data-queue="${name.replace(/["\\]/g, '\\$&')}"] td[data-state="${st}"]`;
const text = async (page, sel) => ((await page.locator(sel).first().textContent({ timeout: 5000 })) ?? '').trim();
// The first integer in a cell ("1,234" and "1 234" read as 1234).
const firstInt = (s) => {
    const m = s.replace(/(\d)[,\u00a0\u202f ](?=\d{3}\b)/g, '$1').match(/-?\d+/);
    return m ? Number(m[0]) : NaN;
};
const refreshes = (page) => page.evaluate(() => Number(document.body.dataset.refreshes));

// Mean luminance (0 black .. 1 white) of a PNG, computed by the browser itself.
async function luminance(browser, png) {
    const page = await browser.newPage();
    try {
        return await page.evaluate(async (b64) => {
            const img = new Image();
            img.src = `data:image/png;base64,${b64}`;
            await img.decode();
            const c = document.createElement('canvas');
            c.width = img.naturalWidth;
            c.height = img.naturalHeight;
            const ctx = c.getContext('2d');
            ctx.drawImage(img, 0, 0);
            const d = ctx.getImageData(0, 0, c.width, c.height).data;
            let sum = 0;
            let n = 0;
            for (let i = 0; i < d.length; i += 16) {
                sum += (0.2126 * d[i] + 0.7152 * d[i + 1] + 0.0722 * d[i + 2]) / 255;
                n++;
            }
            return sum / n;
        }, png.toString('base64'));
    } finally {
        await page.close();
    }
}

// Records, for every page, uncaught errors, console errors and requests to other hosts.
function watch(page, base, seen) {
    page.on('pageerror', (e) => seen.errors.push(`page error: ${e.message}`));
    page.on('console', (m) => {
        // A missing /favicon.ico is the browser's request, not the page's doing.
        if (m.type() === 'error' && !/favicon/i.test(m.text() + (m.location()?.url ?? ''))) {
            seen.errors.push(`console error: ${m.text()}`);
        }
    });
    page.on('request', (r) => {
        const u = r.url();
        if (u.startsWith(`${base}/api/state`)) seen.polls++;
        if (!(u.startsWith(`${base}/`) || u === base || /^(data|about|blob):/.test(u))) seen.external.push(u);
    });
}

// --- the checks ---------------------------------------------------------------------------

const s = scenarios(SELFTEST ? 'dashboard (selftest)' : 'dashboard');
const backend = SELFTEST ? await standinBackend() : await kiteBackend(url);
const seen = { errors: [], external: [], polls: 0 };
let browser = null;
let desktop = null; // the 1280x800 page
let tableOk = false; // the table showed bull:emails (else the scenarios that need it fail at once)
let lightLum = null;

await s.run(`launch ${CHROMIUM} headless through playwright-core`, async () => {
    check(fs.existsSync(CHROMIUM), `no chromium at ${CHROMIUM}`);
    browser = await chromium.launch({
        executablePath: CHROMIUM,
        headless: true,
        args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
        timeout: 60_000,
    });
    console.log(`  chromium ${browser.version()}`);
});

await s.run('1280x800: GET / answers the page, which polls /api/state (data-refreshes grows)', async () => {
    check(browser, 'no browser');
    const ctx = await browser.newContext({ viewport: DESKTOP, colorScheme: 'light' });
    const page = await ctx.newPage();
    page.setDefaultTimeout(15_000);
    watch(page, backend.base, seen);
    const resp = await page.goto(`${backend.base}/`, { waitUntil: 'load' });
    eq(resp.status(), 200, 'GET / status');
    check(/text\/html/.test(resp.headers()['content-type'] ?? ''), `GET / Content-Type ${resp.headers()['content-type']}`);
    // The scenarios below use this page once it loaded (else they fail at once).
    desktop = page;
    const n = await waitFor('data-refreshes >= 1', async () => {
        const v = await refreshes(page);
        return v >= 1 ? v : null;
    }, 10_000);
    await waitFor(`data-refreshes past ${n}`, async () => (await refreshes(page)) > n, 10_000);
});

await s.run(`the queue table: one row per queue, ${NAME}'s cells as KITE QUEUES says`, async () => {
    check(desktop, 'no page');
    await desktop.locator(rowSel(NAME)).first().waitFor({ state: 'visible', timeout: 10_000 });
    tableOk = true;
    const want = await backend.queues();
    await waitFor('the rows to be the queues of KITE QUEUES', async () => {
        const rows = await desktop.$$eval('tr[data-queue]', (trs) => trs.map((t) => t.dataset.queue));
        eq([...rows].sort(), Object.keys(want).sort(), 'rows (data-queue) vs KITE QUEUES');
        return true;
    }, 10_000);
    const q = want[NAME];
    check(q, `${NAME} is not in KITE QUEUES`);
    await waitFor(`${NAME}'s cells`, async () => {
        const depth = await text(desktop, cellSel(NAME, 'depth'));
        eq(depth, String(q.depth), `${NAME} depth cell text`);
        for (const f of ['pushed', 'popped', 'consumers']) {
            eq(firstInt(await text(desktop, cellSel(NAME, f))), q[f], `${NAME} ${f} cell`);
        }
        return true;
    }, 10_000);
    if (want['queue:low']) {
        eq(await text(desktop, cellSel('queue:low', 'depth')), String(want['queue:low'].depth), 'queue:low depth cell');
    }
    // The idle Sidekiq process: its fetchers block on queue:default.
    if (want['queue:default']) {
        await waitFor('queue:default consumers cell >= 1', async () => firstInt(await text(desktop, cellSel('queue:default', 'consumers'))) >= 1, 10_000);
    }
    const png = await desktop.screenshot({ path: path.join(ARTIFACTS, 'dashboard.png'), fullPage: true });
    lightLum = await luminance(browser, png);
});

await s.run(`live: ${MORE} more jobs in ${NAME} change its depth cell within 10 s, without a reload`, async () => {
    check(desktop && tableOk, `the table never showed ${NAME}`);
    const before = (await backend.queues())[NAME];
    await desktop.evaluate(() => { window.__observeNoReload = true; });
    const r0 = await refreshes(desktop);
    await backend.pushMore(MORE);
    const after = (await backend.queues())[NAME];
    eq([after.depth, after.pushed], [before.depth + MORE, before.pushed + MORE], `KITE QUEUES ${NAME} depth, pushed after ${MORE} more`);
    await waitFor(`the depth cell to show ${after.depth}`, async () => {
        eq(await text(desktop, cellSel(NAME, 'depth')), String(after.depth), `${NAME} depth cell`);
        return true;
    }, 10_000, 200);
    eq(firstInt(await text(desktop, cellSel(NAME, 'pushed'))), after.pushed, `${NAME} pushed cell`);
    check(await desktop.evaluate(() => window.__observeNoReload === true), 'the page was reloaded');
    check((await refreshes(desktop)) > r0, 'data-refreshes did not grow');
});

// The states of bull:emails on its page match KITE QUEUES's jobs map.
async function checkStates(page) {
    const want = (await backend.queues())[NAME];
    check(want, `${NAME} is not in KITE QUEUES`);
    const states = ['waiting', 'delayed', 'completed', 'failed'];
    await waitFor(`${NAME}'s page to show ${states.map((st) => `${st} ${jobs(want, st)}`).join(', ')}`, async () => {
        for (const st of states) {
            eq(firstInt(await text(page, stateSel(NAME, st))), jobs(want, st), `${NAME} page: ${st}`);
        }
        return true;
    }, 10_000);
    if (await page.locator(stateSel(NAME, 'active')).count()) {
        eq(firstInt(await text(page, stateSel(NAME, 'active'))), jobs(want, 'active'), `${NAME} page: active`);
    }
}

await s.run(`1280x800: a click on the ${NAME} row shows its page with the jobs by state`, async () => {
    check(desktop && tableOk, `the table never showed ${NAME}`);
    await desktop.locator(rowSel(NAME)).first().click({ timeout: 5_000 });
    await desktop.locator(`section#queue-detail[data-queue="${NAME}"]`).waitFor({ state: 'visible', timeout: 10_000 });
    await checkStates(desktop);
    await desktop.screenshot({ path: path.join(ARTIFACTS, 'queue-detail.png'), fullPage: true });
});

await s.run('dark mode (prefers-color-scheme: dark): the page turns dark', async () => {
    check(browser && lightLum !== null, 'no light screenshot to compare with');
    const ctx = await browser.newContext({ viewport: DESKTOP, colorScheme: 'light' });
    const page = await ctx.newPage();
    page.setDefaultTimeout(15_000);
    watch(page, backend.base, seen);
    await page.goto(`${backend.base}/`, { waitUntil: 'load' });
    await page.emulateMedia({ colorScheme: 'dark' });
    check(await page.evaluate(() => matchMedia('(prefers-color-scheme: dark)').matches), 'the media query does not match');
    await page.locator(rowSel(NAME)).first().waitFor({ state: 'visible', timeout: 10_000 });
    await sleepFrames(page);
    const png = await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard-dark.png'), fullPage: true });
    const dark = await luminance(browser, png);
    check(dark < 0.5 && dark < lightLum - 0.15,
        `mean luminance dark ${dark.toFixed(3)} vs light ${lightLum.toFixed(3)}: want dark < 0.5 and well below light`);
    await ctx.close();
});

async function sleepFrames(page) {
    // Two animation frames: styles recomputed, page painted.
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
}

// Laid out at the phone's width (a <meta name="viewport" content="width=device-width">;
// without it a mobile browser lays the page out at 980 px and shrinks it; content wider
// than the screen widens the layout too), and no sideways scrolling of the whole page (a
// wide table scrolls inside a box of its own).
const noSideScroll = async (page, what) => {
    const [sw, iw] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
    check(iw === PHONE.width, `${what}: laid out ${iw} px wide on a ${PHONE.width} px phone ` +
        '(content wider than the screen, or no <meta name="viewport" content="width=device-width">)');
    check(sw <= iw + 1, `${what}: the page scrolls sideways at ${iw} px (scrollWidth ${sw})`);
};

let phoneCtx = null;
await s.run('390x844 (phone): the table fits the width, the depth cell of bull:emails is visible', async () => {
    check(browser, 'no browser');
    phoneCtx = await browser.newContext({ viewport: PHONE, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
    const page = await phoneCtx.newPage();
    page.setDefaultTimeout(15_000);
    watch(page, backend.base, seen);
    await page.goto(`${backend.base}/`, { waitUntil: 'load' });
    const want = (await backend.queues())[NAME];
    const cell = page.locator(cellSel(NAME, 'depth')).first();
    await cell.waitFor({ state: 'attached', timeout: 10_000 });
    await cell.scrollIntoViewIfNeeded();
    check(await cell.isVisible(), `${NAME}'s depth cell is not visible at 390 px`);
    await waitFor('the depth cell', async () => (await cell.textContent()).trim() === String(want.depth), 10_000);
    await noSideScroll(page, 'the dashboard');
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard-phone.png'), fullPage: true });
});

await s.run(`390x844 (phone): #/queue/${encodeURIComponent(NAME)} opens the page of ${NAME} directly`, async () => {
    check(phoneCtx, 'no phone context');
    const page = await phoneCtx.newPage();
    page.setDefaultTimeout(15_000);
    watch(page, backend.base, seen);
    await page.goto(`${backend.base}/#/queue/${encodeURIComponent(NAME)}`, { waitUntil: 'load' });
    await page.locator(`section#queue-detail[data-queue="${NAME}"]`).waitFor({ state: 'visible', timeout: 10_000 });
    await checkStates(page);
    await noSideScroll(page, 'the queue page');
    await page.screenshot({ path: path.join(ARTIFACTS, 'queue-detail-phone.png'), fullPage: true });
});

await s.run('no page errors, no request leaving the server, /api/state polled', async () => {
    check(seen.errors.length === 0, `${seen.errors.length} errors: ${seen.errors.slice(0, 5).join(' | ')}`);
    check(seen.external.length === 0, `requests to other hosts (the page must have no external assets): ${seen.external.slice(0, 5).join(', ')}`);
    check(seen.polls >= 3, `only ${seen.polls} requests to /api/state`);
});

if (browser) await Promise.race([browser.close(), new Promise((r) => setTimeout(r, 10_000))]);
await backend.close();
process.exit(s.done(` (screenshots in ${ARTIFACTS})`));
