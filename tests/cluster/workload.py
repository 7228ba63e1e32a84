"""Workloads of the cluster tests: keys written through redis-py's RedisCluster, a background
writer for writes during a reshard or a failover (every acknowledged write is remembered
and must be read back), and checks of where keys and slots are."""

import threading
import time

import redis

from clusterlib import key_slot, slot_count


class Writer(threading.Thread):
    """Writes `<prefix>:<i>` = `<i>` for i = 0, 1, ... through its own RedisCluster until
    stopped. A write that raises is retried (same key, same value) after a short pause; a
    write is acknowledged when SET returned True. `acked` holds acknowledged keys, `tried`
    every key sent at least once (a write that raised may still have been applied)."""

    def __init__(self, make_client, prefix, pause=0.0):
        super().__init__(daemon=True)
        self.make_client = make_client
        self.prefix = prefix
        self.pause = pause
        self.acked = {}
        self.tried = set()
        self.errors = []
        self._halt = threading.Event()
        self.failure = None

    def run(self):
        try:
            client = self.make_client()
        except Exception as e:  # noqa: BLE001
            self.failure = e
            return
        i = 0
        try:
            while not self._halt.is_set():
                key, val = f"{self.prefix}:{i}", str(i)
                self.tried.add(key)
                try:
                    if client.set(key, val):
                        self.acked[key] = val
                        i += 1
                    else:
                        self.errors.append((time.monotonic(), key, "SET returned a falsy reply"))
                except (redis.RedisError, OSError) as e:
                    self.errors.append((time.monotonic(), key, repr(e)))
                    if len(self.errors) > 5000:
                        self.failure = AssertionError(f"too many write errors; last: {e!r}")
                        return
                    time.sleep(0.05)
                    continue
                except AttributeError as e:
                    # redis-py's RedisCluster follows an -ASK to a node missing from its
                    # node cache (one that joined after the client started and served no
                    # slot then) with `None.redis_connection`: a client bug, whatever the
                    # server. A fresh client reads the current slot map; the write retries.
                    self.errors.append((time.monotonic(), key, repr(e)))
                    if len(self.errors) > 5000:
                        self.failure = AssertionError(f"too many write errors; last: {e!r}")
                        return
                    try:
                        client.close()
                    except Exception:  # noqa: BLE001
                        pass
                    time.sleep(0.05)
                    client = self.make_client()
                    continue
                if self.pause:
                    time.sleep(self.pause)
        finally:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass

    def stop(self, timeout=30):
        self._halt.set()
        self.join(timeout)
        assert not self.is_alive(), "the writer thread did not stop"
        if self.failure:
            raise self.failure


def read_back(client, expected, what):
    """Every key of the dict `expected` has its value, read through `client` (RedisCluster)
    in batches of single-key GETs; raises AssertionError listing the first misses."""
    keys = list(expected)
    missing = []
    for start in range(0, len(keys), 500):
        batch = keys[start:start + 500]
        pipe = client.pipeline(transaction=False)
        for k in batch:
            pipe.get(k)
        for k, got in zip(batch, pipe.execute()):
            if got != expected[k]:
                missing.append((k, expected[k], got))
    assert not missing, (f"{what}: {len(missing)} of {len(keys)} keys wrong or lost; first: "
                         f"{missing[:10]}")


def masters_of(node):
    return [e for e in node.nodes() if "master" in e["flags"] and "fail" not in e["flags"]]


def slots_by_id(node):
    return {e["id"]: slot_count(e) for e in node.nodes() if "master" in e["flags"]}


def write_keys(rc, prefix, n):
    expected = {f"{prefix}:{i}": f"v{i}" for i in range(n)}
    pipe = rc.pipeline(transaction=False)
    for k, v in expected.items():
        pipe.set(k, v)
    assert all(pipe.execute()), "a SET of the initial keys failed"
    return expected


def total_dbsize(nodes):
    return sum(n.cmd("DBSIZE") for n in nodes)


def check_keys_on_owners(nodes, keys):
    """Each key lives on the master owning its slot (by node[0]'s CLUSTER NODES; the slot
    checked with CLUSTER KEYSLOT too)."""
    owner = {}
    for e in nodes[0].nodes():
        if "master" in e["flags"]:
            for a, b in e["slots"]:
                owner[(a, b)] = e["port"]
    by_port = {n.port: n for n in nodes}
    for k in keys:
        slot = key_slot(k)
        assert nodes[0].cmd("CLUSTER", "KEYSLOT", k) == slot, k
        port = next(p for (a, b), p in owner.items() if a <= slot <= b)
        assert by_port[port].cmd("EXISTS", k) == 1, f"{k} (slot {slot}) not on its owner, port {port}"
