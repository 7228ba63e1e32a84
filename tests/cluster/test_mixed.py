"""A Kite node joins a cluster of redis-server nodes (Debian's 7.0, or REDIS_SERVER).

test_kite_joins_redis_cluster
    Three redis-server masters made with `redis-cli --cluster create`, 1000 keys written;
    a Kite node added with `redis-cli --cluster add-node` (it must speak Redis's cluster
    bus: MEET, PING/PONG gossip, its node id and flags seen by Redis); `--cluster check`
    OK with four nodes. `--cluster reshard` of 600 slots from all three Redis masters to
    Kite while a writer writes (redis-server MIGRATEs keys into Kite, ASK/ASKING against
    Kite), then 200 slots from Kite back to a Redis node (Kite MIGRATEs to redis-server).
    After each step `--cluster check` passes, every node agrees on the slot owners, every
    key reads back through RedisCluster started from a Redis node and from the Kite node,
    and every key sits on the owner of its slot.
"""

from clusterlib import SERVER_KIND, slot_count, wait_for
from workload import Writer, check_keys_on_owners, read_back, slots_by_id, total_dbsize, write_keys


def test_kite_joins_redis_cluster(make_cluster):
    c = make_cluster("mixed")
    reds = [c.add(kind="redis", name=f"redis{i + 1}") for i in range(3)]
    c.create(reds)
    c.wait_converged(reds)
    c.check(reds[0])
    rc = c.client(reds[0])
    expected = write_keys(rc, "mk", 1000)
    rc.close()

    kite = c.add(name="kite")  # redis-server too with FW_SERVER=redis
    c.note(f"the joining node is {kite.label()} (FW_SERVER={SERVER_KIND})")
    kid = kite.myid()
    c.cli("add-node", kite.addr(), reds[0].addr(), timeout=120)
    everyone = reds + [kite]
    c.wait_converged(everyone)
    c.check(reds[0])
    c.check(kite)
    for n in everyone:
        table = {e["id"]: e for e in n.nodes()}
        k = table[kid]
        assert "master" in k["flags"] and not k["slots"], k["raw"]
        assert (k["ip"], k["port"], k["cport"]) == ("127.0.0.1", kite.port, kite.port + 10000), k["raw"]
    assert kite.cluster_info()["cluster_known_nodes"] == "4"

    # Redis -> Kite: 600 slots from the three Redis masters, under a writer.
    before = slots_by_id(reds[0])
    w = Writer(lambda: c.client(reds[1]), "mw")
    w.start()
    wait_for("the writer to get going", lambda: len(w.acked) >= 50, 30)
    c.cli("reshard", reds[0].addr(), "--cluster-from", "all", "--cluster-to", kid,
          "--cluster-slots", 600, "--cluster-yes", timeout=600)
    n_at_end = len(w.acked)
    wait_for("the writer to go on after the reshard", lambda: len(w.acked) >= n_at_end + 50, 30)
    w.stop()
    c.note(f"writer: {len(w.acked)} acknowledged, {len(w.errors)} errors")
    c.wait_converged(everyone)
    c.check(reds[0])
    c.check(kite)
    after = slots_by_id(kite)
    # redis-cli splits --cluster-slots among the sources by their share, rounding each
    # share down: 600 asked from three masters can be 599 moved.
    moved = after[kid]
    assert 597 <= moved <= 600, after
    assert sum(before.values()) - sum(v for i, v in after.items() if i != kid) == moved, (before, after)
    on_kite = kite.cmd("DBSIZE")
    assert on_kite > 0, "no key moved to the Kite node"
    counted = sum(kite.cmd("CLUSTER", "COUNTKEYSINSLOT", s)
                  for a, b in next(e for e in kite.nodes() if e["id"] == kid)["slots"]
                  for s in range(a, b + 1))
    assert counted == on_kite, (counted, on_kite)
    for start in (reds[2], kite):
        rc = c.client(start)
        read_back(rc, expected, f"initial keys, RedisCluster from {start.label()}")
        read_back(rc, w.acked, f"keys written during the reshard, from {start.label()}")
        rc.close()
    check_keys_on_owners(everyone, list(expected)[:300] + list(w.acked)[-100:])

    # Kite -> Redis: 200 slots back to redis2.
    r2 = reds[1].myid()
    c.cli("reshard", kite.addr(), "--cluster-from", kid, "--cluster-to", r2,
          "--cluster-slots", 200, "--cluster-yes", timeout=600)
    c.wait_converged(everyone)
    c.check(reds[0])
    c.check(kite)
    assert slots_by_id(reds[2])[kid] == moved - 200
    assert kite.cmd("DBSIZE") < on_kite
    rc = c.client(kite)
    read_back(rc, expected, "initial keys after moving slots back")
    read_back(rc, w.acked, "writer's keys after moving slots back")
    rc.close()
    assert total_dbsize(everyone) >= len(expected) + len(w.acked)
    check_keys_on_owners(everyone, list(expected)[:300] + list(w.acked)[-100:])
    for n in everyone:
        assert "[" not in n.cmd("CLUSTER", "NODES"), n.cmd("CLUSTER", "NODES")
        assert slot_count(next(e for e in n.nodes() if e["id"] == kid)) == moved - 200
