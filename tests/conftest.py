"""Shared fixtures: one real local Ray session per pytest session, a private data cache."""

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance (2 CPUs, no dashboard), shared by every test that needs it."""
    import ray

    from archsearch.tune.runner import init_ray

    init_ray(None, num_cpus=2, dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A data cache private to this test session (tokenizers and tokenized tensors)."""
    d = tmp_path_factory.mktemp("archsearch-cache")
    old = os.environ.get("ARCHSEARCH_CACHE")
    os.environ["ARCHSEARCH_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("ARCHSEARCH_CACHE", None)
    else:
        os.environ["ARCHSEARCH_CACHE"] = old
