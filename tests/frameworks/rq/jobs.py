"""Job functions the suite's `rq worker` processes run.

Every job counts its executions in Redis (``INCR fw:exec:<job id>``), so the tests can
check that each one ran exactly as many times as it should.
"""

import os
import time

import redis
from rq import get_current_job
from rq.job import Job

URL = os.environ["FW_URL"]


def _client():
    return redis.Redis.from_url(URL)


def record():
    """Counts one execution of the current job and returns the count so far."""
    job = get_current_job()
    return _client().incr(f"fw:exec:{job.id}")


def add(x, y):
    record()
    return x + y


def fail(message):
    record()
    raise ValueError(message)


def flaky(failures):
    """Fails on its first ``failures`` executions, then returns the attempt number."""
    attempt = record()
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} fails")
    return attempt


def stamp():
    """Returns the wall-clock time at which it ran."""
    record()
    return time.time()


def step(name, order_key, parents=()):
    """Appends ``name`` to the list ``order_key`` and returns the statuses its parent jobs
    had when it started (each must already be finished)."""
    record()
    client = _client()
    statuses = [Job.fetch(p, connection=client).get_status().value for p in parents]
    client.rpush(order_key, name)
    return statuses
