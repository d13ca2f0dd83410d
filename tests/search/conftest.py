"""The search tests' fixtures (their space file lives in searchkit.py)."""
import os

import pytest


@pytest.fixture(scope="session")
def _ray_for_session():
    """Shuts the session's local Ray down at the end (whichever test started it last)."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_local(_ray_for_session):
    """One local Ray shared by the tests: the search leaves an already-started Ray running.

    Started again when a test between them shut it down (the multi-node cluster tests free
    the cores for their own nodes): without it each search would start and stop a Ray of
    its own, several seconds each.
    """
    ray = _ray_for_session
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    return ray
