// BullMQ add-job throughput: Node worker threads calling Queue.add for a fixed time on
// Q queues, with BullMQ's default key prefix or one {hashtag} prefix per queue.
// Prints one JSON object. Needs a server with Lua scripting (BullMQ's commands are
// scripts); a server without it is reported and the script exits with status 3.
//
// node add.mjs --host 127.0.0.1 --port 6379 [--pid PID] [--queues 4] [--workers 4]
//              [--concurrency 32] [--seconds 10] [--hashtag] [--max-seconds 120]
//
// Redis Cluster: --cluster host:port[,host:port...] (startup nodes, instead of --host and
// --port) makes every connection an ioredis Cluster; it needs --hashtag, and each queue's
// tag is chosen so that the queues spread evenly over the masters (queue i on master
// i % N). --pid then takes the nodes' pids, comma-separated; their CPU is summed.
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { parseArgs, serverCpu, clusterClient, spreadTags } from './common.mjs';
import { Queue } from 'bullmq';
import IORedis from 'ioredis';

function queueSpec(o, run, i) {
  if (o.tags) return { name: `add${i}`, prefix: `{${o.tags[i]}}` };
  return o.hashtag
    ? { name: `add${i}`, prefix: `{kb${run}q${i}}` }
    : { name: `kb${run}q${i}`, prefix: 'bull' };
}

if (isMainThread) {
  const o = parseArgs(process.argv.slice(2), { queues: 4, workers: 4, concurrency: 32, seconds: 10 });
  o.seconds = Math.min(o.seconds, o.maxSeconds);
  const out = (obj) => console.log(JSON.stringify({ workload: 'bullmq-add', ...obj }));
  const probe = o.cluster
    ? clusterClient(o, { maxRetriesPerRequest: 1 }, { lazyConnect: true })
    : new IORedis({ host: o.host, port: o.port, maxRetriesPerRequest: 1, lazyConnect: true });
  await probe.connect();
  try {
    await probe.eval('return 1', 0);
  } catch (e) {
    out({ error: `server lacks scripting (EVAL answered: ${e.message}); BullMQ cannot run against it`,
          scripting: false });
    probe.disconnect();
    process.exit(3);
  }
  const run = `${process.pid}${Date.now() % 100000}`;
  const spread = o.cluster ? await spreadTags(probe, o.queues, (i) => `kb${run}q${i}`) : null;
  if (spread) o.tags = spread.tags;
  const workers = [];
  const ready = [];
  const results = [];
  for (let w = 0; w < o.workers; w++) {
    const worker = new Worker(new URL(import.meta.url), { workerData: { o, run, w } });
    workers.push(worker);
    ready.push(new Promise((res, rej) => {
      worker.on('error', rej);
      worker.on('message', (m) => {
        if (m.ready) res();
        if (m.done) results.push(m);
      });
    }));
  }
  await Promise.all(ready);
  const cpu0 = serverCpu(o.pid);
  const me0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const finished = workers.map((w) => new Promise((res) => w.on('exit', res)));
  for (const w of workers) w.postMessage({ go: true });
  await Promise.all(finished);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu1 = serverCpu(o.pid);
  const me1 = process.cpuUsage(me0);
  const adds = results.reduce((a, m) => a + m.adds, 0);
  const errors = results.reduce((a, m) => a + m.errors, 0);
  // Clean up the jobs this run added.
  for (let i = 0; i < o.queues; i++) {
    const spec = queueSpec(o, run, i);
    const connection = o.cluster ? probe : { host: o.host, port: o.port };
    const q = new Queue(spec.name, { prefix: spec.prefix, connection });
    try { await q.obliterate({ force: true }); } catch { /* best effort */ }
    await q.close();
  }
  probe.disconnect();
  const serverCpuS = cpu0 !== null && cpu1 !== null ? cpu1 - cpu0 : null;
  out({
    queues: o.queues, workers: o.workers, concurrency: o.concurrency, hashtag: o.hashtag,
    prefix: o.hashtag ? '{kb<run>q<i>}' : 'bull',
    ...(spread ? { prefix: '{kb<run>q<i>[.<k>]}', cluster: o.cluster,
                   masters: spread.masters.length, queues_per_master: spread.perMaster } : {}),
    operations: adds, errors, seconds, ops_per_s: adds / seconds,
    server_cpu_s: serverCpuS,
    server_cpu_us_per_op: serverCpuS !== null && adds > 0 ? serverCpuS * 1e6 / adds : null,
    client_cpu_s: (me1.user + me1.system) / 1e6,
  });
  process.exit(errors > 0 && adds === 0 ? 1 : 0);
} else {
  const { o, run, w } = workerData;
  const queues = [];
  const clusters = []; // --cluster: one ioredis Cluster per Queue, as IORedis is without it
  for (let i = 0; i < o.queues; i++) {
    const spec = queueSpec(o, run, i);
    let connection = { host: o.host, port: o.port, maxRetriesPerRequest: null };
    if (o.cluster) {
      connection = clusterClient(o, { maxRetriesPerRequest: null });
      clusters.push(connection);
    }
    queues.push(new Queue(spec.name, {
      prefix: spec.prefix,
      connection,
    }));
  }
  await Promise.all(queues.map((q) => q.waitUntilReady()));
  parentPort.postMessage({ ready: true });
  await new Promise((res) => parentPort.once('message', res));
  const end = Date.now() + o.seconds * 1000;
  let adds = 0;
  let errors = 0;
  let lastError = null;
  let n = w;
  async function loop() {
    while (Date.now() < end) {
      const q = queues[n++ % queues.length];
      try {
        await q.add('bench', { n, worker: w, payload: 'x'.repeat(64) });
        adds++;
      } catch (e) {
        errors++;
        lastError = e.message;
        if (errors > 100) return;
      }
    }
  }
  await Promise.all(Array.from({ length: o.concurrency }, loop));
  await Promise.all(queues.map((q) => q.close()));
  for (const c of clusters) c.disconnect();
  parentPort.postMessage({ done: true, adds, errors, lastError });
}
