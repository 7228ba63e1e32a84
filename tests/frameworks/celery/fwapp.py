"""The Celery application the suite's workers run (``celery -A fwapp worker``).

Broker and result backend are both the server under test (``FW_URL``). Every task counts
its executions in Redis (``INCR fw:exec:<task id>`` in database 0), so the tests can check
that each one ran exactly as many times as it should. ``FW_BROKER_DB`` selects the
database used as broker and backend, so that the redelivery test runs in a keyspace of
its own; ``FW_VISIBILITY_TIMEOUT`` sets the broker's visibility timeout.
"""

import os
import time

import redis
from celery import Celery

URL = os.environ["FW_URL"]
BROKER_DB = int(os.environ.get("FW_BROKER_DB", "0"))
BROKER_URL = f"{URL}/{BROKER_DB}"

app = Celery("fwapp", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=600,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": int(os.environ.get("FW_VISIBILITY_TIMEOUT", "3600")),
        # Look for overdue unacknowledged messages every second, not every 100 s.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)

_recorder = None


def recorder():
    """A connection to database 0 of the server, where executions are counted."""
    global _recorder
    if _recorder is None:
        _recorder = redis.Redis.from_url(f"{URL}/0")
    return _recorder


def record(task):
    """Counts one execution of ``task``'s id and returns the count so far."""
    return recorder().incr(f"fw:exec:{task.request.id}")


@app.task(bind=True)
def add(self, x, y):
    record(self)
    return x + y


@app.task(bind=True)
def total(self, values):
    record(self)
    return sum(values)


@app.task(bind=True)
def stamp(self):
    """Returns the wall-clock time at which it ran."""
    record(self)
    return time.time()


@app.task(bind=True)
def flaky(self, failures, limit=10):
    """Fails ``failures`` times, retrying itself each time (at most ``limit`` retries),
    then succeeds."""
    attempt = record(self)
    if attempt <= failures:
        raise self.retry(countdown=0.2, max_retries=limit, exc=RuntimeError(f"attempt {attempt} fails"))
    return {"attempt": attempt, "retries": self.request.retries}


@app.task(bind=True)
def wait_for(self, key, timeout=60):
    """Blocks until something is pushed to ``key`` (BLPOP), then returns it."""
    record(self)
    recorder().set(f"fw:started:{self.request.id}", "1")
    popped = recorder().blpop([key], timeout=timeout)
    return popped[1].decode() if popped else None


@app.task(bind=True, acks_late=True)
def hang_first_time(self):
    """Acknowledged only when done. The first execution announces itself and then
    hangs (the test kills its worker); a later execution returns at once."""
    attempt = record(self)
    if attempt == 1:
        recorder().set(f"fw:started:{self.request.id}", "1")
        time.sleep(300)
    return f"done on attempt {attempt}"
