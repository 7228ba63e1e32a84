#!/usr/bin/env python3
"""BGSAVE under a queue workload, Kite beside redis-server (loopback only, bounded).

For each server: fill Q queues with N Sidekiq-sized jobs (~150 bytes), then repeat R times:
  - run producers (LPUSH) and consumers (RPOP) on those queues for a fixed time without a
    snapshot, recording each call's latency;
  - run the same workload while a BGSAVE runs, sampling the server's RSS every 10 ms;
and report the snapshot's duration, the peak RSS above the RSS before it (and Redis's
rdb_last_cow_size), and the p99 latency with and without the snapshot (medians over the
repetitions, with min and max). Finally it saves, restarts each server on its file and
times the load until PING answers without -LOADING.

    python3 scripts/bench-snapshot.py --jobs 1000000 --reps 10

Prints one JSON object and a readable table. Needs redis-py (pip install redis).
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import redis


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Server:
    def __init__(self, name, argv, data_dir):
        self.name = name
        self.port = free_port()
        self.dir = data_dir
        self.argv = argv + ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", data_dir,
                            "--save", "", "--appendonly", "no"]
        self.proc = None

    def start(self, timeout=300):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.perf_counter()
        deadline = started + timeout
        while time.perf_counter() < deadline:
            try:
                c = redis.Redis(port=self.port, socket_timeout=2)
                if c.ping() and c.info("persistence").get("loading", 0) == 0:
                    return time.perf_counter() - started
            except redis.exceptions.BusyLoadingError:
                pass
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass
            time.sleep(0.005)
        raise RuntimeError(f"{self.name} did not start")

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def client(self):
        return redis.Redis(port=self.port, socket_timeout=30)


def fill(server, queues, jobs):
    c = server.client()
    pipe_size = 1000
    job = lambda i: json.dumps({"class": "HardWorker", "args": [i, "x" * 40],
                                "jid": f"{i:024x}", "retry": True, "queue": "default",
                                "created_at": 1700000000.123})
    per_queue = jobs // queues
    for q in range(queues):
        for start in range(0, per_queue, pipe_size):
            c.lpush(f"queue:{q}", *[job(i) for i in range(start, min(per_queue, start + pipe_size))])


def workload(server, queues, seconds, stop_when=None):
    """Producers push and consumers pop for `seconds` (or until stop_when() is true, at
    most `seconds`); returns every call's latency in microseconds."""
    lat = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds
    done = threading.Event()

    def run(kind, q):
        c = server.client()
        mine = []
        payload = "y" * 150
        while not done.is_set() and time.perf_counter() < end:
            t0 = time.perf_counter()
            if kind == "push":
                c.lpush(f"queue:{q}", payload)
            else:
                c.rpop(f"queue:{q}")
            mine.append((time.perf_counter() - t0) * 1e6)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(k, q % queues))
               for q, k in enumerate(["push", "pop", "push", "pop"])]
    for t in threads:
        t.start()
    if stop_when:
        while time.perf_counter() < end and not stop_when():
            time.sleep(0.01)
        done.set()
    for t in threads:
        t.join()
    return lat


def p99(xs):
    xs = sorted(xs)
    return xs[int(len(xs) * 0.99)] if xs else 0


def one_rep(server, queues, seconds):
    base = workload(server, queues, seconds)
    c = server.client()
    pid = server.proc.pid
    rss_before = rss_bytes(pid)
    peak = [rss_before]
    started = time.perf_counter()
    c.bgsave()
    finished = [None]

    def saving_done():
        peak[0] = max(peak[0], rss_bytes(pid))
        info = c.info("persistence")
        if info["rdb_bgsave_in_progress"] == 0 and finished[0] is None:
            finished[0] = time.perf_counter()
            return True
        return False

    during = workload(server, queues, 600, stop_when=saving_done)
    while finished[0] is None:
        saving_done()
        time.sleep(0.01)
    info = c.info("persistence")
    return {
        "snapshot_s": finished[0] - started,
        "rss_before": rss_before,
        "peak_extra_rss": peak[0] - rss_before,
        "cow_size": info.get("rdb_last_cow_size", 0),
        "p99_us_without": p99(base),
        "p99_us_during": p99(during),
        "ops_during": len(during),
        "status": info["rdb_last_bgsave_status"],
    }


def summary(runs, key):
    xs = [r[key] for r in runs]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=2.0, help="workload time without a snapshot")
    ap.add_argument("--kite", default="target/release/kite")
    ap.add_argument("--kite-threads", type=int, default=2)
    ap.add_argument("--redis", default=shutil.which("redis-server") or "redis-server")
    a = ap.parse_args()
    results = {}
    for name, argv in (("redis", [a.redis]), ("kite", [a.kite, "--threads", str(a.kite_threads)])):
        d = tempfile.mkdtemp(prefix=f"bench-snapshot-{name}-")
        s = Server(name, argv, d)
        try:
            s.start()
            fill(s, a.queues, a.jobs)
            info = s.client().info("memory")
            runs = [one_rep(s, a.queues, a.seconds) for _ in range(a.reps)]
            s.client().save()
            size = os.path.getsize(os.path.join(d, "dump.rdb"))
            s.stop()
            load_s = s.start()
            keys = s.client().dbsize()
            s.stop()
            results[name] = {
                "used_memory": info["used_memory"],
                "runs": runs,
                "snapshot_s": summary(runs, "snapshot_s"),
                "peak_extra_rss": summary(runs, "peak_extra_rss"),
                "cow_size": summary(runs, "cow_size"),
                "rss_before": summary(runs, "rss_before"),
                "p99_us_without": summary(runs, "p99_us_without"),
                "p99_us_during": summary(runs, "p99_us_during"),
                "rdb_bytes": size,
                "load_s": load_s,
                "keys_after_load": keys,
            }
        finally:
            s.stop()
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(results))
    rows = ["snapshot_s", "peak_extra_rss", "cow_size", "rss_before", "p99_us_without", "p99_us_during"]
    print(f"{'':22}{'redis':>26}{'kite':>26}", file=__import__('sys').stderr)
    for r in rows:
        cells = []
        for name in ("redis", "kite"):
            m = results[name][r]
            cells.append(f"{m['median']:.4g} [{m['min']:.4g}, {m['max']:.4g}]")
        print(f"{r:22}{cells[0]:>26}{cells[1]:>26}", file=__import__('sys').stderr)
    for r in ("used_memory", "rdb_bytes", "load_s"):
        print(f"{r:22}{results['redis'][r]:>26.4g}{results['kite'][r]:>26.4g}", file=__import__('sys').stderr)


if __name__ == "__main__":
    main()
