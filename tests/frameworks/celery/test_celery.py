"""Celery against the server under test (FW_URL): Redis broker and Redis result backend,
real `celery worker` processes, end results checked.

Every task counts its executions in Redis (see fwapp.py); each test states how many
executions it expects per task id, and the last test checks that the server holds exactly
those counts: nothing ran twice, nothing extra ran.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery, chord, group

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fwapp  # noqa: E402

URL = os.environ["FW_URL"]
DEADLINE = 60  # seconds: the most any single wait may take
EARLY = 0.5  # seconds a countdown/ETA task may run before its time (clock reading slack)
HOST = socket.gethostname()

# task id -> number of executions the tests expect
EXPECTED = {}


def expect(task_id, runs=1):
    EXPECTED[task_id] = runs


def db0():
    return redis.Redis.from_url(f"{URL}/0")


def wait_until(predicate, what, deadline=DEADLINE, step=0.1):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"gave up after {deadline} s waiting for {what}")


class Worker:
    """One `celery worker` process (in a session of its own, so it can be killed whole)."""

    def __init__(self, name, extra_env=None, args=()):
        self.name = f"{name}@{HOST}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"fw-celery-{name}-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONPATH=HERE, **(extra_env or {}))
        cmd = [
            os.path.join(os.path.dirname(sys.executable), "celery"),
            "-A", "fwapp", "worker", "-n", self.name, "-l", "INFO", *args,
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self):
        """Waits for the worker's "ready." line (not a remote-control ping, which the
        ping test checks on its own)."""

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited early:\n{self.tail()}")
            with open(self.log.name, errors="replace") as f:
                return f"{self.name} ready." in f.read()

        wait_until(ready, f"worker {self.name} to be ready")

    def tail(self, lines=40):
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def kill(self):
        """SIGKILL, no chance to acknowledge or give anything back."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)

    def stop(self):
        """Warm shutdown: SIGTERM to the main process only, which waits for its pool."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=DEADLINE)


@pytest.fixture(scope="module")
def worker():
    db0().flushall()
    w = Worker("main", args=["-P", "prefork", "-c", "2"])
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()
        if os.environ.get("FW_VERBOSE"):
            print(w.tail(200))


def exec_count(task_id):
    value = db0().get(f"fw:exec:{task_id}")
    return int(value) if value is not None else 0


def test_tasks_and_results(worker):
    results = [fwapp.add.delay(i, 1000) for i in range(200)]
    for r in results:
        expect(r.id)
    for i, r in enumerate(results):
        assert r.get(timeout=DEADLINE) == i + 1000
        assert r.state == "SUCCESS"
    assert all(exec_count(r.id) == 1 for r in results)


def test_retries_then_success(worker):
    r = fwapp.flaky.delay(3)
    expect(r.id, 4)
    out = r.get(timeout=DEADLINE)
    assert out == {"attempt": 4, "retries": 3}
    assert exec_count(r.id) == 4


def test_retries_exhausted(worker):
    r = fwapp.flaky.delay(100, 2)
    expect(r.id, 3)
    with pytest.raises(RuntimeError):
        r.get(timeout=DEADLINE)
    assert r.state == "FAILURE"
    # the first run and two retries, then the error stands
    assert exec_count(r.id) == 3


def test_countdown_not_before_its_time(worker):
    sent = time.time()
    r = fwapp.stamp.apply_async(countdown=3)
    expect(r.id)
    ran_at = r.get(timeout=DEADLINE)
    assert ran_at >= sent + 3 - EARLY, f"ran {ran_at - sent:.2f} s after sending, countdown 3 s"


def test_eta_not_before_its_time(worker):
    eta = datetime.now(timezone.utc) + timedelta(seconds=3)
    r = fwapp.stamp.apply_async(eta=eta)
    expect(r.id)
    ran_at = r.get(timeout=DEADLINE)
    assert ran_at >= eta.timestamp() - EARLY, f"ran {eta.timestamp() - ran_at:.2f} s before its ETA"


def test_group(worker):
    g = group(fwapp.add.s(i, i) for i in range(20)).apply_async()
    for r in g.results:
        expect(r.id)
    assert g.get(timeout=DEADLINE) == [2 * i for i in range(20)]


def test_chord(worker):
    header = [fwapp.add.s(i, i) for i in range(20)]
    r = chord(header)(fwapp.total.s())
    for child in r.parent.results:
        expect(child.id)
    assert r.get(timeout=DEADLINE) == sum(2 * i for i in range(20))
    expect(r.id)
    # After publishing the callback, the worker cleans the chord's state up (a script that
    # deletes its keys and leaves a "done" marker). A failed cleanup makes Celery mark the
    # callback as failed, so check both the cleanup and the callback's final state.
    prefix = f"celery-taskset-meta-{r.parent.id}"
    wait_until(lambda: db0().get(f"{prefix}.c") == b"done", "the chord's cleanup (done marker)")
    assert [db0().exists(f"{prefix}.{k}") for k in "jtsd"] == [0, 0, 0, 0]
    assert fwapp.app.AsyncResult(r.id).state == "SUCCESS"


def celery_cli(*args):
    cmd = [os.path.join(os.path.dirname(sys.executable), "celery"), "-A", "fwapp", *args]
    env = dict(os.environ, PYTHONPATH=HERE)
    return subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=DEADLINE)


def test_inspect_ping(worker):
    out = celery_cli("inspect", "ping", "-d", worker.name, "-t", "5", "-j")
    assert out.returncode == 0, out.stdout + out.stderr
    replies = json.loads(out.stdout.strip().splitlines()[-1])
    assert replies.get(worker.name) == {"ok": "pong"}, out.stdout


def test_inspect_active(worker):
    release = "fw:release:active"
    r = fwapp.wait_for.delay(release)
    expect(r.id)
    wait_until(lambda: db0().exists(f"fw:started:{r.id}"), "task to start")
    out = celery_cli("inspect", "active", "-d", worker.name, "-t", "5", "-j")
    assert out.returncode == 0, out.stdout + out.stderr
    replies = json.loads(out.stdout.strip().splitlines()[-1])
    active = replies.get(worker.name)
    assert active is not None, out.stdout
    assert [t["id"] for t in active] == [r.id], active
    assert active[0]["name"] == "fwapp.wait_for"
    db0().rpush(release, "go")
    assert r.get(timeout=DEADLINE) == "go"


def test_visibility_timeout_redelivery(worker):
    """An acks_late task whose worker dies mid-task comes back, after the visibility
    timeout, to another worker. Runs in database 1, with workers of its own."""
    env = {"FW_BROKER_DB": "1", "FW_VISIBILITY_TIMEOUT": "5"}
    app1 = Celery("fwapp", broker=f"{URL}/1", backend=f"{URL}/1")
    first = Worker("vt1", env, args=["-P", "solo"])
    second = None
    try:
        first.wait_ready()
        r = app1.send_task("fwapp.hang_first_time")
        expect(r.id, 2)
        wait_until(lambda: db0().exists(f"fw:started:{r.id}"), "first execution to start")
        first.kill()
        assert exec_count(r.id) == 1
        second = Worker("vt2", env, args=["-P", "solo"])
        out = r.get(timeout=DEADLINE + 30)
        assert out == "done on attempt 2", out
        assert exec_count(r.id) == 2
    except BaseException:
        print(first.tail())
        if second is not None:
            print(second.tail())
        raise
    finally:
        if second is not None:
            second.stop()
        first.stop()


def test_every_task_ran_as_often_as_expected(worker):
    """Last: the execution counters on the server match the expectations exactly."""
    client = db0()
    counts = {}
    for key in client.scan_iter(match="fw:exec:*", count=500):
        task_id = key.decode().split(":", 2)[2]
        counts[task_id] = int(client.get(key))
    missing = {t: n for t, n in EXPECTED.items() if counts.get(t) != n}
    extra = {t: n for t, n in counts.items() if t not in EXPECTED}
    assert not missing, f"tasks whose execution count is wrong: {missing} (server has {[counts.get(t) for t in missing]})"
    assert not extra, f"executions nobody expected: {extra}"
