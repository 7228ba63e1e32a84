#!/usr/bin/env python3
"""Replication benchmarks (issue 11), side by side with redis-server, on loopback only.

1. Full sync of N queued jobs (150-byte Sidekiq-shaped payloads in 10 lists): the time
   from REPLICAOF until the replica is up with the master's offset, and the master's
   extra memory meanwhile (the PSS of the master and any child it forks, sampled every
   10 ms, minus its PSS before). Pairs: Kite -> Kite, Kite -> Redis, Redis -> Redis.
2. The master's server CPU per operation (kite-bench drain and ops), without and with
   one replica of its own kind attached: the ratio with/without, for Kite and for Redis.

Every run is bounded; every server started here is stopped at the end, also on error.

    python3 scripts/bench-replication.py [--jobs 1000000] [--reps 3] [--out bench/results/replication]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KITE = os.path.join(ROOT, "target", "release", "kite")
BENCH = os.path.join(ROOT, "target", "release", "kite-bench")
REDIS = shutil.which("redis-server")
PROCS = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(kind, port, threads=2):
    d = tempfile.mkdtemp(prefix=f"bench-repl-{kind}-")
    common = ["--port", str(port), "--dir", d, "--save", "", "--appendonly", "no",
              "--repl-diskless-sync-delay", "0"]
    if kind == "kite":
        args = [KITE] + common + ["--threads", str(threads)]
    else:
        args = [REDIS] + common
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    PROCS.append((p, d))
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if cmd(port, "PING") == "PONG":
                return p
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{kind} did not start on {port}")


def stop(p):
    for q, d in list(PROCS):
        if q is p:
            q.kill()
            q.wait()
            shutil.rmtree(d, ignore_errors=True)
            PROCS.remove((q, d))


def cmd(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port)] + list(args), capture_output=True,
                         text=True, timeout=60)
    return out.stdout.strip()


def info(port, section):
    d = {}
    for line in cmd(port, "INFO", section).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            d[k] = v
    return d


def pss_kb(pid):
    """PSS of a process and its children (a fork's copy-on-write pages count once)."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def load_jobs(port, jobs):
    payload = '{"class":"HardJob","args":[1,2,3],"jid":"%s","retry":true,"queue":"default","created_at":1700000000.123}'
    chunk = []
    per = 1000
    proc = subprocess.Popen(["redis-cli", "-p", str(port), "--pipe"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    for i in range(0, jobs, per):
        q = f"queue:q{(i // per) % 10}".encode()
        items = []
        for j in range(i, min(i + per, jobs)):
            body = (payload % f"{j:024d}").encode()
            body = body + b" " * max(0, 150 - len(body))
            items.append(body)
        parts = [b"*%d\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n" % (2 + len(items), len(q), q)]
        for b in items:
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        chunk.append(b"".join(parts))
        if len(chunk) >= 50:
            proc.stdin.write(b"".join(chunk))
            chunk = []
    proc.stdin.write(b"".join(chunk))
    proc.stdin.close()
    proc.wait(timeout=600)


def full_sync(master_kind, replica_kind, jobs):
    mport, rport = free_port(), free_port()
    m = start(master_kind, mport)
    r = None
    try:
        load_jobs(mport, jobs)
        time.sleep(1)
        before = pss_kb(m.pid)
        r = start(replica_kind, rport)
        t0 = time.time()
        cmd(rport, "REPLICAOF", "127.0.0.1", str(mport))
        peak = before
        deadline = t0 + 600
        while time.time() < deadline:
            peak = max(peak, pss_kb(m.pid))
            ri = info(rport, "replication")
            if ri.get("master_link_status") == "up" and ri.get("master_sync_in_progress") == "0":
                mo = info(mport, "replication").get("master_repl_offset")
                if ri.get("slave_repl_offset") == mo:
                    break
            time.sleep(0.01)
        else:
            raise RuntimeError("the full sync did not finish in 600 s")
        secs = time.time() - t0
        keys = cmd(rport, "DBSIZE")
        llen = sum(int(cmd(rport, "LLEN", f"queue:q{i}")) for i in range(10))
        assert llen == jobs, f"replica holds {llen} jobs, expected {jobs}"
        return {"master": master_kind, "replica": replica_kind, "jobs": jobs, "seconds": round(secs, 3),
                "master_pss_before_mb": round(before / 1024, 1),
                "master_extra_mb": round((peak - before) / 1024, 1), "replica_keys": keys}
    finally:
        if r:
            stop(r)
        stop(m)


def bench(port, pid, workload):
    if workload == "drain":
        args = ["drain", "--queues", "2", "--jobs", "100000"]
    else:
        args = ["ops", "--pipeline", "1,16", "--requests", "200000"]
    out = subprocess.run([BENCH, "--port", str(port), "--server-pid", str(pid)] + args,
                         capture_output=True, text=True, timeout=600)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return {r["case"]: r["server_cpu_us_per_op"] for r in rows}


def overhead(kind, reps):
    results = {}
    for with_replica in (False, True):
        for _ in range(reps):
            mport = free_port()
            m = start(kind, mport, threads=1)
            r = None
            try:
                if with_replica:
                    rport = free_port()
                    r = start(kind, rport, threads=1)
                    cmd(rport, "REPLICAOF", "127.0.0.1", str(mport))
                    deadline = time.time() + 30
                    while info(rport, "replication").get("master_link_status") != "up":
                        if time.time() > deadline:
                            raise RuntimeError("replica did not come up")
                        time.sleep(0.05)
                for w in ("drain", "ops"):
                    for case, us in bench(mport, m.pid, w).items():
                        results.setdefault((case, with_replica), []).append(us)
            finally:
                if r:
                    stop(r)
                stop(m)
    table = {}
    for (case, with_replica), vals in results.items():
        table.setdefault(case, {})["with" if with_replica else "without"] = statistics.median(vals)
    for case, v in table.items():
        v["ratio"] = round(v["with"] / v["without"], 3) if v.get("without") else None
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "replication"))
    ap.add_argument("--skip-sync", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "redis": subprocess.run(
        [REDIS, "--version"], capture_output=True, text=True).stdout.strip()}
    if not a.skip_sync:
        report["full_sync"] = []
        for pair in (("kite", "kite"), ("kite", "redis"), ("redis", "redis")):
            for _ in range(a.reps):
                r = full_sync(pair[0], pair[1], a.jobs)
                print(json.dumps(r), flush=True)
                report["full_sync"].append(r)
    if not a.skip_cpu:
        report["cpu"] = {k: overhead(k, a.reps) for k in ("kite", "redis")}
        print(json.dumps(report["cpu"], indent=1), flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    def cleanup(*_):
        for p, d in PROCS:
            p.kill()
            shutil.rmtree(d, ignore_errors=True)
        sys.exit(1)
    signal.signal(signal.SIGINT, cleanup)
    signal.signal(signal.SIGTERM, cleanup)
    try:
        main()
    finally:
        for p, d in PROCS:
            p.kill()
            shutil.rmtree(d, ignore_errors=True)
