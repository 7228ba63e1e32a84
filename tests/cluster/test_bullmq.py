"""BullMQ on Redis Cluster (ioredis `Cluster`) through a reshard of the queue's slot and a
failover of the master then serving it.

test_bullmq_reshard_and_failover (marker `failover`)
    3 masters + 3 replicas (`redis-cli --cluster create --cluster-replicas 1`). The queue's
    prefix is a hash tag `{bullN}` whose slot is the lowest slot of one master (the source),
    so that `redis-cli --cluster reshard --cluster-from <source> --cluster-to <target>
    --cluster-slots 1 --cluster-pipeline 1` moves exactly that slot, one key per MIGRATE. bullmq_cluster.mjs runs a BullMQ producer
    (at most 150 jobs/s, a unique uid in each job's data, each add acknowledged by a
    SET + WAIT 1 probe on the slot's master) and a worker, both on ioredis Cluster with the
    masters as startup nodes. While jobs flow: after 300 acknowledged jobs the slot is
    resharded to the target (redis-cli's SETSLOT IMPORTING/MIGRATING, MIGRATE ... KEYS,
    SETSLOT NODE; BullMQ's scripts meet -ASK and -TRYAGAIN); after 300 more the target is
    killed with SIGKILL and its replica must be promoted with the slot (every survivor
    flags it fail, cluster_state:ok). The producer goes on to 3000 jobs and at least 200
    acknowledged after the promotion; every acknowledged job must end completed with its
    uid as return value, no job failed. Jobs that got an id but no acknowledgement and are
    gone (asynchronous replication loses what the killed master had not passed on) and
    jobs that ran twice (a completion lost with the killed master: BullMQ's stalled-job
    check runs the job again) are reported, not failures.
"""

import json
import os
import queue
import subprocess
import threading
import time

import pytest

from clusterlib import ROOT, key_slot, wait_for
from test_create import make_six, wait_replica_links

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = int(os.environ.get("CLUSTER_BULLMQ_JOBS", "3000"))


def tag_for_slot(slot):
    """A hash tag `bullN` whose slot is `slot`."""
    for i in range(1_000_000):
        if key_slot(f"bull{i}") == slot:
            return f"bull{i}"
    raise AssertionError(f"no tag bullN with slot {slot}")


def slot_owner(node, slot):
    """The id of the master that `node` says serves `slot`, or None."""
    for e in node.nodes():
        if "master" in e["flags"] and any(a <= slot <= b for a, b in e["slots"]):
            return e["id"]
    return None


def redirections(node):
    """The -MOVED / -ASK / -TRYAGAIN replies a node counted (INFO errorstats), for the
    record only."""
    conn = node.client()
    try:
        stats = conn.info("errorstats")
    except Exception as e:  # noqa: BLE001 - informational
        return f"<INFO errorstats: {e}>"
    finally:
        conn.close()
    return {k[len("errorstat_"):]: v.get("count", v) if isinstance(v, dict) else v
            for k, v in stats.items() if k[len("errorstat_"):] in ("MOVED", "ASK", "TRYAGAIN")}


class NodeProgram:
    """bullmq_cluster.mjs as a child process: its stdout lines are collected by a thread,
    the latest PROGRESS counters parsed; signals go to its stdin."""

    def __init__(self, env, cluster):
        self.cluster = cluster
        self.proc = subprocess.Popen(
            ["node", os.path.join(HERE, "bullmq_cluster.mjs")], env=env, cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.lines = []
        self.ready = False
        self.added = self.acked = self.errors = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                if line == "READY":
                    self.ready = True
                if line.startswith("PROGRESS "):
                    f = dict(kv.split("=", 1) for kv in line.split()[1:])
                    self.added, self.acked, self.errors = int(f["added"]), int(f["acked"]), int(f["errors"])
                    continue
                self.lines.append(line)

    def alive(self):
        if self.proc.poll() is not None:
            self._reader.join(5)
            raise AssertionError(f"bullmq_cluster.mjs exited early with {self.proc.returncode}:\n{self.output()}")
        return True

    def wait_acked(self, n, timeout, what):
        wait_for(f"bullmq_cluster.mjs: {what} (acknowledged jobs >= {n})",
                 lambda: self.alive() and self.acked >= n and self.acked, timeout, 0.1)
        self.cluster.note(f"program: added {self.added}, acknowledged {self.acked}, add errors {self.errors}")

    def signal(self, what):
        self.cluster.note(f"-> program: {what}")
        self.proc.stdin.write(f"{what}\n".encode())
        self.proc.stdin.flush()

    def output(self):
        with self._lock:
            return "\n".join(self.lines + [f"(last PROGRESS: added={self.added} acked={self.acked} errors={self.errors})"])

    def finish(self, timeout):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"bullmq_cluster.mjs did not finish in {timeout} s:\n{self.output()}") from None
        self._reader.join(10)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.failover
def test_bullmq_reshard_and_failover(make_cluster):
    c = make_cluster("bullmq")
    nodes, ids, masters, replicas = make_six(c)
    wait_replica_links(replicas)
    id_of = {n: i for i, n in ids.items()}

    source, target = sorted(masters, key=lambda n: n.port)[:2]
    source_entry = next(e for e in nodes[0].nodes() if e["id"] == id_of[source])
    slot = min(a for a, _ in source_entry["slots"])
    tag = tag_for_slot(slot)
    assert source.cmd("CLUSTER", "KEYSLOT", "{%s}:jobs:id" % tag) == slot
    heir = next(r for r, m in replicas.items() if m is target)
    c.note(f"queue prefix {{{tag}}}: slot {slot}, the lowest of {source.label()}; it moves to "
           f"{target.label()}, whose replica is {heir.label()}")

    env = dict(os.environ,
               CLUSTER_PORTS=",".join(str(m.port) for m in sorted(masters, key=lambda n: n.port)),
               ALL_PORTS=",".join(str(n.port) for n in nodes),
               TAG=tag, JOBS=str(JOBS), RATE="150")
    prog = NodeProgram(env, c)
    c.note("bullmq_cluster.mjs started")
    try:
        wait_for("bullmq_cluster.mjs to be READY", lambda: prog.alive() and prog.ready, 60)
        prog.wait_acked(300, 90, "jobs flowing before the reshard")

        # (a) the queue's slot moves to the target while jobs flow. One key per MIGRATE
        # (--cluster-pipeline 1) keeps the slot half-migrated longer: BullMQ's scripts then
        # meet -ASK (keys already moved) and -TRYAGAIN (some moved, some not).
        prog.signal("RESHARD_START")
        c.cli("reshard", source.addr(), "--cluster-from", id_of[source], "--cluster-to",
              id_of[target], "--cluster-slots", 1, "--cluster-pipeline", 1, "--cluster-yes",
              timeout=180)
        wait_for(f"every node to map slot {slot} to {target.label()}",
                 lambda: all(slot_owner(n, slot) == id_of[target] for n in nodes), 30, 0.2)
        assert source.cmd("CLUSTER", "COUNTKEYSINSLOT", slot) == 0, "keys left on the source"
        moved = target.cmd("CLUSTER", "COUNTKEYSINSLOT", slot)
        assert moved > 0, "no key of the queue on the target"
        for n in nodes:
            assert "[" not in n.cmd("CLUSTER", "NODES"), f"migration marker left on {n.label()}"
        c.note(f"slot {slot} on {target.label()} with {moved} keys; redirections answered: "
               f"source {redirections(source)}, target {redirections(target)}")
        prog.signal("RESHARDED")
        prog.wait_acked(prog.acked + 300, 90, "jobs flowing after the reshard")

        # (b) SIGKILL of the master now serving the slot; its replica takes over.
        survivors = [n for n in nodes if n is not target]
        c.note(f"SIGKILL {target.label()}")
        target.kill9()
        prog.signal("KILLED")
        t_kill = time.monotonic()
        heir_id, target_id = id_of[heir], id_of[target]
        target_slots = sorted(next(e for e in heir.nodes() if e["id"] == target_id)["slots"])
        assert any(a <= slot <= b for a, b in target_slots), target_slots

        def promoted():
            for n in survivors:
                table = {e["id"]: e for e in n.nodes()}
                v, h = table.get(target_id), table.get(heir_id)
                if not v or "fail" not in v["flags"]:
                    return None
                if not h or "master" not in h["flags"] or sorted(h["slots"]) != target_slots:
                    return None
                if n.cluster_info().get("cluster_state") != "ok":
                    return None
            return True

        wait_for(f"{heir.label()} to be promoted with slot {slot} and the cluster ok on every "
                 "survivor", lambda: prog.alive() and promoted(), 90, 0.2)
        c.note(f"promoted after {time.monotonic() - t_kill:.1f} s")
        prog.signal("FAILOVER_DONE")

        rc = prog.finish(420)
        out = prog.output()
        print(out)
        assert rc == 0, f"bullmq_cluster.mjs failed (exit {rc}):\n{out}"
        assert any(l.startswith("PASS bullmq-cluster") for l in out.splitlines()), out
        summary = json.loads(next(l for l in out.splitlines() if l.startswith("SUMMARY "))[8:])
        c.note(f"summary: {summary}")
        assert summary["added"] >= JOBS and summary["acked"] > 0, summary
        assert heir.cmd("CLUSTER", "COUNTKEYSINSLOT", slot) > 0
        assert heir.cmd("ROLE")[0] == "master"
    finally:
        prog.kill()
