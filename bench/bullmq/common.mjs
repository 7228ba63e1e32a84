// What add.mjs and process.mjs share: argument parsing, the server's CPU time, and the
// Redis Cluster side (--cluster): ioredis Cluster clients and one {hashtag} per queue.
import { readFileSync } from 'node:fs';
import IORedis from 'ioredis';

/// Parses `--name value` flags (and `--hashtag`) over `defaults`; refuses non-loopback hosts.
/// `--pid` takes one pid or a comma-separated list (their CPU is summed); `--cluster` takes
/// the startup nodes `host:port[,host:port...]` and needs `--hashtag`.
export function parseArgs(argv, defaults) {
  const o = { host: '127.0.0.1', port: 6379, pid: null, hashtag: false, maxSeconds: 120,
              cluster: null, ...defaults };
  const camel = (s) => s.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--hashtag') { o.hashtag = true; continue; }
    const key = a.startsWith('--') ? camel(a.slice(2)) : null;
    if (key === null || !(key in o)) throw new Error(`unknown argument ${a}`);
    const v = argv[++i];
    if (key === 'cluster') o.cluster = v;
    else if (key === 'pid' && v !== undefined && v.includes(',')) o.pid = v.split(',').map(Number);
    else o[key] = key === 'host' ? v : Number(v);
  }
  if (!isLoopback(o.host)) throw new Error(`${o.host} is not a loopback address`);
  if (o.cluster !== null) {
    o.clusterNodes = parseNodes(o.cluster);
    if (!o.hashtag) {
      console.error('--cluster needs --hashtag: in a cluster every key of a BullMQ queue must '
                    + 'hash to one slot, so each queue gets its own {hashtag} prefix');
      process.exit(2);
    }
  }
  return o;
}

function isLoopback(host) {
  return ['127.0.0.1', 'localhost', '::1'].includes(host) || host.startsWith('127.');
}

/// `host:port[,host:port...]` as ioredis Cluster startup nodes, loopback only.
function parseNodes(text) {
  const nodes = String(text ?? '').split(',').filter((s) => s !== '').map((s) => {
    const at = s.lastIndexOf(':');
    const host = at > 0 ? s.slice(0, at).replace(/^\[(.*)\]$/, '$1') : '';
    const port = Number(s.slice(at + 1));
    if (!host || !Number.isInteger(port) || port <= 0 || port > 65535) {
      throw new Error(`--cluster: ${s} is not host:port`);
    }
    if (!isLoopback(host)) throw new Error(`${host} is not a loopback address`);
    return { host, port };
  });
  if (nodes.length === 0) throw new Error('--cluster needs at least one host:port');
  return nodes;
}

function oneCpu(pid) {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100; // USER_HZ is 100 on Linux
  } catch { return null; }
}

/// The server's user+system CPU seconds from /proc, or null without a pid. With a list of
/// pids (a cluster's nodes), their sum; null if any of them cannot be read.
export function serverCpu(pid) {
  if (!pid) return null;
  if (!Array.isArray(pid)) return oneCpu(pid);
  let sum = 0;
  for (const p of pid) {
    const c = oneCpu(p);
    if (c === null) return null;
    sum += c;
  }
  return sum;
}

/// An ioredis Cluster over the startup nodes, its node connections made with `redisOptions`
/// (what a single-server run passes to IORedis). BullMQ takes it as `connection` and then
/// treats it as shared: whoever made it disconnects it.
export function clusterClient(o, redisOptions, extra = {}) {
  return new IORedis.Cluster(o.clusterNodes, { redisOptions, ...extra });
}

/// CRC16/XMODEM over a string's UTF-8 bytes, the cluster's key hash.
function crc16(s) {
  let crc = 0;
  for (const b of Buffer.from(s, 'utf8')) {
    crc ^= b << 8;
    for (let k = 0; k < 8; k++) crc = ((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1) & 0xffff;
  }
  return crc;
}

/// The slot of a hash tag's content (what `{tag}...` keys hash to).
export function tagSlot(tag) { return crc16(tag) & 0x3fff; }

/// One hash tag per queue, `base(i)` or `base(i).k` with the smallest k, chosen so that queue
/// i's slot is served by master i % N (masters ordered by address): the queues spread evenly
/// over the masters, the same way on every server. Returns { tags, masters, perMaster }.
export async function spreadTags(client, queues, base) {
  const slots = await client.cluster('SLOTS');
  const ranges = new Map();
  for (const [start, end, [host, port]] of slots) {
    const addr = `${host}:${port}`;
    if (!ranges.has(addr)) ranges.set(addr, []);
    ranges.get(addr).push([start, end]);
  }
  const masters = [...ranges.keys()].sort();
  if (masters.length === 0) throw new Error('CLUSTER SLOTS answered no slots');
  const perMaster = Object.fromEntries(masters.map((m) => [m, 0]));
  const tags = [];
  for (let i = 0; i < queues; i++) {
    const m = masters[i % masters.length];
    let tag = null;
    for (let k = 0; k < 100000 && tag === null; k++) {
      const t = k === 0 ? base(i) : `${base(i)}.${k}`;
      const slot = tagSlot(t);
      if (ranges.get(m).some(([a, b]) => a <= slot && slot <= b)) tag = t;
    }
    if (tag === null) throw new Error(`no hash tag found for master ${m}`);
    tags.push(tag);
    perMaster[m]++;
  }
  return { tags, masters, perMaster };
}
