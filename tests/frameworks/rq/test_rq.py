"""RQ against the server under test (FW_URL): jobs enqueued here, run by real `rq worker`
processes, end results checked.

Every job counts its executions in Redis (see jobs.py); each test states how many
executions it expects per job id, and the last test checks that the server holds exactly
those counts: nothing ran twice, nothing extra ran.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime, timedelta, timezone

import pytest
import redis
from rq import Queue, Retry
from rq.exceptions import DuplicateJobError
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.results import Result

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jobs  # noqa: E402

URL = os.environ["FW_URL"]
DEADLINE = 60  # seconds: the most any single wait may take
# RQ stores scheduled times in whole seconds (truncated), so a job may run up to a second
# before the exact time asked for; "not before its time" allows for that and a bit more.
EARLY = 1.5
RQ = os.path.join(os.path.dirname(sys.executable), "rq")

# job id -> number of executions the tests expect
EXPECTED = {}


def expect(job, runs=1):
    EXPECTED[job.id] = runs


@pytest.fixture(scope="module")
def conn():
    client = redis.Redis.from_url(URL)
    client.flushall()
    return client


def exec_count(conn, job):
    value = conn.get(f"fw:exec:{job.id}")
    return int(value) if value is not None else 0


def wait_until(predicate, what, deadline=DEADLINE, step=0.1):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"gave up after {deadline} s waiting for {what}")


def worker_env():
    return dict(os.environ, PYTHONPATH=HERE)


def burst(*queues):
    """Runs `rq worker --burst` on the queues until it has emptied them and exits."""
    out = subprocess.run(
        [RQ, "worker", "--burst", "--url", URL, *queues],
        cwd=HERE, env=worker_env(), capture_output=True, text=True, timeout=3 * DEADLINE,
    )
    assert out.returncode == 0, f"rq worker --burst exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def status(job):
    return job.get_status(refresh=True)


class LongWorker:
    """A long-running `rq worker --with-scheduler`, stopped with SIGTERM (warm shutdown)."""

    def __init__(self, name, *queues):
        self.log = tempfile.NamedTemporaryFile(prefix=f"fw-rq-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [RQ, "worker", "--with-scheduler", "--url", URL, "-n", name, *queues],
            cwd=HERE, env=worker_env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def tail(self, lines=40):
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def wait_done(self, job, what):
        """Waits until ``job`` finished or failed; gives up at once if the worker died."""

        def done():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}) before {what}:\n{self.tail()}")
            return status(job) in (JobStatus.FINISHED, JobStatus.FAILED)

        wait_until(done, f"{what}; worker log:\n{self.tail()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=DEADLINE)


@pytest.fixture(scope="module")
def scheduler_worker(conn):
    w = LongWorker("fw-scheduler", "sched")
    try:
        yield w
    finally:
        w.stop()
        if os.environ.get("FW_VERBOSE"):
            print(w.tail(200))


def test_enqueue_and_results(conn):
    q = Queue("basic", connection=conn)
    enqueued = [q.enqueue(jobs.add, i, 1000) for i in range(100)]
    for job in enqueued:
        expect(job)
    assert q.count == 100
    burst("basic")
    assert q.count == 0
    for i, job in enumerate(enqueued):
        assert status(job) == JobStatus.FINISHED
        assert job.return_value(refresh=True) == i + 1000
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert Job.fetch(job.id, connection=conn).result == i + 1000
        assert exec_count(conn, job) == 1


def test_failure_goes_to_failed_registry(conn):
    q = Queue("failing", connection=conn)
    ok = q.enqueue(jobs.add, 1, 2)
    bad = q.enqueue(jobs.fail, "boom")
    expect(ok)
    expect(bad)
    burst("failing")
    assert status(ok) == JobStatus.FINISHED
    assert status(bad) == JobStatus.FAILED
    registry = FailedJobRegistry(queue=q)
    assert registry.get_job_ids() == [bad.id]
    result = bad.latest_result()
    assert result.type == Result.Type.FAILED
    assert "ValueError: boom" in result.exc_string
    assert bad.return_value(refresh=True) is None
    for job in (ok, bad):
        assert exec_count(conn, job) == 1


def test_requeue_failed_with_cli(conn):
    """A failed job requeued from the FailedJobRegistry (`rq requeue`) runs again."""
    q = Queue("requeue", connection=conn)
    job = q.enqueue(jobs.flaky, 1)
    expect(job, 2)
    burst("requeue")
    assert status(job) == JobStatus.FAILED
    assert FailedJobRegistry(queue=q).get_job_ids() == [job.id]
    out = subprocess.run(
        [RQ, "requeue", "--url", URL, "--queue", "requeue", "--all"],
        cwd=HERE, env=worker_env(), capture_output=True, text=True, timeout=DEADLINE,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert FailedJobRegistry(queue=q).get_job_ids() == []
    assert q.job_ids == [job.id]
    burst("requeue")
    assert status(job) == JobStatus.FINISHED
    assert job.return_value(refresh=True) == 2
    assert exec_count(conn, job) == 2


def test_retry_then_success(conn):
    q = Queue("retry", connection=conn)
    job = q.enqueue(jobs.flaky, 2, retry=Retry(max=3))
    expect(job, 3)
    burst("retry")
    assert status(job) == JobStatus.FINISHED
    assert job.return_value(refresh=True) == 3
    assert exec_count(conn, job) == 3
    assert FailedJobRegistry(queue=q).get_job_ids() == []


def test_retries_exhausted(conn):
    q = Queue("retry-out", connection=conn)
    job = q.enqueue(jobs.flaky, 100, retry=Retry(max=2))
    expect(job, 3)
    burst("retry-out")
    assert status(job) == JobStatus.FAILED
    assert exec_count(conn, job) == 3  # the first run and two retries
    assert FailedJobRegistry(queue=q).get_job_ids() == [job.id]


def test_dependencies(conn):
    q = Queue("deps", connection=conn)
    order = "fw:order:deps"
    a = q.enqueue(jobs.step, "a", order)
    b = q.enqueue(jobs.step, "b", order, [a.id], depends_on=a)
    c = q.enqueue(jobs.step, "c", order, [a.id, b.id], depends_on=[a, b])
    assert status(b) == JobStatus.DEFERRED
    assert status(c) == JobStatus.DEFERRED
    # a dependent of a job that fails never runs
    bad = q.enqueue(jobs.fail, "parent fails")
    orphan = q.enqueue(jobs.step, "orphan", order, [bad.id], depends_on=bad)
    for job in (a, b, c, bad):
        expect(job)
    burst("deps")
    assert [x.decode() for x in conn.lrange(order, 0, -1)] == ["a", "b", "c"]
    assert b.return_value(refresh=True) == ["finished"]
    assert c.return_value(refresh=True) == ["finished", "finished"]
    assert status(bad) == JobStatus.FAILED
    assert status(orphan) == JobStatus.DEFERRED
    assert exec_count(conn, orphan) == 0
    for job in (a, b, c, bad):
        assert exec_count(conn, job) == 1


def test_unique_enqueue(conn):
    """unique=True (a Lua script in RQ): a second job with the same id is refused."""
    q = Queue("unique", connection=conn)
    job = q.enqueue(jobs.add, 20, 22, job_id="fw-unique", unique=True)
    expect(job)
    with pytest.raises(DuplicateJobError):
        q.enqueue(jobs.add, 1, 1, job_id="fw-unique", unique=True)
    assert q.count == 1
    burst("unique")
    assert job.return_value(refresh=True) == 42
    assert exec_count(conn, job) == 1


def test_empty_queue(conn):
    """Queue.empty() (a Lua script in RQ that pops every job and deletes its keys)."""
    q = Queue("to-empty", connection=conn)
    queued = [q.enqueue(jobs.add, i, i) for i in range(5)]
    assert q.empty() == 5
    assert q.count == 0
    assert [Job.exists(job.id, connection=conn) for job in queued] == [False] * 5


def test_enqueue_in(conn, scheduler_worker):
    q = Queue("sched", connection=conn)
    sent = time.time()
    job = q.enqueue_in(timedelta(seconds=3), jobs.stamp)
    expect(job)
    assert status(job) == JobStatus.SCHEDULED
    scheduler_worker.wait_done(job, "scheduled job to run")
    assert status(job) == JobStatus.FINISHED
    ran_at = job.return_value(refresh=True)
    assert ran_at >= sent + 3 - EARLY, f"ran {ran_at - sent:.2f} s after enqueue_in 3 s"


def test_enqueue_at(conn, scheduler_worker):
    q = Queue("sched", connection=conn)
    when = datetime.now(timezone.utc) + timedelta(seconds=3)
    job = q.enqueue_at(when, jobs.stamp)
    expect(job)
    assert status(job) == JobStatus.SCHEDULED
    scheduler_worker.wait_done(job, "scheduled job to run")
    assert status(job) == JobStatus.FINISHED
    ran_at = job.return_value(refresh=True)
    assert ran_at >= when.timestamp() - EARLY, f"ran {when.timestamp() - ran_at:.2f} s early"


def test_retry_with_interval(conn, scheduler_worker):
    """Retries with an interval go through the scheduled-job registry and the scheduler."""
    q = Queue("sched", connection=conn)
    job = q.enqueue(jobs.flaky, 2, retry=Retry(max=3, interval=1))
    expect(job, 3)
    scheduler_worker.wait_done(job, "retried job to finish")
    assert status(job) == JobStatus.FINISHED
    assert job.return_value(refresh=True) == 3
    assert exec_count(conn, job) == 3


def test_every_job_ran_as_often_as_expected(conn, scheduler_worker):
    """Last: the execution counters on the server match the expectations exactly."""
    scheduler_worker.stop()
    assert scheduler_worker.proc.returncode == 0, scheduler_worker.tail()
    counts = {}
    for key in conn.scan_iter(match="fw:exec:*", count=500):
        counts[key.decode().split(":", 2)[2]] = int(conn.get(key))
    wrong = {j: (n, counts.get(j)) for j, n in EXPECTED.items() if counts.get(j) != n}
    extra = {j: n for j, n in counts.items() if j not in EXPECTED}
    assert not wrong, f"jobs whose execution count is wrong (expected, server): {wrong}"
    assert not extra, f"executions nobody expected: {extra}"
