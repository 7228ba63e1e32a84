"""Fixtures for tests/sentinel: servers and clusters the tests start, stopped at the end;
when a test fails, their logs, INFO replication and configuration files are printed (and
the working directory is kept; SENTINEL_KEEP=1 keeps it always)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from cluster import Cluster  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.stash[_FAILED] = rep.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def make_cluster(request):
    """make_cluster(name, threads=(4, 1, 2)): a started Cluster (master, two replicas, three
    Sentinels)."""
    made = []

    def make(name, **kw):
        c = Cluster(name, **kw)
        made.append(c)
        c.start()
        return c

    yield make
    failed = request.node.stash.get(_FAILED, True)
    for c in made:
        try:
            # The timeline, shown for a passing test with `pytest -rP` (or -s).
            print("\n".join(f"  {t:7.2f} s  {w}" for t, w in c.events))
            if failed:
                sys.stderr.write(c.report() + "\n")
                sys.stderr.write(f"(working directory kept: {c.work})\n")
        finally:
            c.close(keep=failed or bool(os.environ.get("SENTINEL_KEEP")))


@pytest.fixture
def reporters(request):
    """A list the test appends objects with report() and close(keep) to (servers of the
    migration test): reported when the test fails, closed at the end."""
    items = []
    yield items
    failed = request.node.stash.get(_FAILED, True)
    for it in items:
        try:
            print("\n".join(f"  {t:7.2f} s  {w}" for t, w in getattr(it, "events", [])))
            if failed:
                sys.stderr.write(it.report() + "\n")
                sys.stderr.write(f"(working directory kept: {it.work})\n")
        finally:
            it.close(keep=failed or bool(os.environ.get("SENTINEL_KEEP")))
