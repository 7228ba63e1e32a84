// Child-process worker for the stalled-job scenario of suite.mjs: takes one job, says so on
// stdout ("started <id>") and never finishes it. The parent SIGKILLs this process, so the
// job's lock (3 s) expires and another worker must recover the job. Its stalled check runs
// every second too: a check sets a guard key that keeps other workers' checks off for the
// checker's own interval.
// Usage: node stalled-worker.mjs REDIS_URL PREFIX QUEUE
import { Worker } from 'bullmq';
import { connectionFor } from './connection.mjs';

const [url, prefix, queue] = process.argv.slice(2);
const w = new Worker(
    queue,
    async (job) => {
        process.stdout.write(`started ${job.id}\n`);
        await new Promise(() => {}); // hang until killed
    },
    { connection: connectionFor(url), prefix, concurrency: 1, lockDuration: 3000, stalledInterval: 1000 },
);
w.on('error', (e) => process.stderr.write(`stalled-worker: ${e.message}\n`));
