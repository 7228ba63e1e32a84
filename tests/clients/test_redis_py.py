"""Smoke tests with the real redis-py client against a running Kite.

The server is started by scripts/test.sh, which passes its port in KITE_PORT:

    KITE_PORT=6390 python3 -m pytest -q tests/clients
"""

import os
import threading

import pytest
import redis

PORT = int(os.environ.get("KITE_PORT", "6379"))
HOST = os.environ.get("KITE_HOST", "127.0.0.1")


@pytest.fixture
def r():
    client = redis.Redis(host=HOST, port=PORT, decode_responses=True, socket_timeout=10)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def rb():
    client = redis.Redis(host=HOST, port=PORT, socket_timeout=10)
    yield client
    client.close()


def test_ping(r):
    assert r.ping() is True
    assert r.echo("hello") == "hello"


def test_set_get(r, rb):
    assert r.set("greeting", "hello") is True
    assert r.get("greeting") == "hello"
    assert r.get("missing") is None
    assert r.set("greeting", "again", nx=True) is None
    assert r.set("temp", "v", px=100_000) is True
    assert 0 < r.pttl("temp") <= 100_000
    assert r.mset({"a": "1", "b": "2", "{t}c": "3"}) is True
    assert r.mget("a", "b", "{t}c", "nope") == ["1", "2", "3", None]
    assert r.incr("a") == 2
    assert r.delete("a", "b", "nope") == 2
    payload = bytes(range(256))
    assert rb.set(b"bin\x00key", payload) is True
    assert rb.get(b"bin\x00key") == payload


def test_errors_are_raised(r):
    r.rpush("lst", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.get("lst")
    r.set("s", "abc")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        r.incr("s")


def test_pipeline(r):
    pipe = r.pipeline(transaction=False)
    for i in range(100):
        pipe.set(f"p:{i}", i)
    for i in range(100):
        pipe.get(f"p:{i}")
    pipe.incr("p:counter")
    pipe.rpush("p:list", "x")
    pipe.get("p:list")  # WRONGTYPE, returned in place
    results = pipe.execute(raise_on_error=False)
    assert results[:100] == [True] * 100
    assert results[100:200] == [str(i) for i in range(100)]
    assert results[200] == 1
    assert results[201] == 1
    assert isinstance(results[202], redis.ResponseError)


def test_transaction(r):
    pipe = r.pipeline(transaction=True)
    pipe.set("t:a", 1).incrby("t:a", 5).get("t:a").set("t:b", "x")
    assert pipe.execute() == [True, 6, "6", True]


def test_transaction_with_watch(r):
    r.set("balance", 100)

    def withdraw(pipe):
        current = int(pipe.get("balance"))
        pipe.multi()
        pipe.set("balance", current - 10)

    assert r.transaction(withdraw, "balance") == [True]
    assert r.get("balance") == "90"

    other = redis.Redis(host=HOST, port=PORT, decode_responses=True)
    try:
        with r.pipeline() as pipe:
            pipe.watch("balance")
            other.set("balance", 0)  # touched by another connection
            pipe.multi()
            pipe.set("balance", 1000)
            with pytest.raises(redis.WatchError):
                pipe.execute()
    finally:
        other.close()
    assert r.get("balance") == "0"


def test_concurrent_watch_increments(r):
    r.set("counter", 0)

    def worker():
        c = redis.Redis(host=HOST, port=PORT, decode_responses=True)
        for _ in range(50):
            while True:
                with c.pipeline() as pipe:
                    try:
                        pipe.watch("counter")
                        value = int(pipe.get("counter"))
                        pipe.multi()
                        pipe.set("counter", value + 1)
                        pipe.execute()
                        break
                    except redis.WatchError:
                        continue
        c.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.get("counter") == "200"


def test_incrbyfloat(r):
    assert r.incrbyfloat("f", 10.5) == 10.5
    assert r.incrbyfloat("f", 0.25) == 10.75
    assert r.get("f") == "10.75"
    assert r.incrbyfloat("f", -10.75) == 0
    assert r.get("f") == "0"
    r.set("g", "5.0e3")
    assert r.incrbyfloat("g", 2.0e2) == 5200.0
    assert r.get("g") == "5200"


def test_scan_iter(r):
    with r.pipeline(transaction=False) as pipe:
        for i in range(250):
            pipe.set(f"user:{i}", i)
        for i in range(50):
            pipe.rpush(f"queue:{i}", "job")
        pipe.execute()
    assert set(r.scan_iter(match="user:*", count=17)) == {f"user:{i}" for i in range(250)}
    assert set(r.scan_iter(_type="list", count=10)) == {f"queue:{i}" for i in range(50)}
    assert len(set(r.scan_iter())) == 300
    assert r.dbsize() == 300


def test_expire_and_ttl(r):
    r.set("e", "v")
    assert r.expire("e", 100) is True
    assert 98 <= r.ttl("e") <= 100
    assert r.persist("e") is True
    assert r.ttl("e") == -1
    assert r.ttl("missing") == -2


def test_resp3_hello():
    c = redis.Redis(host=HOST, port=PORT, protocol=3, decode_responses=True)
    try:
        info = c.execute_command("HELLO", "3")
        assert info["proto"] == 3
        assert "version" in info and "server" in info
        assert c.ping() is True
        c.set("r3", "v")
        assert c.get("r3") == "v"
        assert c.get("r3-missing") is None
        c.rpush("r3list", "a", "b")
        assert c.lrange("r3list", 0, -1) == ["a", "b"]
        assert c.incrbyfloat("r3f", 1.5) == 1.5
    finally:
        c.close()
