"""Servers for the cluster-mode tests (tests/cluster): nodes started with
`--cluster-enabled yes`, redis-cli's cluster manager (`redis-cli --cluster ...`), waits with
deadlines, and the diagnostics a failure prints (each node's log, CLUSTER NODES and
CLUSTER INFO).

Environment:
  KITE_BIN        the Kite binary (default: target/release/kite)
  FW_SERVER       "kite" (default) or "redis": run the Kite nodes as redis-server instead, to
                  check the tests themselves
  REDIS_SERVER    the redis-server of the mixed cluster's Redis nodes and of FW_SERVER=redis
                  (default: redis-server on PATH, Debian's 7.0)
  REDIS_CLI       the redis-cli to drive the cluster manager (default: redis-cli on PATH)
  CLUSTER_THREADS Kite's --threads per node (default 2)
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
REDIS_SERVER = os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "redis-server"
REDIS_CLI = os.environ.get("REDIS_CLI") or shutil.which("redis-cli") or "redis-cli"
THREADS = int(os.environ.get("CLUSTER_THREADS", "2"))
NODE_TIMEOUT_MS = 2000
HEX40 = re.compile(r"^[0-9a-f]{40}$")

_used_ports = set()


def _bindable(port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port():
    """A loopback port below 55000 that is free, with port+10000 (the cluster bus) free too.
    Both stay below the kernel's ephemeral range when it allows, so that no outgoing
    connection (clients reconnecting to a killed node, the bus's own links) takes one of
    them meanwhile."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo = int(f.read().split()[0])
    hi = min(55000, lo - 10000) if lo - 10000 > 12000 else 55000
    for _ in range(1000):
        port = random.randrange(10000, hi)
        if port in _used_ports or port + 10000 in _used_ports:
            continue
        if not (_bindable(port) and _bindable(port + 10000)):
            continue
        _used_ports.update((port, port + 10000))
        return port
    raise RuntimeError("no free port pair (port, port+10000) below 55000")


def wait_for(what, fn, timeout, interval=0.1):
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


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", l) for l in lines[-n:])


def parse_nodes(text):
    """CLUSTER NODES as a list of dicts: id, ip, port, cport, flags (set), master,
    config_epoch, link, slots (list of (start, end)), raw."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(" ")
        addr = f[1].split(",")[0]
        hostport, _, cport = addr.partition("@")
        ip, _, port = hostport.rpartition(":")
        slots = []
        for s in f[8:]:
            if s.startswith("["):
                continue
            a, _, b = s.partition("-")
            slots.append((int(a), int(b or a)))
        out.append({
            "id": f[0], "ip": ip, "port": int(port), "cport": int(cport or 0),
            "flags": set(f[2].split(",")), "master": f[3], "config_epoch": int(f[6]),
            "link": f[7], "slots": slots, "raw": line,
        })
    return out


def crc16(data):
    """CRC16/XMODEM, the cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key):
    """The slot of a key as the cluster specification defines it (hash tags included)."""
    k = key.encode() if isinstance(key, str) else key
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1:end]
    return crc16(k) & 0x3FFF


def slot_count(entry):
    return sum(b - a + 1 for a, b in entry["slots"])


class Node:
    """A server in cluster mode: `--cluster-enabled yes --cluster-node-timeout 2000`, its
    own directory (nodes.conf and the log there), bus on port+10000 (the default)."""

    def __init__(self, workdir, name, kind, extra=()):
        assert kind in ("kite", "redis")
        self.name = name
        self.kind = kind
        self.port = free_port()
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(self.dir, "server.log")
        self.extra = list(extra)
        self.proc = None

    def label(self):
        what = "redis-server" if self.kind == "redis" else f"kite --threads {THREADS}"
        return f"{self.name} ({what}, port {self.port})"

    def argv(self):
        common = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                  "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                  "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                  "--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
        if self.kind == "redis":
            return [REDIS_SERVER, *common, *self.extra]
        return [KITE_BIN, *common, "--threads", str(THREADS), *self.extra]

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
            wait_for(f"{self.label()} to answer PING", up, timeout)
        finally:
            c.close()
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def client(self, **kw):
        kw.setdefault("socket_timeout", 5)
        kw.setdefault("decode_responses", True)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def cmd(self, *args):
        c = self.client()
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def addr(self):
        return f"127.0.0.1:{self.port}"

    def own_keys(self, keys):
        """The keys among `keys` whose slots this node serves as a master, or serves through
        its master as a replica (from its own CLUSTER NODES)."""
        table = self.nodes()
        me = next(e for e in table if "myself" in e["flags"])
        if "slave" in me["flags"]:
            me = next(e for e in table if e["id"] == me["master"])
        return [k for k in keys if any(a <= key_slot(k) <= b for a, b in me["slots"])]

    def myid(self):
        return self.cmd("CLUSTER", "MYID")

    def nodes(self):
        return parse_nodes(self.cmd("CLUSTER", "NODES"))

    def cluster_info(self):
        text = self.cmd("CLUSTER", "INFO")
        return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)

    def describe(self):
        out = [f"--- {self.label()}: {'running' if self.alive() else 'NOT running'}"]
        if self.alive():
            for what in (("CLUSTER", "INFO"), ("CLUSTER", "NODES")):
                try:
                    out.append(f"{' '.join(what)}:\n{self.cmd(*what)}")
                except Exception as e:  # noqa: BLE001
                    out.append(f"<{' '.join(what)} failed: {e!r}>")
        out.append(f"--- {self.name} log (end):\n{tail(self.log, 30)}")
        return "\n".join(out)


class Cluster:
    """Nodes in a work directory, redis-cli's cluster manager, and a record of what was done
    (printed when a test fails)."""

    def __init__(self, name):
        self.work = tempfile.mkdtemp(prefix=f"kite-cluster-{name}.")
        self.nodes = []
        self.t0 = time.monotonic()
        self.events = []

    def note(self, what):
        self.events.append((time.monotonic() - self.t0, what))

    def add(self, kind=None, name=None, extra=()):
        kind = kind or ("redis" if SERVER_KIND == "redis" else "kite")
        n = Node(self.work, name or f"node{len(self.nodes) + 1}", kind, extra)
        self.nodes.append(n)
        n.start()
        self.note(f"started {n.label()}")
        return n

    def cli(self, *args, timeout=180, check=True):
        """Runs `redis-cli --cluster ...`; returns its output (stdout and stderr, colours
        removed). Raises AssertionError with the output when it fails and check is set."""
        argv = [REDIS_CLI, "--cluster", *[str(a) for a in args]]
        self.note("$ " + " ".join(argv[1:]))
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode("utf-8", "replace")
            raise AssertionError(f"{' '.join(argv)} did not finish in {timeout} s; output:\n{out[-4000:]}")
        out = re.sub(r"\x1b\[[0-9;]*m", "", p.stdout.decode("utf-8", "replace"))
        self.note(f"  -> exit {p.returncode}")
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited with {p.returncode}; output:\n{out[-4000:]}")
        return out

    def create(self, masters, replicas=(), replicas_per_master=0):
        nodes = list(masters) + list(replicas)
        out = self.cli("create", *[n.addr() for n in nodes],
                       "--cluster-replicas", replicas_per_master, "--cluster-yes")
        assert "[OK] All 16384 slots covered." in out, out
        self.note("redis-cli --cluster create done")
        return out

    def check(self, node, timeout=60):
        """`redis-cli --cluster check` until it passes (the cluster may still be converging),
        within `timeout` seconds; returns its output."""
        last = {}

        def ok():
            out = self.cli("check", node.addr(), check=False, timeout=60)
            last["out"] = out
            return (("[OK] All nodes agree about slots configuration." in out)
                    and ("[OK] All 16384 slots covered." in out)
                    and "[ERR]" not in out and "[WARNING]" not in out) and out

        try:
            return wait_for(f"redis-cli --cluster check {node.addr()} to pass", ok, timeout, 1.0)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- last output:\n{last.get('out', '')}") from None

    def wait_converged(self, nodes, timeout=60):
        """Every node in `nodes` says cluster_state:ok, knows exactly these nodes, and agrees
        with every other on the owner of all 16384 slots."""
        ids = {n.port: n.myid() for n in nodes}
        want_ids = set(ids.values())

        def view(n):
            table = n.nodes()
            owner = {}
            for e in table:
                if "master" in e["flags"]:
                    for a, b in e["slots"]:
                        owner[(a, b)] = e["id"]
            return {e["id"] for e in table}, tuple(sorted(owner.items()))

        def ok():
            views = []
            for n in nodes:
                info = n.cluster_info()
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != len(nodes):
                    return None
                known, owners = view(n)
                if known != want_ids:
                    return None
                views.append(owners)
            return all(v == views[0] for v in views) and sum(b - a + 1 for (a, b), _ in views[0]) == 16384

        wait_for(f"{len(nodes)} nodes to agree on the slots with cluster_state:ok", ok, timeout, 0.2)

    def client(self, node=None, **kw):
        """redis-py's RedisCluster from one node."""
        from redis.cluster import RedisCluster
        node = node or self.nodes[0]
        kw.setdefault("decode_responses", True)
        kw.setdefault("socket_timeout", 5)
        return RedisCluster(host="127.0.0.1", port=node.port, **kw)

    def report(self):
        out = [f"=== cluster in {self.work}", "--- events (s since start):"]
        out += [f"  {t:7.2f} {w}" for t, w in self.events]
        for n in self.nodes:
            out.append(n.describe())
        return "\n".join(out)

    def close(self, keep=False):
        for n in self.nodes:
            n.stop()
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)
