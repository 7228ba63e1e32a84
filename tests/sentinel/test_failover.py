"""Three real Sentinels (quorum 2) watch a Kite master (--threads 4) and two Kite replicas
(--threads 1 and 2), each started from its own configuration file. kill -9 the master in the
middle of a workload: a replica is promoted, the other follows it, Sentinel-aware clients
carry on, and every write acknowledged with WAIT 1 is on the new master.

test_redis_py_failover: redis-py's Sentinel client (master_for) writes SET w:<i> with WAIT 1
  in one pipeline on one connection, retrying each write until WAIT says >= 1 replica.
test_bullmq_failover: bullmq_failover.mjs, a BullMQ producer and worker on ioredis with
  `sentinels`, the producer calling WAIT 1 after each add.

Both then restart the killed master from its unchanged configuration file: Sentinel turns
it into a replica of the new master (SLAVEOF and CONFIG REWRITE in one MULTI/EXEC).
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel as SentinelClient

from cluster import MASTER_NAME, ROOT, Sentinel, Server, check_rewritten_config, tail, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
HEX40 = re.compile(r"^[0-9a-f]{40}$")


def check_sentinel_visible_info(cluster):
    """The INFO fields Sentinel reads, as Redis writes them."""
    m = cluster.master.client()
    try:
        run_id = m.info("server").get("run_id")
        assert isinstance(run_id, str) and HEX40.match(run_id), f"master INFO server run_id {run_id!r}: want 40 hex digits"
        info = m.info("replication")
    finally:
        m.close()
    assert info.get("role") == "master", info
    assert info.get("connected_slaves") == 2, f"master connected_slaves: {info}"
    listed = {}
    for k in ("slave0", "slave1"):
        s = info.get(k)
        assert isinstance(s, dict), f"master INFO replication {k}: {s!r} (want ip=...,port=...,state=online,offset=...,lag=...)"
        for f in ("ip", "port", "state", "offset", "lag"):
            assert f in s, f"master INFO replication {k} lacks {f}: {s}"
        listed[int(s["port"])] = s
    assert sorted(listed) == sorted(r.port for r in cluster.replicas), f"slaveN ports {sorted(listed)}"
    for port, s in listed.items():
        assert s["ip"] == "127.0.0.1" and s["state"] == "online", f"slave entry for port {port}: {s}"
    for r in cluster.replicas:
        c = r.client()
        try:
            run_id = c.info("server").get("run_id")
            ri = c.info("replication")
        finally:
            c.close()
        assert isinstance(run_id, str) and HEX40.match(run_id), f"{r.label()} run_id {run_id!r}"
        want = {"role": "slave", "master_host": "127.0.0.1", "master_port": cluster.master.port,
                "master_link_status": "up", "master_sync_in_progress": 0, "slave_read_only": 1,
                "replica_announced": 1}
        bad = {k: ri.get(k) for k, v in want.items() if ri.get(k) != v}
        assert not bad, f"{r.label()} INFO replication: {bad}, want {want}; all: {ri}"
        for k in ("slave_repl_offset", "slave_priority", "master_last_io_seconds_ago", "master_repl_offset"):
            assert isinstance(ri.get(k), int), f"{r.label()} INFO replication {k}: {ri.get(k)!r}; all: {ri}"
        assert ri["slave_priority"] == 100, ri


def check_hello_everywhere(cluster):
    """Sentinels subscribe to __sentinel__:hello on the master and on every replica, and
    publish their hello there too: on each replica, PUBSUB NUMSUB counts the three
    Sentinels, and a subscriber receives a hello from each of them."""
    for srv in cluster.servers:
        # RESP2, as Sentinel and most clients speak (test_pubsub_numsub_resp3 checks RESP3).
        c = srv.client(protocol=2)
        try:
            wait_for(f"PUBSUB NUMSUB __sentinel__:hello on {srv.label()} to count the 3 Sentinels",
                     lambda c=c: dict(c.pubsub_numsub("__sentinel__:hello")).get("__sentinel__:hello") == 3, 15)
        finally:
            c.close()
    for r in cluster.replicas:
        c = r.client()
        ps = c.pubsub()
        try:
            ps.subscribe("__sentinel__:hello")
            want = {s.port for s in cluster.sentinels}
            seen = set()

            def hellos():
                m = ps.get_message(timeout=0.2)
                if m and m["type"] == "message":
                    # ip,port,runid,epoch,master-name,master-ip,master-port,master-epoch
                    f = m["data"].split(",")
                    assert f[4] == MASTER_NAME and int(f[6]) == cluster.master.port, m["data"]
                    seen.add(int(f[1]))
                return want <= seen

            wait_for(f"a hello from each Sentinel {sorted(want)} on {r.label()} (seen {seen})", hellos, 15, 0)
        finally:
            ps.close()
            c.close()


class ClientsOn:
    """A plain client and a Pub/Sub subscriber connected to a server, raw sockets: Sentinel's
    reconfiguration of that server ends with CLIENT KILL TYPE normal and CLIENT KILL TYPE
    pubsub, so that clients reconnect and ask Sentinel again."""

    def __init__(self, server):
        self.server = server
        self.plain = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        self.plain.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert self.plain.recv(100) == b"+PONG\r\n"
        self.sub = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        self.sub.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nnews\r\n")
        assert b"subscribe" in self.sub.recv(200)

    def wait_closed(self):
        for kind, sock in (("normal", self.plain), ("pubsub", self.sub)):
            def closed(sock=sock):
                sock.settimeout(0.1)
                try:
                    data = sock.recv(4096)
                except socket.timeout:
                    return False
                except OSError:
                    return True
                return data == b""
            wait_for(f"the server to close a {kind} client of {self.server.label()} (Sentinel's reconfiguration "
                     f"sends CLIENT KILL TYPE {kind})", closed, 15, 0)

    def close(self):
        self.plain.close()
        self.sub.close()


def check_sentinels_list_follower(cluster, promoted, follower):
    """Every Sentinel lists the follower as a replica of the new master, link ok."""
    def listed(s):
        for e in s.replicas():
            e = _d(e)
            if int(e["port"]) == follower.port:
                return ("s_down" not in e["flags"] and e.get("master-link-status") == "ok"
                        and int(e.get("master-port", 0)) == promoted.port)
        return False
    for s in cluster.sentinels:
        wait_for(f"{s.label()} to list {follower.label()} as a replica of port {promoted.port}, link ok "
                 f"(SENTINEL REPLICAS)", lambda s=s: listed(s), 15, 0.1)


def check_link_down_fields(cluster, old_port):
    """Right after the kill, while a replica still follows the dead master, INFO says
    master_link_status:down and has master_link_down_since_seconds (Sentinel reads it to
    skip replicas disconnected for too long). A replica already reconfigured by Sentinel
    (the failover can be quick) is not checked."""
    for r in cluster.replicas:
        def seen(r=r):
            ri = r.info_repl()
            if ri.get("role") != "slave" or ri.get("master_port") != old_port:
                return "reconfigured"
            if ri.get("master_link_status") != "down":
                return None
            assert isinstance(ri.get("master_link_down_since_seconds"), int), (
                f"{r.label()}: master_link_status:down without master_link_down_since_seconds: {ri}")
            return "down"
        cluster.note(f"{r.name} after the kill: {wait_for(f'{r.label()} master_link_status:down', seen, 10, 0.02)}")


class Writer(threading.Thread):
    """SET w:<i> v<i> then WAIT 1 500, one pipeline on one connection of redis-py's
    Sentinel-managed master pool (a retry of the pipeline after a reconnect resends the SET
    too, so a WAIT never vouches for a SET sent on another connection). Write i is
    acknowledged when WAIT answered >= 1; until then it is retried (ConnectionError,
    TimeoutError, READONLY, WAIT 0) with backoff; a write not acknowledged within
    per_write_s, or any other error, stops the writer with `fatal` set."""

    def __init__(self, sentinel_ports, per_write_s=45.0, max_writes=100000):
        super().__init__(daemon=True)
        self.sentinel = SentinelClient([("127.0.0.1", p) for p in sentinel_ports], socket_timeout=0.5,
                                       sentinel_kwargs={"socket_timeout": 0.5})
        self.master = self.sentinel.master_for(MASTER_NAME, socket_timeout=1.0, socket_connect_timeout=0.5,
                                               decode_responses=True, retry=Retry(NoBackoff(), 0))
        self.per_write_s = per_write_s
        self.max_writes = max_writes
        self.acked = []  # write indexes, in order
        self.acked_at = []  # time.monotonic() of each acknowledgement
        self.errors = {}  # error class name -> count
        self.wait_zero = 0
        self.fatal = None
        self.stop_flag = threading.Event()

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001
            self.fatal = f"writer crashed: {e!r}"

    def _run(self):
        for i in range(self.max_writes):
            if self.stop_flag.is_set():
                return
            deadline = time.monotonic() + self.per_write_s
            backoff = 0.01
            while True:
                try:
                    p = self.master.pipeline(transaction=False)
                    p.set(f"w:{i}", f"v{i}")
                    p.execute_command("WAIT", 1, 500)
                    _, n = p.execute()
                    if n >= 1:
                        self.acked.append(i)
                        self.acked_at.append(time.monotonic())
                        break
                    self.wait_zero += 1
                except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError) as e:
                    name = type(e).__name__
                    self.errors[name] = self.errors.get(name, 0) + 1
                except redis.ResponseError as e:
                    self.fatal = f"write {i}: unexpected error reply {e}"
                    return
                if time.monotonic() > deadline:
                    self.fatal = (f"write {i} not acknowledged within {self.per_write_s} s "
                                  f"(errors {self.errors}, WAIT answered 0 {self.wait_zero} times)")
                    return
                if self.stop_flag.is_set():
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.2)

    def count_after(self, t):
        return sum(1 for x in self.acked_at if x > t)

    def summary(self):
        return (f"{len(self.acked)} writes acknowledged, errors {self.errors}, WAIT answered 0 "
                f"{self.wait_zero} times, fatal: {self.fatal}")


def missing_keys(server, keys, expect):
    c = server.client()
    try:
        missing = []
        for k in range(0, len(keys), 500):
            chunk = keys[k:k + 500]
            vals = c.mget(chunk)
            missing += [(key, v) for key, v in zip(chunk, vals) if v != expect(key)]
        return missing
    finally:
        c.close()


def wait_caught_up(replica, master, timeout=30):
    """The replica's slave_repl_offset reached the master's master_repl_offset (writes stopped)."""
    def same():
        mo = master.info_repl()["master_repl_offset"]
        ri = replica.info_repl()
        return ri.get("master_link_status") == "up" and ri.get("slave_repl_offset") == mo
    wait_for(f"{replica.label()} slave_repl_offset to reach {master.label()} master_repl_offset", same, timeout)


def restart_old_master(cluster, old, live):
    """Starts the killed master again from its configuration file (which still says master):
    Sentinel turns it into a replica of the current master with SLAVEOF and CONFIG REWRITE.
    Returns (master, replicas) once settled."""
    old.start()
    cluster.note(f"{old.name} restarted")
    master, replicas = cluster.wait_settled(live + [old])
    assert old in replicas, f"the restarted old master {old.label()} was not made a replica"
    role = old.role()
    assert role[0] == "slave" and int(role[2]) == master.port, f"ROLE on {old.label()}: {role}"
    wait_for(f"Sentinels to list {old.name} as a replica of the master, not down",
             lambda: all(any(int(_d(e)["port"]) == old.port and "s_down" not in _d(e)["flags"]
                             for e in s.replicas()) for s in cluster.sentinels), 30, 0.1)
    return master, replicas


def _d(e):
    return e if isinstance(e, dict) else dict(zip(e[0::2], e[1::2]))


def test_redis_py_failover(make_cluster):
    cluster = make_cluster("sentinel-redis-py")
    cluster.wait_discovery()
    check_sentinel_visible_info(cluster)
    check_hello_everywhere(cluster)
    clients = [ClientsOn(r) for r in cluster.replicas]

    writer = Writer([s.port for s in cluster.sentinels])
    writer.start()
    try:
        wait_for("200 writes acknowledged before the kill (" + writer.summary() + ")",
                 lambda: len(writer.acked) >= 200 or writer.fatal, 30, 0.02)
        assert writer.fatal is None, writer.summary()
        old = cluster.master
        kill_t = time.monotonic()
        old.kill9()
        cluster.note(f"master killed (kill -9) after {len(writer.acked)} acknowledged writes")
        check_link_down_fields(cluster, old.port)
        promoted, follower = cluster.wait_failover(old.port)
        role = promoted.role()
        assert role[0] == "master", f"ROLE on the promoted {promoted.label()}: {role}"
        for c in clients:
            c.wait_closed()
            c.close()
        check_sentinels_list_follower(cluster, promoted, follower)

        wait_for("the redis-py Sentinel client to carry on: 200 writes acknowledged after the kill ("
                 + writer.summary() + ")",
                 lambda: writer.count_after(kill_t) >= 200 or writer.fatal, 60, 0.05)
        assert writer.fatal is None, writer.summary()
        cluster.note(f"writer: {writer.summary()}")
    finally:
        writer.stop_flag.set()
        writer.join(timeout=30)
    assert not writer.is_alive(), "writer did not stop"
    assert writer.fatal is None, writer.summary()

    keys = [f"w:{i}" for i in writer.acked]
    expect = lambda k: "v" + k[2:]  # noqa: E731
    # Sentinel may have run another failover between the two replicas meanwhile (allowed):
    # check the state it settled in.
    promoted, (follower,) = cluster.wait_settled([promoted, follower])
    missing = missing_keys(promoted, keys, expect)
    assert not missing, (f"{len(missing)} of {len(keys)} acknowledged writes (WAIT 1 >= 1) are not on the "
                         f"new master {promoted.label()}; first: {missing[:10]}")
    wait_caught_up(follower, promoted)
    missing = missing_keys(follower, keys, expect)
    assert not missing, f"{len(missing)} acknowledged writes missing on the follower {follower.label()}: {missing[:10]}"

    check_rewritten_config(promoted, None)
    check_rewritten_config(follower, promoted.port)
    # The other replica continued from its offset: a partial resync, not a full one.
    stats = promoted.client().info("stats")
    assert stats.get("sync_partial_ok", 0) >= 1 and stats.get("sync_full", 0) == 0, (
        f"the follower should have continued with PSYNC (+CONTINUE) from the promoted replica: "
        f"INFO stats sync_full {stats.get('sync_full')}, sync_partial_ok {stats.get('sync_partial_ok')}, "
        f"sync_partial_err {stats.get('sync_partial_err')}")

    # The rewritten file is one the server starts from: the follower comes back following
    # the master.
    follower.stop()
    follower.start()
    cluster.note(f"{follower.name} restarted from its rewritten configuration file")
    master, replicas = cluster.wait_settled([promoted, follower])
    for r in replicas:
        wait_caught_up(r, master)
        missing = missing_keys(r, keys, expect)
        assert not missing, f"{len(missing)} acknowledged writes missing on {r.label()}: {missing[:10]}"
        check_rewritten_config(r, master.port)

    master, replicas = restart_old_master(cluster, old, [promoted, follower])
    wait_caught_up(old, master)
    missing = missing_keys(old, keys, expect)
    assert not missing, f"{len(missing)} acknowledged writes missing on the old master, now a replica: {missing[:10]}"
    check_rewritten_config(old, master.port)
    check_rewritten_config(master, None)


def test_bullmq_failover(make_cluster):
    # replica1 has replica-priority 0: Sentinel must never promote it (it reads
    # slave_priority from INFO).
    cluster = make_cluster("sentinel-bullmq", replica_extra=(["replica-priority 0"], []))
    cluster.wait_discovery()
    pri = cluster.replicas[0].info_repl().get("slave_priority")
    assert pri == 0, f"{cluster.replicas[0].label()} with replica-priority 0 reports slave_priority {pri!r}"
    old = cluster.master
    env = dict(os.environ,
               SENTINEL_PORTS=",".join(str(s.port) for s in cluster.sentinels),
               MASTER_PID=str(old.proc.pid), MASTER_PORT=str(old.port))
    cluster.note("bullmq_failover.mjs started")
    p = subprocess.run(["node", os.path.join(HERE, "bullmq_failover.mjs")], env=env, cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    out = p.stdout.decode("utf-8", "replace")
    cluster.note("bullmq_failover.mjs exited with %d" % p.returncode)
    # The node program killed the master (SIGKILL): reap it.
    old.proc.wait(timeout=10)
    assert p.returncode == 0, f"bullmq_failover.mjs failed (exit {p.returncode}):\n{out}"
    print(out)
    promoted, _ = cluster.wait_failover(old.port)
    assert promoted is cluster.replicas[1], (
        f"Sentinel promoted {promoted.label()}, which has replica-priority 0")
    promoted, (follower,) = cluster.wait_settled(cluster.replicas)
    check_rewritten_config(promoted, None)
    check_rewritten_config(follower, promoted.port)


class _Servers:
    """A few processes for the failure report (test_sentinel_kills_busy_script)."""

    def __init__(self, work, procs):
        self.work, self.procs, self.events, self.t0 = work, procs, [], time.monotonic()

    def note(self, what):
        self.events.append((time.monotonic() - self.t0, what))

    def report(self):
        out = [f"=== {self.work}"] + [f"  {t:7.2f} {w}" for t, w in self.events]
        for p in self.procs:
            out += [f"--- {p.label()}: {'running' if p.alive() else 'NOT running'}", f"--- {p.name} log (end):",
                    tail(p.log, 40)]
        return "\n".join(out)

    def close(self, keep=False):
        for p in self.procs:
            # A server stuck in an endless script may ignore SIGTERM.
            if p.alive():
                p.kill9()
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)


@pytest.mark.parametrize("threads,sentinel_first", [(1, True), (4, False)],
                         ids=["threads1-sentinel-watching", "threads4-sentinel-started-while-busy"])
def test_sentinel_kills_busy_script(reporters, threads, sentinel_first):
    """A master running a script past busy-reply-threshold answers -BUSY (on every
    connection, old or new, as Redis does); once Sentinel holds it subjectively down it sends
    SCRIPT KILL, and the master is back. One Sentinel with quorum 2: it can never reach ODOWN
    alone, so no failover races the kill. Run with the Sentinel already watching, and with
    the Sentinel started (so connecting) while the script is already busy."""
    work = tempfile.mkdtemp(prefix="kite-sentinel-busy.")
    master = Server(work, "master", threads, extra=["busy-reply-threshold 1000"])
    sentinel = Sentinel(work, "sentinel", master.port, quorum=2, down_after=1000)
    env = _Servers(work, [master, sentinel])
    reporters.append(env)
    master.start()

    def sentinel_sees_master():
        m = _d(sentinel.master_state())
        return m["flags"] == "master" and int(m["last-ok-ping-reply"]) < 1000

    if sentinel_first:
        sentinel.start()
        wait_for("the Sentinel to see the master up (SENTINEL MASTER flags master)", sentinel_sees_master, 15)

    result = {}

    def run_script():
        c = master.client(socket_timeout=60)
        try:
            result["reply"] = c.eval("local i = 0 while true do i = i + 1 end", 0)
        except Exception as e:  # noqa: BLE001
            result["error"] = e
        finally:
            c.close()

    t = threading.Thread(target=run_script, daemon=True)
    t.start()
    env.note(f"EVAL of an endless script started (kite --threads {threads})")
    if not sentinel_first:
        time.sleep(1.5)  # past busy-reply-threshold: the master answers BUSY by now
        sentinel.start()
        env.note("Sentinel started")
    pings = {}
    deadline = time.monotonic() + 20
    while t.is_alive() and time.monotonic() < deadline:
        # A new connection each time, as `redis-cli PING` or a reconnecting client makes.
        c = master.client(socket_timeout=1, retry=Retry(NoBackoff(), 0))
        try:
            r = "PONG" if c.ping() else "?"
        except redis.ResponseError as e:
            r = str(e).split()[0]
        except (redis.TimeoutError, redis.ConnectionError) as e:
            r = f"no reply ({type(e).__name__})"
        finally:
            c.close()
        pings[r] = pings.get(r, 0) + 1
        time.sleep(0.05)
    env.note(f"PING replies on new connections while the script ran: {pings}")
    t.join(timeout=5)
    assert not t.is_alive(), (
        f"the script was not killed within 20 s (kite --threads {threads}); replies to PING on new connections "
        f"meanwhile: {pings}. Redis answers -BUSY to every client once a script runs past "
        f"busy-reply-threshold, and Sentinel then sends SCRIPT KILL (sentinel log below)")
    err = result.get("error")
    assert isinstance(err, redis.ResponseError) and "kill" in str(err).lower(), (
        f"EVAL should fail as killed by SCRIPT KILL; got {result}")
    assert master.client().ping()
    wait_for("the Sentinel to see the master up again", sentinel_sees_master, 15)


def test_pubsub_numsub_resp3(reporters):
    """PUBSUB NUMSUB answers a flat array (channel, count, ...) in RESP3 too, as Redis 7
    does: redis-py 8 speaks RESP3 by default and slices the reply (a map breaks it with
    TypeError: unhashable type: 'slice')."""
    work = tempfile.mkdtemp(prefix="kite-sentinel-numsub.")
    srv = Server(work, "server", 2)
    reporters.append(_Servers(work, [srv]))
    srv.start()
    c = srv.client(protocol=3)
    ps = c.pubsub()
    try:
        ps.subscribe("__sentinel__:hello")
        wait_for("the subscription", lambda: ps.get_message(timeout=0.1) is not None, 5, 0)
        raw = c.execute_command("PUBSUB", "NUMSUB", "__sentinel__:hello", "other")
        assert isinstance(raw, list), f"PUBSUB NUMSUB in RESP3: {raw!r} ({type(raw).__name__}); Redis answers a flat array"
        assert c.pubsub_numsub("__sentinel__:hello", "other") == [("__sentinel__:hello", 1), ("other", 0)]
    finally:
        ps.close()
        c.close()


def test_publish_reaches_replicas(reporters):
    """PUBLISH on a master goes down the replication stream, as in Redis: a subscriber on
    a replica receives it (clients of a Sentinel deployment often subscribe on replicas),
    and master_repl_offset advances."""
    work = tempfile.mkdtemp(prefix="kite-sentinel-publish.")
    master = Server(work, "master", 2)
    replica = Server(work, "replica", 1, master.port)
    reporters.append(_Servers(work, [master, replica]))
    master.start()
    replica.start()
    wait_for(f"{replica.label()} master_link_status:up",
             lambda: replica.info_repl().get("master_link_status") == "up", 30)
    m, r = master.client(), replica.client()
    ps = r.pubsub()
    try:
        ps.subscribe("news")
        wait_for("the subscription on the replica", lambda: ps.get_message(timeout=0.1) is not None, 5, 0)
        before = master.info_repl(m)["master_repl_offset"]
        m.publish("news", "hello from the master")
        got = wait_for("the message on the replica's subscriber", lambda: ps.get_message(timeout=0.2), 5, 0)
        assert got["data"] == "hello from the master", got
        after = master.info_repl(m)["master_repl_offset"]
        assert after > before, f"master_repl_offset {before} -> {after}: PUBLISH was not propagated"
    finally:
        ps.close()
        m.close()
        r.close()
