"""Clusters of Kite nodes (each `--threads 2`, `--cluster-node-timeout 2000`, the bus on
port+10000) built and changed by redis-cli's cluster manager, used through redis-py's
RedisCluster.

test_three_masters_create_reshard_rebalance
    `redis-cli --cluster create` of 3 masters, `--cluster check`, 2000 keys written and read
    back through RedisCluster; `--cluster reshard` of 1000 slots while a writer keeps
    writing (MOVED / ASK / MIGRATE ... KEYS under load), every key read back;
    `--cluster rebalance`, every key read back again.
test_three_masters_three_replicas
    `--cluster create --cluster-replicas 1` with 6 nodes: the replicas are slaves of
    distinct masters in every node's CLUSTER NODES, follow them (INFO replication), get
    their data (READONLY reads), and are listed by CLUSTER SLOTS and CLUSTER SHARDS.
test_failover_after_sigkill (marker `failover`)
    3 masters + 3 replicas; SIGKILL one master; its replica is promoted by the cluster
    (no Sentinel), the cluster is ok again, every key written before the kill is served and
    writes go on; the killed node, started again, rejoins as a replica of the promoted one.
"""

import time

import pytest
import redis

from clusterlib import HEX40, slot_count, wait_for
from workload import (Writer, check_keys_on_owners, masters_of, read_back, slots_by_id,
                      total_dbsize, write_keys)


def test_three_masters_create_reshard_rebalance(make_cluster):
    c = make_cluster("create3")
    nodes = [c.add() for _ in range(3)]
    for n in nodes:
        info = n.cluster_info()
        assert info["cluster_state"] == "fail" and info["cluster_known_nodes"] == "1", info
        assert HEX40.match(n.myid()), n.myid()
    c.create(nodes)
    c.wait_converged(nodes)
    c.check(nodes[0])

    # Every node lists three masters with distinct config epochs (redis-cli gives each one
    # with SET-CONFIG-EPOCH) and 5461 or 5462 slots each.
    for n in nodes:
        ms = masters_of(n)
        assert sorted(m["port"] for m in ms) == sorted(x.port for x in nodes), [m["raw"] for m in ms]
        assert len({m["config_epoch"] for m in ms}) == 3, [m["raw"] for m in ms]
        assert sorted(slot_count(m) for m in ms) == [5461, 5461, 5462], [m["raw"] for m in ms]
        assert all(e["link"] == "connected" for e in n.nodes()), n.cmd("CLUSTER", "NODES")

    rc = c.client()
    expected = write_keys(rc, "key", 2000)
    read_back(rc, expected, "after create")
    assert total_dbsize(nodes) == 2000
    assert all(n.cmd("DBSIZE") > 400 for n in nodes), [n.cmd("DBSIZE") for n in nodes]
    check_keys_on_owners(nodes, list(expected)[:200])
    c.note("2000 keys written and read back")

    # Reshard 1000 slots from node1 to node2 under a writer.
    ids = [n.myid() for n in nodes]
    before = slots_by_id(nodes[0])
    w = Writer(lambda: c.client(nodes[2]), "w")
    w.start()
    wait_for("the writer to get going", lambda: len(w.acked) >= 50, 30)
    c.cli("reshard", nodes[0].addr(), "--cluster-from", ids[0], "--cluster-to", ids[1],
          "--cluster-slots", 1000, "--cluster-yes", timeout=600)
    c.note(f"reshard done; writer acknowledged {len(w.acked)} so far")
    n_at_end = len(w.acked)
    wait_for("the writer to go on after the reshard", lambda: len(w.acked) >= n_at_end + 50, 30)
    w.stop()
    c.note(f"writer stopped: {len(w.acked)} acknowledged, {len(w.errors)} errors")

    c.wait_converged(nodes)
    c.check(nodes[0])
    after = slots_by_id(nodes[0])
    assert after[ids[0]] == before[ids[0]] - 1000, (before, after)
    assert after[ids[1]] == before[ids[1]] + 1000, (before, after)
    assert after[ids[2]] == before[ids[2]], (before, after)
    rc2 = c.client(nodes[1])
    read_back(rc2, expected, "initial keys after the reshard")
    read_back(rc2, w.acked, "keys written during the reshard")
    total = total_dbsize(nodes)
    assert 2000 + len(w.acked) <= total <= 2000 + len(w.tried), (total, len(w.acked), len(w.tried))
    check_keys_on_owners(nodes, list(expected)[:200] + list(w.acked)[-100:])
    # Each node's view of the slots agrees (wait_converged) and no migration is left open.
    for n in nodes:
        assert "[" not in n.cmd("CLUSTER", "NODES"), n.cmd("CLUSTER", "NODES")

    # Rebalance back to an even split.
    c.cli("rebalance", nodes[0].addr(), "--cluster-yes", timeout=600)
    c.wait_converged(nodes)
    c.check(nodes[0])
    counts = slots_by_id(nodes[0])
    assert sum(counts.values()) == 16384
    assert all(5300 <= v <= 5650 for v in counts.values()), counts
    rc3 = c.client(nodes[2])
    read_back(rc3, expected, "initial keys after the rebalance")
    read_back(rc3, w.acked, "reshard-time keys after the rebalance")
    assert total_dbsize(nodes) == total
    for client in (rc, rc2, rc3):
        client.close()


def replica_map(node):
    """{replica id: master id} from a node's CLUSTER NODES."""
    return {e["id"]: e["master"] for e in node.nodes() if "slave" in e["flags"]}


def make_six(c):
    nodes = [c.add() for _ in range(6)]
    c.create(nodes[:3], nodes[3:], replicas_per_master=1)
    c.wait_converged(nodes)
    ids = {n.myid(): n for n in nodes}

    def roles_settled():
        views = []
        for n in nodes:
            ms = {e["id"] for e in masters_of(n) if e["slots"]}
            reps = replica_map(n)
            if len(ms) != 3 or len(reps) != 3 or set(reps.values()) != ms:
                return None
            views.append((frozenset(ms), tuple(sorted(reps.items()))))
        return len(set(views)) == 1 and views[0]

    masters, reps = wait_for("3 masters with one replica each, seen alike by all 6", roles_settled, 60)
    c.check(nodes[0])
    return nodes, ids, {ids[m] for m in masters}, {ids[r]: ids[m] for r, m in reps}


def wait_replica_links(replicas):
    for r, m in replicas.items():
        def up(r=r, m=m):
            info = r.client().info("replication")
            return (info.get("role") == "slave" and info.get("master_port") == m.port
                    and info.get("master_link_status") == "up") and info

        wait_for(f"{r.label()} to follow {m.label()} with master_link_status:up", up, 60)


def wait_replicas_have(replicas, expected):
    """Each replica, with READONLY, serves every expected key of its master's slots."""
    for r, m in replicas.items():
        conn = r.client()
        conn.execute_command("READONLY")
        mine = m.own_keys(expected)
        assert mine, f"no key on {m.label()}"

        def has_all(conn=conn, mine=mine):
            missing = [k for k in mine if conn.get(k) != expected[k]]
            if missing:
                raise AssertionError(f"{len(missing)} missing, e.g. {missing[:3]}")
            return True

        wait_for(f"{r.label()} to serve the {len(mine)} keys of {m.label()}", has_all, 60)
        conn.close()


def test_three_masters_three_replicas(make_cluster):
    c = make_cluster("replicas")
    nodes, ids, masters, replicas = make_six(c)
    assert len(masters) == 3 and set(replicas.values()) == masters
    for r, m in replicas.items():
        me = [e for e in r.nodes() if "myself" in e["flags"]][0]
        assert me["flags"] == {"myself", "slave"} and me["master"] == m.myid(), me["raw"]
        assert not me["slots"], me["raw"]
    wait_replica_links(replicas)

    rc = c.client()
    expected = write_keys(rc, "rk", 1000)
    read_back(rc, expected, "through the masters")
    wait_replicas_have(replicas, expected)
    # A replica without READONLY redirects to its master.
    r, m = next(iter(replicas.items()))
    k = m.own_keys(expected)[0]
    slot = m.cmd("CLUSTER", "KEYSLOT", k)
    with pytest.raises(redis.exceptions.MovedError) as moved:  # -MOVED <slot> <ip>:<port>
        r.cmd("GET", k)
    assert (moved.value.slot_id, moved.value.host, moved.value.port) == (slot, "127.0.0.1", m.port), \
        str(moved.value)

    # CLUSTER SLOTS lists each master's replica after it (Redis leaves out a replica whose
    # replication offset it has not yet heard of as non-zero: polled); SHARDS puts them in
    # one shard.
    by_port = {n.port: n for n in nodes}

    def slots_with_replicas():
        slots = nodes[0].cmd("CLUSTER", "SLOTS")
        assert len(slots) == 3, slots
        if any(len(entry) != 4 for entry in slots):
            return None
        for entry in slots:
            master, replica = by_port[entry[2][1]], by_port[entry[3][1]]
            assert replicas[replica] is master, entry
            assert entry[3][0] == "127.0.0.1" and entry[3][2] == replica.myid(), entry
        return slots

    wait_for("CLUSTER SLOTS to list one replica per range", slots_with_replicas, 60)
    shards = nodes[3].cmd("CLUSTER", "SHARDS")
    assert len(shards) == 3, shards
    for shard in shards:
        shard = shard if isinstance(shard, dict) else dict(zip(shard[::2], shard[1::2]))
        roles = []
        for n in shard["nodes"]:
            n = n if isinstance(n, dict) else dict(zip(n[::2], n[1::2]))
            roles.append(n["role"])
        assert sorted(roles) == ["master", "replica"], shard
    rc.close()


@pytest.mark.failover
def test_failover_after_sigkill(make_cluster):
    c = make_cluster("failover")
    nodes, ids, masters, replicas = make_six(c)
    wait_replica_links(replicas)
    rc = c.client()
    expected = write_keys(rc, "fk", 1000)
    wait_replicas_have(replicas, expected)
    rc.close()

    victim = sorted(masters, key=lambda n: n.port)[0]
    heir = next(r for r, m in replicas.items() if m is victim)
    victim_id, heir_id = victim.myid(), heir.myid()
    victim_slots = sorted(next(e for e in victim.nodes() if e["id"] == victim_id)["slots"])
    survivors = [n for n in nodes if n is not victim]
    c.note(f"SIGKILL {victim.label()}; its replica is {heir.label()}")
    victim.kill9()
    t_kill = time.monotonic()

    def promoted():
        for n in survivors:
            table = {e["id"]: e for e in n.nodes()}
            v, h = table.get(victim_id), table.get(heir_id)
            if not v or "fail" not in v["flags"]:
                return None
            if not h or "master" not in h["flags"] or sorted(h["slots"]) != victim_slots:
                return None
            if n.cluster_info().get("cluster_state") != "ok":
                return None
        return True

    wait_for(f"{heir.label()} to be promoted with {victim_slots} and the cluster ok on every "
             "survivor", promoted, 90, 0.2)
    c.note(f"promoted after {time.monotonic() - t_kill:.1f} s")
    me = [e for e in heir.nodes() if "myself" in e["flags"]][0]
    assert me["flags"] == {"myself", "master"}, me["raw"]
    assert heir.client().info("replication")["role"] == "master"

    rc = c.client(heir)
    read_back(rc, expected, "keys written before the failover")
    more = write_keys(rc, "after", 300)
    read_back(rc, more, "keys written after the failover")
    rc.close()

    # The old master comes back from its nodes.conf as a replica of its heir.
    victim.start()
    c.note(f"restarted {victim.label()}")

    def demoted():
        me = [e for e in victim.nodes() if "myself" in e["flags"]][0]
        if me["flags"] != {"myself", "slave"} or me["master"] != heir_id:
            return None
        info = victim.client().info("replication")
        return info.get("master_port") == heir.port and info.get("master_link_status") == "up"

    wait_for(f"{victim.label()} to rejoin as a replica of {heir.label()}", demoted, 90, 0.2)
    assert victim.myid() == victim_id, "the node id survives the restart (nodes.conf)"
    c.wait_converged(nodes)
    c.check(heir)
    conn = victim.client()
    conn.execute_command("READONLY")
    k = heir.own_keys(expected)[0]
    wait_for(f"{victim.label()} to serve {k} as a replica", lambda: conn.get(k) == expected[k], 60)
    conn.close()
