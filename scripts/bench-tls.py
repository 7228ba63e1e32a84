#!/usr/bin/env python3
"""Server CPU per request over TLS (issue 12), Kite beside Debian's redis-server, on loopback.

Each server is started with a throw-away CA, server and client certificates (made here with
the openssl CLI, client certificates required as by default), then loaded by
redis-benchmark (the standard client, built with TLS) with SET and GET, unpipelined and
pipelined 16 deep, over TLS and over plain TCP. The figure is the server's own CPU time
(utime + stime from /proc/<pid>/stat) divided by the requests sent, in microseconds.
The connections are opened before the clock starts (`-k 1`), so handshakes are not
counted. Every run is bounded; every server started here is stopped at the end.

    python3 scripts/bench-tls.py [--requests 200000] [--reps 3] [--threads 1] [--out bench/results/tls]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KITE = os.path.join(ROOT, "target", "release", "kite")
REDIS = shutil.which("redis-server")
BENCH = shutil.which("redis-benchmark")
PROCS = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def make_certs(d):
    def run(*a):
        subprocess.run(a, check=True, capture_output=True, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt",
        "-days", "2", "-subj", "/CN=bench CA")
    with open(f"{d}/server.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    with open(f"{d}/client.ext", "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        run("openssl", "req", *ec, "-keyout", f"{d}/{who}.key", "-out", f"{d}/{who}.csr",
            "-subj", f"/CN={who}")
        run("openssl", "x509", "-req", "-in", f"{d}/{who}.csr", "-CA", f"{d}/ca.crt",
            "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-out", f"{d}/{who}.crt",
            "-days", "2", "-extfile", f"{d}/{who}.ext")


def start(kind, port, tls_port, certs, threads):
    d = tempfile.mkdtemp(prefix=f"bench-tls-{kind}-")
    common = ["--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "",
              "--appendonly", "no", "--tls-port", str(tls_port),
              "--tls-cert-file", f"{certs}/server.crt", "--tls-key-file", f"{certs}/server.key",
              "--tls-ca-cert-file", f"{certs}/ca.crt"]
    args = ([KITE] + common + ["--threads", str(threads)]) if kind == "kite" else [REDIS] + common
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    PROCS.append(p)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return p
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{kind} did not start")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(pid, port, certs, tls, test, pipeline, requests):
    args = [BENCH, "-h", "127.0.0.1", "-p", str(port), "-t", test, "-n", str(requests),
            "-c", "50", "-P", str(pipeline), "-k", "1", "-q", "-r", "10000"]
    if tls:
        args += ["--tls", "--cacert", f"{certs}/ca.crt", "--cert", f"{certs}/client.crt",
                 "--key", f"{certs}/client.key"]
    before = cpu_seconds(pid)
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    used = cpu_seconds(pid) - before
    if out.returncode != 0:
        raise RuntimeError(out.stderr or out.stdout)
    return used * 1e6 / requests


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    certs = tempfile.mkdtemp(prefix="bench-tls-certs-")
    make_certs(certs)
    rows = []
    try:
        for kind in ("kite", "redis"):
            port, tls_port = free_port(), free_port()
            p = start(kind, port, tls_port, certs, a.threads)
            for tls in (True, False):
                for test in ("set", "get"):
                    for pipeline in (1, 16):
                        samples = [bench(p.pid, tls_port if tls else port, certs, tls, test,
                                         pipeline, a.requests) for _ in range(a.reps)]
                        row = {"server": kind, "tls": tls, "test": test, "pipeline": pipeline,
                               "server_cpu_us_per_op": round(statistics.median(samples), 3),
                               "samples": [round(s, 3) for s in samples]}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            p.terminate()
            p.wait(timeout=10)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(certs, ignore_errors=True)
    print("\nserver CPU us/op, median of", a.reps, "(Kite threads", a.threads, ")")
    print(f"{'case':<22}{'kite':>8}{'redis':>8}{'ratio':>8}")
    for tls in (True, False):
        for test in ("set", "get"):
            for pipeline in (1, 16):
                k = next(r for r in rows if r["server"] == "kite" and r["tls"] == tls
                         and r["test"] == test and r["pipeline"] == pipeline)
                r = next(r for r in rows if r["server"] == "redis" and r["tls"] == tls
                         and r["test"] == test and r["pipeline"] == pipeline)
                name = f"{'tls' if tls else 'plain'} {test} P{pipeline}"
                ratio = k["server_cpu_us_per_op"] / r["server_cpu_us_per_op"]
                print(f"{name:<22}{k['server_cpu_us_per_op']:>8.2f}{r['server_cpu_us_per_op']:>8.2f}{ratio:>8.2f}")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "tls.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
