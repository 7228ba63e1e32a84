"""Servers for the Sentinel and migration tests (tests/sentinel): Kite started from a
configuration file (Sentinel's failover sends CONFIG REWRITE, which needs one), real
Sentinels, redis-server, and the diagnostics a failure prints (server and Sentinel logs,
INFO replication, the configuration files).

Environment:
  KITE_BIN   the Kite binary (default: target/release/kite)
  FW_SERVER  "kite" (default) or "redis": run the Kite servers as redis-server instead (same
             configuration files), to check the tests themselves

Sentinels run as `redis-sentinel CONF` when redis-sentinel is installed, else as
`redis-server CONF --sentinel` (the same binary: Debian's redis-sentinel package only adds
a link and service files).
"""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KITE_BIN = os.environ.get("KITE_BIN") or os.path.join(ROOT, "target", "release", "kite")
SERVER_KIND = os.environ.get("FW_SERVER", "kite")
MASTER_NAME = "mymaster"


def sentinel_argv(conf):
    if shutil.which("redis-sentinel"):
        return ["redis-sentinel", conf]
    return ["redis-server", conf, "--sentinel"]


_used_ports = set()


def free_port():
    """A free loopback port below the kernel's ephemeral range. A server is killed and
    started again on its port, and its clients keep reconnecting meanwhile: a port from the
    ephemeral range could become the local port of one of those connections."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo = int(f.read().split()[0])
    for _ in range(500):
        port = random.randrange(10000, max(lo, 10001))
        if port in _used_ports:
            continue
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        _used_ports.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def wait_for(what, fn, timeout, interval=0.05):
    """Polls fn() until it returns something truthy (returned); raises AssertionError after
    `timeout` seconds naming `what` and the last value or exception."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - reported below
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def parse_info(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        k, v = line.split(":", 1)
        out[k] = v
    return out


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    # Kite's log has ANSI colours.
    return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", l) for l in lines[-n:])


def _alive(proc):
    return proc is not None and proc.poll() is None


def _stop(proc, sig=signal.SIGTERM, grace=10):
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


class Process:
    """A server process with a working directory, a configuration file and a log."""

    kind = "server"

    def __init__(self, workdir, name):
        self.name = name
        self.port = free_port()
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.conf = os.path.join(self.dir, f"{self.kind}.conf")
        self.log = os.path.join(self.dir, f"{self.kind}.log")
        self.proc = None
        self.initial_conf = ""

    def argv(self):
        raise NotImplementedError

    def write_conf(self, text):
        self.initial_conf = text
        with open(self.conf, "w") as f:
            f.write(text)

    def start(self, timeout=30):
        logf = open(self.log, "ab")
        logf.write(f"--- start {time.strftime('%H:%M:%S')}: {' '.join(self.argv())}\n".encode())
        logf.flush()
        self.proc = subprocess.Popen(self.argv(), stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True)
        logf.close()
        c = self.client(socket_timeout=1)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{tail(self.log)}")
            return c.ping()

        try:
            wait_for(f"{self.name} (port {self.port}) to answer PING", up, timeout)
        finally:
            c.close()
        return self

    def client(self, **kw):
        kw.setdefault("socket_timeout", 5)
        kw.setdefault("decode_responses", True)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def alive(self):
        return _alive(self.proc)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        _stop(self.proc)

    def read_conf(self):
        with open(self.conf) as f:
            return f.read()


class Server(Process):
    """Kite (or, with FW_SERVER=redis, redis-server) from a configuration file."""

    kind = "server"

    def __init__(self, workdir, name, threads, master_port=None, extra=()):
        super().__init__(workdir, name)
        self.threads = threads
        self.is_redis = SERVER_KIND == "redis"
        lines = [
            f"# {name} for tests/sentinel: a comment CONFIG REWRITE must keep",
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            "# no snapshots or AOF: the test needs none",
            'save ""',
            "appendonly no",
            "repl-diskless-sync-delay 0",
            *extra,
        ]
        if master_port is not None:
            lines += ["# follows the master (Sentinel rewrites this line)",
                      f"replicaof 127.0.0.1 {master_port}"]
        lines += ["# the last line of the file as written by the test"]
        self.comments = [l for l in lines if l.startswith("#")]
        self.write_conf("\n".join(lines) + "\n")

    def label(self):
        return f"{self.name} ({'redis-server' if self.is_redis else f'kite --threads {self.threads}'}, port {self.port})"

    def argv(self):
        if self.is_redis:
            return ["redis-server", self.conf]
        return [KITE_BIN, self.conf, "--threads", str(self.threads)]

    def info_repl(self, client=None):
        c = client or self.client(socket_timeout=2)
        try:
            return c.info("replication")
        finally:
            if client is None:
                c.close()

    def role(self):
        c = self.client(socket_timeout=2)
        try:
            return c.execute_command("ROLE")
        finally:
            c.close()

    def raw_info_repl(self):
        if not self.alive():
            return "<not running>"
        c = self.client(socket_timeout=2)
        try:
            return "\n".join(f"{k}:{v}" for k, v in c.info("replication").items())
        except Exception as e:  # noqa: BLE001
            return f"<INFO failed: {e!r}>"
        finally:
            c.close()


class RedisServer(Server):
    """redis-server (the migration source), started from a configuration file."""

    def __init__(self, workdir, name):
        super().__init__(workdir, name, threads=1)
        self.is_redis = True

    def label(self):
        return f"{self.name} (redis-server, port {self.port})"


class Sentinel(Process):
    kind = "sentinel"

    def __init__(self, workdir, name, master_port, quorum=2, down_after=1000, failover_timeout=6000):
        super().__init__(workdir, name)
        self.write_conf("\n".join([
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {down_after}",
            f"sentinel failover-timeout {MASTER_NAME} {failover_timeout}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
        ]) + "\n")

    def argv(self):
        return sentinel_argv(self.conf)

    def label(self):
        return f"{self.name} (port {self.port})"

    def cmd(self, *args):
        c = self.client(socket_timeout=2)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def master_addr(self):
        r = self.cmd("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
        return (r[0], int(r[1])) if r else None

    def replicas(self):
        return self.cmd("SENTINEL", "REPLICAS", MASTER_NAME)

    def sentinels(self):
        return self.cmd("SENTINEL", "SENTINELS", MASTER_NAME)

    def master_state(self):
        return self.cmd("SENTINEL", "MASTER", MASTER_NAME)


def _as_dict(entry):
    """SENTINEL REPLICAS/SENTINELS/MASTER entries: a flat list (RESP2) or a dict."""
    if isinstance(entry, dict):
        return entry
    return dict(zip(entry[0::2], entry[1::2]))


class Cluster:
    """A Kite master, two Kite replicas and three Sentinels (quorum 2) watching them."""

    def __init__(self, name, threads=(4, 1, 2), sentinels=3, replica_extra=((), ())):
        self.work = tempfile.mkdtemp(prefix=f"kite-{name}.")
        self.master = Server(self.work, "master", threads[0])
        self.replicas = [Server(self.work, f"replica{i + 1}", t, self.master.port, extra=replica_extra[i])
                         for i, t in enumerate(threads[1:])]
        self.servers = [self.master] + self.replicas
        self.sentinels = [Sentinel(self.work, f"sentinel{i + 1}", self.master.port) for i in range(sentinels)]
        self.events = []  # (seconds since start, what) for the failure report
        self.t0 = time.monotonic()

    def note(self, what):
        self.events.append((time.monotonic() - self.t0, what))

    def server_by_port(self, port):
        for s in self.servers:
            if s.port == port:
                return s
        raise AssertionError(f"port {port} is none of the cluster's servers "
                             f"({[s.port for s in self.servers]})")

    def start(self):
        self.master.start()
        for r in self.replicas:
            r.start()
        for r in self.replicas:
            wait_for(f"{r.label()} master_link_status:up",
                     lambda r=r: r.info_repl().get("master_link_status") == "up", 30)
        self.note("master and replicas up, links up")
        for s in self.sentinels:
            s.start()
        for s in self.sentinels:
            # Shorter Sentinel periods (real Sentinel semantics, shorter clocks, as Redis's
            # own Sentinel tests set them):
            # - INFO from the replicas every 250 ms, so that the replica Sentinel promotes is
            #   chosen by offsets read after the kill (the default 10 s could pick one by a
            #   stale offset, and lose writes WAIT 1 acknowledged even with Redis);
            # - PING and is-master-down-by-addr every 200 ms: a link is reconnected at most
            #   once per ping period, and with the default 1 s = down-after-milliseconds a
            #   single reconnect (after a failover's CLIENT KILL, or a link reset on
            #   +switch-master) marks the new master down, and stale is-master-down replies
            #   make that an ODOWN and a second failover (seen with redis-server too);
            # - hello messages every 500 ms (quicker discovery of the other Sentinels and of
            #   a returning old master);
            # - a 3 s TILT, whose 30 s default would stall a failover after a scheduling
            #   hiccup of the loaded test machine.
            # SENTINEL DEBUG is Redis >= 7.0; an older Sentinel keeps its defaults.
            try:
                s.cmd("SENTINEL", "DEBUG", "info-period", 250, "ping-period", 200, "ask-period", 200,
                      "publish-period", 500, "tilt-period", 3000)
            except redis.ResponseError as e:
                self.note(f"{s.name}: SENTINEL DEBUG refused ({e}); default periods")
        self.note("sentinels started")
        return self

    def wait_discovery(self, timeout=30):
        """Each Sentinel knows both replicas (as replicas, not down) and the two other
        Sentinels, and reports the master with num-slaves 2 and num-other-sentinels 2."""
        want_replicas = sorted(r.port for r in self.replicas)

        for s in self.sentinels:
            def replicas_known(s=s):
                reps = [_as_dict(e) for e in s.replicas()]
                ok = sorted(int(e["port"]) for e in reps
                            if "s_down" not in e["flags"] and "disconnected" not in e["flags"]
                            and e.get("master-link-status") == "ok")
                return ok == want_replicas and reps

            wait_for(f"{s.label()} to list both replicas (SENTINEL REPLICAS {MASTER_NAME}: ports "
                     f"{want_replicas}, flags without s_down/disconnected, master-link-status ok)",
                     replicas_known, timeout)

        for s in self.sentinels:
            others = sorted(o.port for o in self.sentinels if o is not s)
            wait_for(f"{s.label()} to list the two other Sentinels {others} (SENTINEL SENTINELS)",
                     lambda s=s, others=others: sorted(int(_as_dict(e)["port"]) for e in s.sentinels()) == others,
                     timeout)
            m = _as_dict(s.master_state())
            assert int(m["port"]) == self.master.port and m["flags"] == "master", m
            assert int(m["num-slaves"]) == 2 and int(m["num-other-sentinels"]) == 2, m
            assert s.cmd("SENTINEL", "CKQUORUM", MASTER_NAME).startswith("OK"), "CKQUORUM"
        self.note("sentinels discovered both replicas and each other")

    def current_master(self):
        """The address every Sentinel agrees on, or None."""
        addrs = set()
        for s in self.sentinels:
            if not s.alive():
                continue
            addrs.add(s.master_addr())
        return addrs.pop() if len(addrs) == 1 else None

    def wait_failover(self, old_port, timeout=60):
        """Waits until every Sentinel names a new master, that server says ROLE master, the
        other replica says ROLE slave of it with master_link_status:up. Returns (promoted,
        follower)."""

        def new_master():
            addr = self.current_master()
            return addr if addr and addr[1] != old_port else None

        addr = wait_for(f"all Sentinels to name a new master (get-master-addr-by-name {MASTER_NAME} "
                        f"other than port {old_port})", new_master, timeout, 0.1)
        self.note(f"sentinels name {addr[0]}:{addr[1]}")
        assert addr[0] == "127.0.0.1", addr
        promoted = self.server_by_port(addr[1])
        assert promoted in self.replicas, f"Sentinel promoted {promoted.label()}, not a replica"
        wait_for(f"ROLE on the promoted {promoted.label()} to say master",
                 lambda: promoted.role()[0] == "master", 15)
        follower = [r for r in self.replicas if r is not promoted][0]

        def follows():
            role = follower.role()
            info = follower.info_repl()
            return (role[0] == "slave" and int(role[2]) == promoted.port and role[3] == "connected"
                    and info.get("master_port") == promoted.port
                    and info.get("master_link_status") == "up") and (role, info)

        wait_for(f"the other replica {follower.label()} to follow {promoted.label()} "
                 f"(ROLE slave 127.0.0.1 {promoted.port} connected, master_link_status:up)",
                 follows, timeout, 0.1)
        self.note(f"{follower.name} follows {promoted.name}")
        return promoted, follower

    def wait_settled(self, live, timeout=45):
        """Every Sentinel names the same master among the `live` servers and holds it up
        (flags "master": no failover in progress), it says ROLE master, and every other live
        server follows it with master_link_status:up. Returns (master, [replicas]). Any
        failover Sentinel may run meanwhile is allowed: this is the state it must end in."""
        state = {}

        def settled():
            addr = self.current_master()
            state.clear()
            state["sentinels"] = [s.master_addr() for s in self.sentinels]
            if not addr:
                return None
            m = self.server_by_port(addr[1])
            flags = [_as_dict(s.master_state())["flags"] for s in self.sentinels]
            state["flags"] = flags
            if m not in live or any(f != "master" for f in flags):
                return None
            state["role"] = m.role()[0]
            if state["role"] != "master":
                return None
            others = [x for x in live if x is not m]
            for o in others:
                ri = o.info_repl()
                state[o.name] = (ri.get("role"), ri.get("master_port"), ri.get("master_link_status"))
                if state[o.name] != ("slave", m.port, "up"):
                    return None
            return m, others

        try:
            got = wait_for("the cluster to settle", settled, timeout, 0.1)
        except AssertionError as e:
            raise AssertionError(
                f"{e}: want all Sentinels to name one of {[x.label() for x in live]} (flags master), "
                f"ROLE master there and the others its replicas with the link up; last seen {state}") from None
        self.note(f"settled: master {got[0].name}, replicas {[x.name for x in got[1]]}")
        return got

    def report(self):
        out = [f"=== cluster in {self.work}", "--- events (s since start):"]
        out += [f"  {t:7.2f} {w}" for t, w in self.events]
        for s in self.servers:
            out.append(f"--- {s.label()}: {'running' if s.alive() else 'NOT running'}")
            out.append(s.raw_info_repl())
            out.append(f"--- {s.name} config file {s.conf}:")
            try:
                out.append(s.read_conf())
            except OSError as e:
                out.append(f"<{e}>")
            out.append(f"--- {s.name} log (end):")
            out.append(tail(s.log, 30))
        for s in self.sentinels:
            out.append(f"--- {s.label()} log (end):")
            out.append(tail(s.log, 40))
        return "\n".join(out)

    def close(self, keep=False):
        for p in self.sentinels + self.servers:
            _stop(p.proc)
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)


def check_rewritten_config(server, master_port):
    """The configuration file Kite started with, after Sentinel's CONFIG REWRITE: every
    comment the test wrote is still there, `port` unchanged, and a `replicaof 127.0.0.1
    <master_port>` line when master_port is given, no replicaof/slaveof line otherwise."""
    text = server.read_conf()
    lines = [l.strip() for l in text.splitlines()]
    problems = []
    for c in server.comments:
        if c not in lines:
            problems.append(f"comment lost: {c!r}")
    if f"port {server.port}" not in lines:
        problems.append(f"'port {server.port}' line lost")
    repl = [l for l in lines if re.match(r"(replicaof|slaveof)\s", l, re.I)]
    if master_port is None:
        if repl:
            problems.append(f"a promoted master's file still has {repl}")
    elif repl != [f"replicaof 127.0.0.1 {master_port}"]:
        problems.append(f"expected exactly one line 'replicaof 127.0.0.1 {master_port}', found {repl}")
    assert not problems, (f"{server.label()}: configuration file {server.conf} after CONFIG REWRITE: "
                          + "; ".join(problems) + f"\n--- as written by the test:\n{server.initial_conf}"
                          f"--- now:\n{text}")
