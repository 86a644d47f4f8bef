"""Shared fixtures: one real local Ray session per pytest session, a private data cache."""

import copy
import os
from pathlib import Path

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


#: A real but tiny search space: 1,024 real Rotten Tomatoes sentences, models of a few
#: thousand parameters, 2 epochs. Tests copy it and change what they need.
TINY_SPACE = {
    "name": "tiny",
    "task": "classification",
    "dataset": {"name": "rotten_tomatoes_sentences", "vocab_size": 1000, "max_len": 32,
                "max_train_samples": 1024},
    "objectives": [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}],
    "constraints": {"params_trainable": {"max": 400000}},
    "budget": {"trials": 3, "max_concurrent": 2, "epochs": 2, "batch_size": 64,
               "scheduler": "none", "cpus_per_trial": 1},
    "params": {
        "n_layers": {"type": "int", "low": 1, "high": 2},
        "d_model": {"type": "categorical", "choices": [16, 32]},
        "n_heads": {"type": "categorical", "choices": [2]},
        "lr": {"type": "float", "low": 1e-3, "high": 3e-3, "log": True},
    },
}


def tiny_space_file(directory: Path, name: str = "tiny.yaml", **changes) -> Path:
    """Write :data:`TINY_SPACE` with top-level ``changes`` applied to ``directory/name``."""
    import yaml

    spec = copy.deepcopy(TINY_SPACE)
    spec.update(changes)
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(spec))
    return path
