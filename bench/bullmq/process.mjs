// BullMQ job-processing throughput: Q queues are filled with N jobs each (addBulk, not
// measured), then BullMQ Workers in Node worker threads process them all; the measured
// part is from the workers' start until every job has completed. Prints one JSON object.
// Needs a server with Lua scripting; without it the script exits with status 3.
//
// node process.mjs --host 127.0.0.1 --port 6379 [--pid PID] [--queues 4] [--jobs 5000]
//                  [--workers 2] [--concurrency 50] [--hashtag] [--max-seconds 120]
//
// Redis Cluster: --cluster host:port[,host:port...] (startup nodes, instead of --host and
// --port) makes every connection an ioredis Cluster (each BullMQ Worker its own, which it
// duplicates for its blocking connection); it needs --hashtag, and each queue's tag is
// chosen so that the queues spread evenly over the masters (queue i on master i % N).
// --pid then takes the nodes' pids, comma-separated; their CPU is summed.
import { Worker as Thread, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { parseArgs, serverCpu, clusterClient, spreadTags } from './common.mjs';
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

function queueSpec(o, run, i) {
  if (o.tags) return { name: `proc${i}`, prefix: `{${o.tags[i]}}` };
  return o.hashtag
    ? { name: `proc${i}`, prefix: `{kp${run}q${i}}` }
    : { name: `kp${run}q${i}`, prefix: 'bull' };
}

if (isMainThread) {
  const o = parseArgs(process.argv.slice(2), { queues: 4, jobs: 5000, workers: 2, concurrency: 50 });
  const out = (obj) => console.log(JSON.stringify({ workload: 'bullmq-process', ...obj }));
  let connection = { host: o.host, port: o.port, maxRetriesPerRequest: null };
  const probe = o.cluster
    ? clusterClient(o, { maxRetriesPerRequest: 1 }, { lazyConnect: true })
    : new IORedis({ ...connection, maxRetriesPerRequest: 1, lazyConnect: true });
  await probe.connect();
  try {
    await probe.eval('return 1', 0);
  } catch (e) {
    out({ error: `server lacks scripting (EVAL answered: ${e.message})`, scripting: false });
    probe.disconnect();
    process.exit(3);
  }
  const run = `${process.pid}${Date.now() % 100000}`;
  const spread = o.cluster ? await spreadTags(probe, o.queues, (i) => `kp${run}q${i}`) : null;
  if (spread) {
    o.tags = spread.tags;
    // The filling queues share one Cluster (not measured); the workers make their own.
    connection = clusterClient(o, { maxRetriesPerRequest: null });
  }
  // Fill the queues (not measured).
  const queues = [];
  for (let i = 0; i < o.queues; i++) {
    const spec = queueSpec(o, run, i);
    const q = new Queue(spec.name, { prefix: spec.prefix, connection });
    queues.push(q);
    for (let start = 0; start < o.jobs; start += 500) {
      const batch = [];
      for (let n = start; n < Math.min(o.jobs, start + 500); n++) {
        batch.push({ name: 'bench', data: { n, payload: 'x'.repeat(64) },
                     opts: { removeOnComplete: true } });
      }
      await q.addBulk(batch);
    }
  }
  const total = o.queues * o.jobs;
  const done = new Int32Array(new SharedArrayBuffer(4));
  const threads = [];
  const ready = [];
  for (let w = 0; w < o.workers; w++) {
    const t = new Thread(new URL(import.meta.url), { workerData: { o, run, done } });
    threads.push(t);
    ready.push(new Promise((res, rej) => {
      t.on('error', rej);
      t.on('message', (m) => { if (m.ready) res(); });
    }));
  }
  await Promise.all(ready);
  const cpu0 = serverCpu(o.pid);
  const me0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (const t of threads) t.postMessage({ go: true });
  const deadline = Date.now() + o.maxSeconds * 1000;
  while (Atomics.load(done, 0) < total && Date.now() < deadline) {
    await new Promise((res) => setTimeout(res, 20));
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu1 = serverCpu(o.pid);
  const me1 = process.cpuUsage(me0);
  const processed = Atomics.load(done, 0);
  const exited = threads.map((t) => new Promise((res) => t.on('exit', res)));
  for (const t of threads) t.postMessage({ stop: true });
  await Promise.all(exited);
  for (const q of queues) {
    try { await q.obliterate({ force: true }); } catch { /* best effort */ }
    await q.close();
  }
  if (o.cluster) connection.disconnect();
  probe.disconnect();
  const serverCpuS = cpu0 !== null && cpu1 !== null ? cpu1 - cpu0 : null;
  out({
    queues: o.queues, jobs: o.jobs, workers: o.workers, concurrency: o.concurrency,
    hashtag: o.hashtag, prefix: o.hashtag ? '{kp<run>q<i>}' : 'bull',
    ...(spread ? { prefix: '{kp<run>q<i>[.<k>]}', cluster: o.cluster,
                   masters: spread.masters.length, queues_per_master: spread.perMaster } : {}),
    operations: processed, expected: total, seconds, ops_per_s: processed / seconds,
    server_cpu_s: serverCpuS,
    server_cpu_us_per_op: serverCpuS !== null && processed > 0 ? serverCpuS * 1e6 / processed : null,
    // The workers' CPU is in their threads; process.cpuUsage covers the whole process.
    client_cpu_s: (me1.user + me1.system) / 1e6,
  });
  process.exit(processed === total ? 0 : 1);
} else {
  const { o, run, done } = workerData;
  const connection = { host: o.host, port: o.port, maxRetriesPerRequest: null };
  const workers = [];
  const clusters = []; // --cluster: one ioredis Cluster per Worker, as IORedis is without it
  for (let i = 0; i < o.queues; i++) {
    const spec = queueSpec(o, run, i);
    let conn = connection;
    if (o.cluster) {
      conn = clusterClient(o, { maxRetriesPerRequest: null });
      clusters.push(conn);
    }
    const w = new Worker(spec.name, async () => 'ok', {
      prefix: spec.prefix, connection: conn, concurrency: o.concurrency, autorun: false,
    });
    w.on('completed', () => Atomics.add(done, 0, 1));
    workers.push(w);
  }
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  parentPort.postMessage({ ready: true });
  parentPort.on('message', async (m) => {
    if (m.go) for (const w of workers) w.run();
    if (m.stop) {
      await Promise.all(workers.map((w) => w.close(true)));
      for (const c of clusters) c.disconnect();
      process.exit(0);
    }
  });
}
