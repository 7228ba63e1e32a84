"""The observe suite's /metrics check (see run.sh): python metrics.py redis://127.0.0.1:PORT

GETs /metrics from the RESP port itself, parses it with prometheus_client's parser, and
checks the kite_queue_* families against KITE QUEUES (read over RESP3 with redis-py) and
against what the Sidekiq and BullMQ steps did (OBS_* in the environment, set by run.sh).
Runs after bullmq.mjs and before dashboard.mjs, while the Sidekiq process idles.
Prints one PASS/FAIL line per scenario; exits 1 on any failure.
"""

import http.client
import json
import math
import os
import socket
import sys
import time
import urllib.parse

import redis
from prometheus_client.parser import text_string_to_metric_families

URL = sys.argv[1] if len(sys.argv) > 1 else sys.exit("usage: python metrics.py redis://127.0.0.1:PORT")
_u = urllib.parse.urlparse(URL)
HOST, PORT = _u.hostname, _u.port
LABEL = os.environ.get("FW_CONFIG", "server")
E = lambda name, dflt: int(os.environ.get(name, dflt))  # noqa: E731
SK_DEFAULT, SK_CRITICAL, SK_LOW = E("OBS_SK_DEFAULT", 40), E("OBS_SK_CRITICAL", 15), E("OBS_SK_LOW", 4)
SK_SCHEDULED, SK_RETRY = E("OBS_SK_SCHEDULED", 5), E("OBS_SK_RETRY", 3)
BQ_JOBS, BQ_DELAYED, BQ_FAIL = E("OBS_BQ_JOBS", 50), E("OBS_BQ_DELAYED", 5), E("OBS_BQ_FAIL", 3)
BQ_READY = BQ_JOBS - BQ_DELAYED

R = redis.Redis(host=HOST, port=PORT, protocol=3, decode_responses=True, socket_timeout=10)


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def check_eq(actual, expected, what):
    if actual != expected:
        raise Failure(f"{what}: expected {expected!r}, got {actual!r}")


RESULTS = {"passed": 0, "failed": 0}


def scenario(name):
    def run(fn):
        t0 = time.monotonic()
        try:
            fn()
            RESULTS["passed"] += 1
            print(f"PASS [{LABEL}] metrics: {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Failure as e:
            RESULTS["failed"] += 1
            print(f"FAIL [{LABEL}] metrics: {name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - any error fails the scenario, not the run
            RESULTS["failed"] += 1
            print(f"FAIL [{LABEL}] metrics: {name}: {type(e).__name__}: {e}", flush=True)
        return fn

    return run


def wait_for(what, fn, timeout=10.0, every=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except Failure as e:
            last = str(e)
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout} s waiting for {what} (last: {last})")
        time.sleep(every)


def http_get(path, method="GET"):
    conn = http.client.HTTPConnection(HOST, PORT, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def as_map(x, what):
    """A RESP3 map (dict) or a RESP2 flat array of pairs."""
    if isinstance(x, dict):
        return dict(x)
    check(isinstance(x, list) and len(x) % 2 == 0, f"{what}: not a map: {x!r:.200}")
    return dict(zip(x[0::2], x[1::2]))


def kite_queues():
    rows = [as_map(e, "KITE QUEUES entry") for e in R.execute_command("KITE", "QUEUES")]
    for q in rows:
        q["jobs"] = {k: int(v) for k, v in as_map(q.get("jobs") or {}, "jobs").items()}
    names = [q["name"] for q in rows]
    check_eq(names, sorted(names), "KITE QUEUES order")
    return {q["name"]: q for q in rows}


class Scrape:
    """One GET /metrics, parsed: samples by (metric name, labels)."""

    def __init__(self):
        status, headers, body = http_get("/metrics")
        check_eq(status, 200, "GET /metrics status")
        ctype = headers.get("content-type", "")
        check(ctype.startswith("text/plain"), f"GET /metrics Content-Type {ctype!r}")
        self.text = body.decode("utf-8")
        self.families = {}
        for fam in text_string_to_metric_families(self.text):
            self.families[fam.name] = fam
        self.samples = [s for f in self.families.values() for s in f.samples]

    def family(self, name):
        """The family `name`; the parser names a counter's family without its _total."""
        f = self.families.get(name)
        if f is None and name.endswith("_total"):
            f = self.families.get(name[: -len("_total")])
        check(f is not None, f"no family {name} in /metrics (has {sorted(self.families)[:40]})")
        return f

    def get(self, name, **labels):
        """The value of the one sample `name` whose labels include `labels`, or None."""
        found = [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        check(len(found) <= 1, f"{len(found)} samples {name}{labels}: {found[:3]}")
        return found[0].value if found else None

    def need(self, name, **labels):
        v = self.get(name, **labels)
        check(v is not None, f"no sample {name}{labels} in /metrics")
        return v


QUEUES = ["queue:default", "queue:critical", "queue:low", "bull:emails"]
FRAMEWORK = {"queue:default": "sidekiq", "queue:critical": "sidekiq", "queue:low": "sidekiq", "bull:emails": "bullmq"}
# What the workload did: (depth, pushed, popped).
EXPECT = {
    "queue:default": (0, SK_DEFAULT, SK_DEFAULT),
    "queue:critical": (0, SK_CRITICAL, SK_CRITICAL),
    "queue:low": (SK_LOW, SK_LOW, 0),
    "bull:emails": (0, BQ_READY, BQ_READY),
}
# Filled by the first scenario.
S = {}


@scenario("GET /metrics on the RESP port: text format, every kite_queue_* family")
def _families():
    # Provoke one error first, so kite_errors_total has a sample.
    try:
        R.execute_command("OBSERVE-NO-SUCH-COMMAND")
    except redis.ResponseError:
        pass
    # The idle Sidekiq's fetchers block in BRPOP for 2 s at a time: scrape until the
    # moment one is counted (they are, nearly always, at once).
    def scrape():
        sc = Scrape()
        return sc if (sc.get("kite_queue_consumers", queue="queue:default") or 0) >= 1 else None

    try:
        S["m"] = wait_for("a scrape with kite_queue_consumers{queue=queue:default} >= 1", scrape, timeout=10)
    except Failure:
        S["m"] = Scrape()  # the consumers scenario below reports it
    S["q"] = kite_queues()
    m = S["m"]
    types = {
        "kite_queue_depth": "gauge",
        "kite_queue_pushed_total": "counter",
        "kite_queue_popped_total": "counter",
        "kite_queue_consumers": "gauge",
        "kite_queue_oldest_age_seconds": "gauge",
        "kite_queue_wait_seconds": "histogram",
        "kite_queue_jobs": "gauge",
    }
    for name, typ in types.items():
        f = m.family(name)
        if typ == "gauge":
            check(f.type in ("gauge", "unknown"), f"TYPE of {name}: {f.type}")
        else:
            check_eq(f.type, typ, f"TYPE of {name}")
    for name in ["kite_queue_depth", "kite_queue_pushed_total", "kite_queue_popped_total", "kite_queue_consumers"]:
        for q in QUEUES:
            m.need(name, queue=q, framework=FRAMEWORK[q])


@scenario("depth, pushed_total, popped_total per queue match KITE QUEUES and the workload")
def _counters():
    m, qs = S["m"], S["q"]
    for name in QUEUES:
        check(name in qs, f"KITE QUEUES has no {name}: {sorted(qs)}")
        q = qs[name]
        got = (
            m.need("kite_queue_depth", queue=name),
            m.need("kite_queue_pushed_total", queue=name),
            m.need("kite_queue_popped_total", queue=name),
        )
        check_eq(got, tuple(float(x) for x in EXPECT[name]), f"{name} depth, pushed, popped in /metrics")
        check_eq((q["depth"], q["pushed"], q["popped"]), EXPECT[name], f"{name} depth, pushed, popped in KITE QUEUES")
        check_eq(m.need("kite_queue_depth", queue=name, framework=q["framework"]), float(q["depth"]),
                 f"{name} framework label {q['framework']!r}")
    # Every queue in KITE QUEUES has its depth in /metrics, and nothing more.
    depth_queues = sorted(s.labels["queue"] for s in m.family("kite_queue_depth").samples)
    check_eq(depth_queues, sorted(qs), "queues with a kite_queue_depth sample")
    # queues_tracked may count more than the rows (docs/observe.md's INFO example has
    # queues_tracked:3 over two rows and framework_sidekiq): at least the rows, and as INFO says.
    tracked = m.need("kite_queues_tracked")
    check(tracked >= len(qs), f"kite_queues_tracked {tracked} < {len(qs)} queues in KITE QUEUES")
    check_eq(tracked, float(R.info("queues")["queues_tracked"]), "kite_queues_tracked vs INFO queues_tracked")
    check_eq(m.need("kite_queues_overflow"), 0.0, "kite_queues_overflow")


@scenario("consumers: the idle Sidekiq counts on queue:default, nobody on queue:low or bull:emails")
def _consumers():
    m = S["m"]
    check(m.need("kite_queue_consumers", queue="queue:default") >= 1,
          f"kite_queue_consumers{{queue=queue:default}} = {m.get('kite_queue_consumers', queue='queue:default')}")
    check_eq(m.need("kite_queue_consumers", queue="queue:low"), 0.0, "consumers of queue:low")
    check_eq(m.need("kite_queue_consumers", queue="bull:emails"), 0.0, "consumers of bull:emails (worker closed)")
    check(m.need("kite_blocked_clients") >= 1, f"kite_blocked_clients {m.get('kite_blocked_clients')}")


@scenario("oldest_age_seconds: queue:low's agrees with KITE QUEUES; empty queues have none")
def _oldest():
    m, qs = S["m"], S["q"]
    age = m.need("kite_queue_oldest_age_seconds", queue="queue:low")
    kite_ms = qs["queue:low"]["oldest_age_ms"]
    check(isinstance(kite_ms, int) and kite_ms >= 1500, f"KITE QUEUES queue:low oldest_age_ms {kite_ms!r}")
    # The scrape came first, KITE QUEUES a moment later.
    check(kite_ms / 1000 - 3 <= age <= kite_ms / 1000 + 0.5,
          f"kite_queue_oldest_age_seconds{{queue=queue:low}} {age} vs KITE QUEUES {kite_ms} ms")
    for name in ["queue:default", "queue:critical", "bull:emails"]:
        v = m.get("kite_queue_oldest_age_seconds", queue=name)
        # Interpretation: an empty queue has no oldest element: no sample, NaN, or -1/0.
        check(v is None or math.isnan(v) or v in (-1.0, 0.0),
              f"kite_queue_oldest_age_seconds{{queue={name}}} = {v} for an empty queue")


@scenario("wait_seconds histogram: buckets, sum, count == popped")
def _histogram():
    m, qs = S["m"], S["q"]
    for name in QUEUES:
        popped = qs[name]["popped"]
        buckets = []
        for s in m.samples:
            if s.name == "kite_queue_wait_seconds_bucket" and s.labels.get("queue") == name:
                buckets.append((float(s.labels["le"]), s.value))
        count = m.get("kite_queue_wait_seconds_count", queue=name)
        total = m.get("kite_queue_wait_seconds_sum", queue=name)
        if popped == 0 and not buckets and count is None:
            continue  # a queue never popped may have no histogram yet
        check(len(buckets) >= 2, f"{name}: {len(buckets)} buckets")
        buckets.sort()
        check_eq(buckets[-1][0], math.inf, f"{name}: last bucket's le")
        values = [v for _, v in buckets]
        check(all(a <= b for a, b in zip(values, values[1:])), f"{name}: buckets not cumulative: {buckets}")
        check_eq(count, float(popped), f"{name}: kite_queue_wait_seconds_count (== popped)")
        check_eq(buckets[-1][1], float(popped), f"{name}: the +Inf bucket")
        check(total is not None and total >= 0, f"{name}: _sum {total}")
    # Every Sidekiq job waited at least the 1.5 s before its process started.
    n = m.need("kite_queue_wait_seconds_count", queue="queue:default")
    total = m.need("kite_queue_wait_seconds_sum", queue="queue:default")
    check(total / n >= 1.0, f"queue:default mean wait {total / n:.3f} s: want >= 1 s")
    check(total / n < 120, f"queue:default mean wait {total / n:.3f} s")
    under_1s = [s.value for s in m.samples if s.name == "kite_queue_wait_seconds_bucket"
                and s.labels.get("queue") == "queue:default" and float(s.labels["le"]) < 1.0]
    check(all(v == 0 for v in under_1s), f"queue:default: jobs counted as waiting under 1 s: {under_1s}")


@scenario("jobs{state}: bull:emails's states, Sidekiq's framework-wide ones with queue=\"\"")
def _jobs():
    m, qs = S["m"], S["q"]
    got = {st: m.get("kite_queue_jobs", queue="bull:emails", state=st)
           for st in ["waiting", "active", "delayed", "completed", "failed"]}
    want = {"waiting": 0.0, "active": 0.0, "delayed": float(BQ_DELAYED),
            "completed": float(BQ_READY - BQ_FAIL), "failed": float(BQ_FAIL)}
    # A state at 0 may have no sample; one with jobs must have its number.
    check_eq({k: (v if v is not None else 0.0) for k, v in got.items()}, want, "kite_queue_jobs{queue=bull:emails}")
    for st, v in qs["bull:emails"]["jobs"].items():
        check_eq(m.get("kite_queue_jobs", queue="bull:emails", state=st) or 0.0, float(v),
                 f"kite_queue_jobs{{queue=bull:emails,state={st}}} vs KITE QUEUES")
    check_eq(m.need("kite_queue_jobs", queue="bull:emails", framework="bullmq", state="completed"),
             float(BQ_READY - BQ_FAIL), "completed with its framework label")
    sk = {st: m.get("kite_queue_jobs", queue="", framework="sidekiq", state=st) for st in ["scheduled", "retry", "dead"]}
    check_eq({k: (v if v is not None else 0.0) for k, v in sk.items()},
             {"scheduled": float(SK_SCHEDULED), "retry": float(SK_RETRY), "dead": 0.0},
             "kite_queue_jobs{queue=\"\",framework=sidekiq}")
    check_eq(m.get("kite_queue_jobs", queue="queue:low", state="waiting"), float(SK_LOW), "queue:low waiting")


@scenario("server-wide families")
def _server():
    m = S["m"]
    check_eq(m.need("kite_up"), 1.0, "kite_up")
    for name in [
        "kite_uptime_seconds", "kite_commands_total", "kite_command_paths_total", "kite_errors_total",
        "kite_connected_clients", "kite_blocked_clients", "kite_memory_used_bytes", "kite_memory_rss_bytes",
        "kite_maxmemory_bytes", "kite_keys", "kite_expired_keys_total", "kite_evicted_keys_total",
        "kite_thread_cpu_seconds_total", "kite_thread_ops_per_second", "kite_thread_keys",
        "kite_rdb_changes_since_last_save", "kite_rdb_last_save_timestamp_seconds", "kite_rdb_bgsave_in_progress",
        "kite_aof_enabled", "kite_replication_master", "kite_connected_replicas", "kite_replication_offset",
        "kite_queues_tracked", "kite_queues_overflow",
    ]:
        f = m.family(name)
        check(f.samples, f"{name}: no samples")
    check_eq(m.need("kite_replication_master"), 1.0, "kite_replication_master")
    check(m.need("kite_connected_clients") >= 2, f"kite_connected_clients {m.get('kite_connected_clients')}")
    threads = {s.labels.get("thread") for s in m.family("kite_thread_keys").samples}
    check(len(threads) >= 2, f"kite_thread_keys for {len(threads)} thread(s) (Kite runs --threads 2): {threads}")
    keys = sum(s.value for s in m.family("kite_keys").samples)
    check(keys >= 10, f"kite_keys adds up to {keys}")
    lpush = sum(s.value for s in m.samples if s.name in ("kite_commands_total", "kite_commands")
                and s.labels.get("cmd", "").lower() == "lpush")
    check(lpush >= SK_DEFAULT, f"kite_commands_total{{cmd=lpush}} {lpush}")
    errs = sum(s.value for s in m.family("kite_errors_total").samples)
    check(errs >= 1, f"kite_errors_total adds up to {errs} after an unknown command")


@scenario("HTTP on the RESP port: /healthz, 404, HEAD, the JSON API; POST is closed, RESP still works")
def _http():
    status, _, body = http_get("/healthz")
    check_eq((status, body.strip()), (200, b"ok"), "GET /healthz")
    status, _, _ = http_get("/no-such-page")
    check_eq(status, 404, "GET /no-such-page")
    status, headers, body = http_get("/metrics", method="HEAD")
    check_eq((status, body), (200, b""), "HEAD /metrics (status, body)")
    status, headers, body = http_get("/api/state")
    check_eq(status, 200, "GET /api/state")
    check("json" in headers.get("content-type", ""), f"/api/state Content-Type {headers.get('content-type')!r}")
    state = json.loads(body)
    check("bull:emails" in json.dumps(state), "/api/state does not mention bull:emails")
    status, headers, body = http_get("/api/queue?name=" + urllib.parse.quote("bull:emails", safe=""))
    check_eq(status, 200, "GET /api/queue?name=bull%3Aemails")
    check("bull:emails" in json.dumps(json.loads(body)), "/api/queue does not mention bull:emails")
    # A POST is not HTTP on the RESP port: it is a cross-protocol attempt and the
    # connection is closed, with no HTTP answer.
    with socket.create_connection((HOST, PORT), timeout=5) as sk:
        sk.sendall(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
        got = b""
        deadline = time.monotonic() + 5
        try:
            while time.monotonic() < deadline:
                chunk = sk.recv(4096)
                if not chunk:
                    break
                got += chunk
            else:
                raise Failure(f"POST: the connection was not closed within 5 s (got {got[:100]!r})")
        except (ConnectionResetError, socket.timeout) as e:
            if isinstance(e, socket.timeout):
                raise Failure(f"POST: the connection was not closed within 5 s (got {got[:100]!r})") from None
        check(not got.startswith(b"HTTP/"), f"POST got an HTTP answer: {got[:100]!r}")
    check_eq(R.ping(), True, "PING after the HTTP requests")


@scenario("/metrics agrees with itself a moment later (counters do not move while idle)")
def _stable():
    m1 = S["m"]
    m2 = Scrape()
    for name in ["kite_queue_pushed_total", "kite_queue_popped_total", "kite_queue_depth"]:
        for q in QUEUES:
            check_eq(m2.need(name, queue=q), m1.need(name, queue=q), f"{name}{{queue={q}}} between two scrapes")


print(f"metrics: {RESULTS['passed']} passed, {RESULTS['failed']} failed [{LABEL}]", flush=True)
if RESULTS["failed"] and "m" in S:
    print("--- kite_queue lines of the scrape ---")
    print("\n".join(line for line in S["m"].text.splitlines() if line.startswith("kite_queue"))[:4000])
sys.exit(1 if RESULTS["failed"] else 0)
