"""Live migration off Redis, the recipe of the Sentinel/replication issue, with a producer
running throughout:

  1. a fresh Kite: REPLICAOF <redis> <port>; wait for master_link_status:up
  2. CLIENT PAUSE 60000 WRITE on Redis; wait until Kite's slave_repl_offset (INFO
     replication) equals Redis's master_repl_offset
  3. REPLICAOF NO ONE on Kite; point the producer at Kite

Redis starts with a Sidekiq-like and a BullMQ-like data set (lists, sets, sorted sets,
hashes, a stream, counters, keys with a TTL, a 1 MiB string). The producer LPUSHes numbered
jobs onto a queue; a job counts as acknowledged when LPUSH replied. Its socket timeout is
500 ms, so a push held by CLIENT PAUSE is not acknowledged, and it is retried against the
current target. At the end every acknowledged job is in Kite's list, in order, Redis's list
as it was at the pause is the tail of Kite's, the rest of the data set is on Kite as on
Redis (TTLs included), and Kite takes writes.

test_bullmq_migration runs the same recipe under a live BullMQ queue, worker and producer
(bullmq_migration.mjs).
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cluster import RedisServer, Server, tail, wait_for

QUEUE = "queue:migrating"


class JobProducer(threading.Thread):
    """LPUSH QUEUE job-<n>, n = 0, 1, ...: each job retried until a reply acknowledges it,
    against whichever server `target` is when the attempt starts."""

    def __init__(self, target):
        super().__init__(daemon=True)
        self.target = target
        self.acked = []  # (n, target name)
        self.errors = {}
        self.fatal = None
        self.stop_flag = threading.Event()
        self._clients = {}

    def client(self, server):
        c = self._clients.get(server.port)
        if c is None:
            c = server.client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0),
                              decode_responses=True)
            self._clients[server.port] = c
        return c

    def count_on(self, name):
        return sum(1 for _, t in self.acked if t == name)

    def run(self):
        try:
            n = 0
            while not self.stop_flag.is_set():
                backoff = 0.01
                deadline = time.monotonic() + 45
                while not self.stop_flag.is_set():
                    server = self.target
                    try:
                        self.client(server).lpush(QUEUE, f"job-{n}")
                        self.acked.append((n, server.name))
                        n += 1
                        break
                    except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError) as e:
                        key = f"{server.name}: {type(e).__name__}"
                        self.errors[key] = self.errors.get(key, 0) + 1
                        c = self._clients.pop(server.port, None)
                        if c is not None:
                            c.close()
                    except redis.ResponseError as e:
                        self.fatal = f"job {n} on {server.name}: unexpected error reply {e}"
                        return
                    if time.monotonic() > deadline:
                        self.fatal = f"job {n} not acknowledged within 45 s ({self.errors})"
                        return
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 0.1)
        except Exception as e:  # noqa: BLE001
            self.fatal = f"producer crashed: {e!r}"
        finally:
            for c in self._clients.values():
                c.close()

    def summary(self):
        by = {}
        for _, t in self.acked:
            by[t] = by.get(t, 0) + 1
        return f"{len(self.acked)} jobs acknowledged (by server: {by}), errors {self.errors}, fatal: {self.fatal}"


class Migration:
    """The servers of one run, for the failure report."""

    def __init__(self):
        self.work = tempfile.mkdtemp(prefix="kite-migration.")
        self.redis = RedisServer(self.work, "redis")
        self.kite = Server(self.work, "kite", threads=2)
        self.producer = None
        self.events = []
        self.t0 = time.monotonic()

    def note(self, what):
        self.events.append((time.monotonic() - self.t0, what))

    def report(self):
        out = [f"=== migration in {self.work}", "--- events (s since start):"]
        out += [f"  {t:7.2f} {w}" for t, w in self.events]
        if self.producer:
            out.append(f"--- producer: {self.producer.summary()}")
        for s in (self.redis, self.kite):
            out += [f"--- {s.label()}: {'running' if s.alive() else 'NOT running'}", s.raw_info_repl(),
                    f"--- {s.name} log (end):", tail(s.log, 40)]
        return "\n".join(out)

    def close(self, keep=False):
        if self.producer:
            self.producer.stop_flag.set()
            self.producer.join(timeout=10)
        for s in (self.kite, self.redis):
            s.stop()
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)


def seed(c):
    """A Sidekiq-like and a BullMQ-like data set, plus assorted types and TTLs."""
    p = c.pipeline(transaction=False)
    now = 1_700_000_000
    # Sidekiq: queues set, queue lists of JSON jobs, schedule/retry/dead sorted sets,
    # stat counters, a process hash with a TTL, a unique-job lock with a TTL.
    p.sadd("queues", "default", "critical", "low")
    for q, n in (("default", 400), ("critical", 50), ("low", 10)):
        for i in range(n):
            p.lpush(f"queue:{q}", json.dumps({"class": "HardJob", "args": [i, q], "jid": f"{q}{i:08x}",
                                               "queue": q, "created_at": now + i, "retry": True}))
    for i in range(150):
        job = json.dumps({"class": "LaterJob", "args": [i], "jid": f"s{i:08x}"})
        p.zadd("schedule", {job: now + 3600 + i})
        if i % 3 == 0:
            p.zadd("retry", {job.replace("LaterJob", "FlakyJob"): now + 60 + i})
        if i % 10 == 0:
            p.zadd("dead", {job.replace("LaterJob", "DeadJob"): now - i})
    p.set("stat:processed", 123456)
    p.set("stat:failed", 789)
    p.incrby("stat:processed:2024-01-01", 42)
    p.hset("host-1:1234:abcdef", mapping={"info": json.dumps({"hostname": "host-1", "pid": 1234}),
                                          "busy": 3, "beat": now, "quiet": "false"})
    p.expire("host-1:1234:abcdef", 600)
    p.sadd("processes", "host-1:1234:abcdef")
    p.set("unique:lock:abc", "token-1", px=900_000)
    # BullMQ: id counter, wait list, delayed/completed/prioritized sorted sets, job hashes,
    # meta hash, events stream with MAXLEN.
    p.set("bull:emails:id", 300)
    for i in range(1, 301):
        p.hset(f"bull:emails:{i}", mapping={"name": "send", "data": json.dumps({"to": f"u{i}@example.com"}),
                                            "opts": json.dumps({"attempts": 3}), "timestamp": now * 1000 + i,
                                            "delay": 0, "priority": 0})
        if i <= 200:
            p.lpush("bull:emails:wait", i)
        elif i <= 250:
            p.zadd("bull:emails:delayed", {str(i): (now * 1000 + 60_000 + i) * 4096})
        else:
            p.zadd("bull:emails:completed", {str(i): now * 1000 + i})
            p.hset(f"bull:emails:{i}", mapping={"returnvalue": json.dumps(i), "finishedOn": now * 1000 + i})
    p.hset("bull:emails:meta", mapping={"opts.maxLenEvents": 10000, "version": "bullmq:6.7.0"})
    for i in range(200):
        p.xadd("bull:emails:events", {"event": "added", "jobId": str(i), "name": "send"}, maxlen=10000,
               approximate=False)
    # Assorted: a big string, a hash with many fields, a set of integers, an expiring key.
    p.set("blob", os.urandom(1 << 20))
    p.hset("wide", mapping={f"f{i}": i for i in range(1000)})
    p.sadd("ints", *range(500))
    p.set("session:1", "x", ex=3600)
    p.execute()


def snapshot(server, skip):
    """Every key but those in `skip`: (type, value, has a TTL) from the server, bytes as-is."""
    c = server.client(decode_responses=False)
    try:
        out = {}
        for key in c.scan_iter(count=1000):
            if key.decode() in skip:
                continue
            t = c.type(key).decode()
            if t == "string":
                v = c.get(key)
            elif t == "list":
                v = c.lrange(key, 0, -1)
            elif t == "set":
                v = sorted(c.smembers(key))
            elif t == "zset":
                v = c.zrange(key, 0, -1, withscores=True)
            elif t == "hash":
                v = sorted(c.hgetall(key).items())
            elif t == "stream":
                v = c.xrange(key)
            else:
                v = f"<type {t}>"
            ttl = c.pttl(key)
            out[key] = (t, v, ttl > 0)
        return out
    finally:
        c.close()


def test_live_migration_off_redis(reporters):
    m = Migration()
    reporters.append(m)
    rd, kite = m.redis, m.kite
    rd.start()
    rc = rd.client()
    seed(rc)
    m.note("redis seeded")

    producer = m.producer = JobProducer(rd)
    producer.start()
    wait_for("100 jobs acknowledged by Redis (" + producer.summary() + ")",
             lambda: producer.count_on("redis") >= 100 or producer.fatal, 30, 0.02)
    assert producer.fatal is None, producer.summary()

    # 1. A fresh Kite follows Redis.
    kite.start()
    kc = kite.client()
    assert kc.execute_command("REPLICAOF", "127.0.0.1", rd.port) == "OK"
    m.note("REPLICAOF sent to Kite")
    wait_for(f"{kite.label()} master_link_status:up after REPLICAOF 127.0.0.1 {rd.port}",
             lambda: kite.info_repl(kc).get("master_link_status") == "up", 60, 0.05)
    m.note("Kite's link is up")
    ki = kite.info_repl(kc)
    assert ki.get("role") == "slave" and ki.get("master_port") == rd.port, ki
    # Writes keep streaming to Kite a while before the switch.
    n0 = producer.count_on("redis")
    wait_for("100 more jobs acknowledged by Redis while Kite replicates (" + producer.summary() + ")",
             lambda: producer.count_on("redis") >= n0 + 100 or producer.fatal, 30, 0.02)
    assert producer.fatal is None, producer.summary()

    # 2. Redis stops taking writes; Kite catches up with its offset.
    assert rc.client_pause(60000, all=False), "CLIENT PAUSE 60000 WRITE on Redis"
    m.note(f"CLIENT PAUSE 60000 WRITE on Redis after {producer.count_on('redis')} jobs")

    offsets = {}

    def caught_up():
        mo = rd.info_repl(rc)["master_repl_offset"]
        ki = kite.info_repl(kc)
        offsets.update(redis=mo, kite=ki.get("slave_repl_offset"), link=ki.get("master_link_status"))
        return ki.get("slave_repl_offset") == mo

    wait_for(f"Kite's slave_repl_offset to reach Redis's master_repl_offset ({offsets})", caught_up, 30, 0.02)
    m.note(f"offsets equal: {offsets}")

    # 3. Kite becomes a master; the producer moves to it.
    assert kc.execute_command("REPLICAOF", "NO", "ONE") == "OK"
    role = kc.execute_command("ROLE")
    assert role[0] == "master", f"ROLE on Kite after REPLICAOF NO ONE: {role}"
    producer.target = kite
    m.note("REPLICAOF NO ONE on Kite; producer switched")
    wait_for("200 jobs acknowledged by Kite after the switch (" + producer.summary() + ")",
             lambda: producer.count_on("kite") >= 200 or producer.fatal, 30, 0.02)
    producer.stop_flag.set()
    producer.join(timeout=15)
    assert not producer.is_alive(), "producer did not stop"
    assert producer.fatal is None, producer.summary()
    m.note(f"producer stopped: {producer.summary()}")

    # Every acknowledged job is in Kite's queue, in the order acknowledged (first
    # occurrences: a push whose reply was lost to the timeout may have run too).
    kite_list = kc.lrange(QUEUE, 0, -1)[::-1]  # oldest first
    on_kite = set(kite_list)
    lost = [n for n, _ in producer.acked if f"job-{n}" not in on_kite]
    assert not lost, (f"{len(lost)} of {len(producer.acked)} acknowledged jobs are not in Kite's {QUEUE}: "
                      f"first {lost[:10]}; acknowledged by: "
                      f"{sorted({t for n, t in producer.acked if n in set(lost)})}; offsets at the switch {offsets}")
    first, seen = [], set()
    for j in kite_list:
        if j not in seen:
            seen.add(j)
            first.append(j)
    unknown = [j for j in first if not j.startswith("job-") or int(j[4:]) > producer.acked[-1][0] + 1]
    assert not unknown, f"jobs in Kite's list the producer never pushed: {unknown[:10]}"
    order = [int(j[4:]) for j in first]
    assert order == sorted(order), f"Kite's {QUEUE} is out of order: {order[:50]}..."

    # Redis's queue as it was at the pause is exactly the tail of Kite's.
    redis_list = rc.lrange(QUEUE, 0, -1)
    assert kc.lrange(QUEUE, -len(redis_list), -1) == redis_list, (
        f"Redis's {QUEUE} ({len(redis_list)} items) is not the tail of Kite's ({len(kite_list)} items)")
    m.note(f"{len(redis_list)} jobs from Redis, {len(kite_list) - len(redis_list)} pushed to Kite")

    # The rest of the data set, TTLs included.
    want = snapshot(rd, {QUEUE})
    got = snapshot(kite, {QUEUE})
    diff = sorted(set(want) ^ set(got))
    assert not diff, f"keys only on one side (Redis {len(want)} keys, Kite {len(got)}): {diff[:10]}"
    differ = [k for k in want if want[k] != got[k]]
    assert not differ, "keys that differ on Kite: " + "; ".join(
        f"{k!r}: redis {str(want[k])[:120]} kite {str(got[k])[:120]}" for k in differ[:5])

    # Kite takes writes of its own (not only the producer's list).
    assert kc.set("after:migration", "1") is True
    assert kc.incr("stat:processed") == 123457
    kc.close()
    rc.close()


def test_bullmq_migration(reporters):
    """The same recipe under a running BullMQ deployment (bullmq_migration.mjs): seeded
    waiting, prioritized and delayed jobs, a worker and a producer move from redis-server to
    Kite; every seeded and acknowledged job ends completed on Kite."""
    m = Migration()
    reporters.append(m)
    m.redis.start()
    m.kite.start()
    env = dict(os.environ, REDIS_PORT=str(m.redis.port), KITE_PORT=str(m.kite.port))
    p = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bullmq_migration.mjs")],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    out = p.stdout.decode("utf-8", "replace")
    m.note(f"bullmq_migration.mjs exited with {p.returncode}")
    print(out)
    assert p.returncode == 0, f"bullmq_migration.mjs failed (exit {p.returncode}):\n{out}"
