"""Fixtures for tests/cluster: clusters the tests start, stopped at the end; when a test
fails, each node's log, CLUSTER INFO and CLUSTER NODES and the timeline are printed and the
working directory is kept (CLUSTER_KEEP=1 keeps it always)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from clusterlib import Cluster  # noqa: E402

_FAILED = pytest.StashKey[bool]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "failover: kills a master with SIGKILL and waits for its replica's promotion "
        "(deselect with -m 'not failover')")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.stash[_FAILED] = rep.failed


@pytest.fixture
def make_cluster(request):
    """make_cluster(name): an empty Cluster; add nodes with .add(kind)."""
    made = []

    def make(name):
        c = Cluster(name)
        made.append(c)
        return c

    yield make
    failed = request.node.stash.get(_FAILED, True)
    for c in made:
        try:
            print("\n".join(f"  {t:7.2f} s  {w}" for t, w in c.events))
            if failed:
                sys.stderr.write(c.report() + "\n")
                sys.stderr.write(f"(working directory kept: {c.work})\n")
        finally:
            c.close(keep=failed or bool(os.environ.get("CLUSTER_KEEP")))
