// What add.mjs and process.mjs share: argument parsing and the server's CPU time.
import { readFileSync } from 'node:fs';

/// Parses `--name value` flags (and `--hashtag`) over `defaults`; refuses non-loopback hosts.
export function parseArgs(argv, defaults) {
  const o = { host: '127.0.0.1', port: 6379, pid: null, hashtag: false, maxSeconds: 120, ...defaults };
  const camel = (s) => s.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--hashtag') { o.hashtag = true; continue; }
    const key = a.startsWith('--') ? camel(a.slice(2)) : null;
    if (key === null || !(key in o)) throw new Error(`unknown argument ${a}`);
    const v = argv[++i];
    o[key] = key === 'host' ? v : Number(v);
  }
  if (!['127.0.0.1', 'localhost', '::1'].includes(o.host) && !o.host.startsWith('127.')) {
    throw new Error(`${o.host} is not a loopback address`);
  }
  return o;
}

/// The server's user+system CPU seconds from /proc, or null without a pid.
export function serverCpu(pid) {
  if (!pid) return null;
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100; // USER_HZ is 100 on Linux
  } catch { return null; }
}
