"""Shared fixtures and helpers, and the rules of the two test tiers.

Markers (declared in ``pyproject.toml``)::

    ray   the test starts Ray: in this process (``ray_session``) or in a subprocess
    slow  the test trains a real model for more than a few seconds, or runs a search in a
          subprocess (every subprocess that starts Ray counts as one)

``bash scripts/run.sh test`` runs everything; ``bash scripts/run.sh test -m "not slow"`` is the
quick tier (under 3 minutes on a 2-core machine).

The markers are kept honest here, not by memory:

* a test that uses ``ray_session`` (directly or through a fixture such as ``tiny_run``) is
  marked ``ray`` at collection, so ``-m "not ray"`` deselects it;
* every pytest session gets its own ``RAY_TMPDIR`` (subprocesses inherit it), so each Ray
  session a test starts shows up there as ``session_<date>_<pid of the starter>``. A test
  that starts one without the ``ray`` marker fails, and so does a test whose *subprocess*
  starts one without the ``slow`` marker. The private directory also keeps a test run off
  the Ray sessions of anything else on the machine; it is removed unless a test failed.
* the terminal summary lists tests that took more than ``SLOW_AUDIT_S`` seconds without
  the ``slow`` marker (a hint, not a failure: timings depend on the machine's load).

Helpers that import ``archsearch`` do it inside the function, so that collecting the tests
imports no heavy library.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ROOT = Path(__file__).resolve().parents[1]

#: Tests over this many seconds (setup + call) without ``slow`` are listed in the summary.
SLOW_AUDIT_S = 15.0

# Hypothesis profiles (tests/test_fuzz.py): ``quick`` (the default: few examples, the same ones
# every run) keeps the quick tier fast; ``long`` is what the slow tier's fuzz tests run (>= 2,000
# cases in all, new ones each run). ``HYPOTHESIS_PROFILE=long`` makes every test use it. No
# example database: nothing is written into the checkout.
try:
    from hypothesis import HealthCheck, settings as _hypothesis_settings

    _hypothesis_settings.register_profile(
        "quick", max_examples=40, deadline=None, database=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    _hypothesis_settings.register_profile(
        "long", max_examples=1000, deadline=None, database=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
except ImportError:  # hypothesis is a test extra; test_fuzz.py says so if it is missing
    pass


# ------------------------------------------------------------------------------------------
# marker rules
# ------------------------------------------------------------------------------------------

_sessions_before = pytest.StashKey[set]()
_reported = pytest.StashKey[bool]()
_unmarked_durations: dict[str, float] = {}
_state: dict = {}


def _ray_root() -> Path:
    return Path(os.environ["RAY_TMPDIR"]) / "ray"


def _ray_sessions() -> set[str]:
    """Names of the Ray sessions started so far under this pytest session's RAY_TMPDIR."""
    try:
        names = os.listdir(_ray_root())
    except OSError:
        return set()
    return {n for n in names if n.startswith("session_") and n != "session_latest"}


def pytest_configure(config):
    # Short path under /tmp: Ray's unix sockets live below it (107-byte limit).
    private = tempfile.mkdtemp(prefix="aspt-", dir=os.environ.get("RAY_TMPDIR") or "/tmp")
    _state["ray_tmpdir"], _state["old_ray_tmpdir"] = private, os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = private
    try:  # Hypothesis' own files (constants, unicode tables) there too, not in the checkout
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(Path(private) / "hypothesis")
    except ImportError:
        pass


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    _state["exitstatus"] = exitstatus


def pytest_unconfigure(config):
    private = _state.pop("ray_tmpdir", None)
    if private is None:
        return
    old = _state.pop("old_ray_tmpdir", None)
    if old is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = old
    if _state.get("exitstatus", 1) == 0 or not (Path(private) / "ray").exists():
        shutil.rmtree(private, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark ``ray`` every test whose fixtures (transitively) include ``ray_session``; runs
    before ``-m`` deselects."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()) and item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_sessions_before] = _ray_sessions()


def marker_violation(item, new_sessions: set[str]) -> str | None:
    """Why a test that started the Ray sessions ``new_sessions`` breaks the marker rule."""
    if not new_sessions:
        return None
    by_subprocess = sorted(s for s in new_sessions if s.rsplit("_", 1)[-1] != str(os.getpid()))
    if item.get_closest_marker("ray") is None:
        return (f"{item.nodeid} started Ray ({', '.join(sorted(new_sessions))}) but is not "
                "marked `ray`: add @pytest.mark.ray (tests/conftest.py explains the markers)")
    if by_subprocess and item.get_closest_marker("slow") is None:
        return (f"{item.nodeid}: a subprocess started Ray ({', '.join(by_subprocess)}), i.e. "
                "a search in a subprocess, but the test is not marked `slow`: add "
                "@pytest.mark.slow (tests/conftest.py explains the markers)")
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.when == "setup" and rep.passed:
        return  # judged with the call, which includes what the fixtures started
    if item.stash.get(_reported, False) or _sessions_before not in item.stash:
        return
    why = marker_violation(item, _ray_sessions() - item.stash[_sessions_before])
    if why is None:
        return
    item.stash[_reported] = True
    if rep.failed:
        rep.sections.append(("marker rule", why))
    else:
        rep.outcome, rep.longrepr = "failed", why


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call") and "slow" not in report.keywords:
        _unmarked_durations[report.nodeid] = _unmarked_durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    slow = sorted(((d, n) for n, d in _unmarked_durations.items() if d > SLOW_AUDIT_S), reverse=True)
    if slow:
        terminalreporter.section(f"over {SLOW_AUDIT_S:.0f} s without @pytest.mark.slow")
        for d, n in slow:
            terminalreporter.line(f"{d:7.1f} s  {n}")
    if _state.get("exitstatus", 0) != 0 and _ray_root().exists():
        terminalreporter.line(f"Ray logs of this test session (kept): {_ray_root()}")


# ------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------
# device
# ------------------------------------------------------------------------------------------

#: Where the model tests run: ``ARCHSEARCH_TEST_DEVICE`` (``cpu`` by default; ``cuda`` on a GPU
#: machine: ``ARCHSEARCH_TEST_DEVICE=cuda pytest -m "not ray"``).
TEST_DEVICE = os.environ.get("ARCHSEARCH_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def device():
    """The ``torch.device`` every test that builds a model or a ``TrialLoop`` runs on (the
    ``device`` setting of :class:`archsearch.tune.trainable.TrialLoop`); a CUDA device asked for
    where there is none fails the session's first such test, never silently falls back."""
    import torch

    dev = torch.device(TEST_DEVICE)
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"ARCHSEARCH_TEST_DEVICE={TEST_DEVICE}: no CUDA device here")
    return dev


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance (2 CPUs, no dashboard), shared by every test that needs it.
    Using it marks the test ``ray``."""
    import ray

    from archsearch.tune.ray_session import init_ray

    init_ray(None, num_cpus=2, dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A data cache private to this test session (tokenizers and tokenized tensors);
    ``ARCHSEARCH_CACHE`` points at it, so subprocesses use it too."""
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


def tiny_space(directory: Path, **changes):
    """:data:`TINY_SPACE` with ``changes``, written to ``directory`` and loaded (a
    ``SearchSpace``)."""
    from archsearch.space import load_space

    return load_space(tiny_space_file(directory, **changes))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, ray_session, cache_dir):
    """One real tiny search of :data:`TINY_SPACE` (random searcher, 3 trials x 2 epochs on
    1,024 real sentences, report written), run once per session for every test that reads
    a completed run. The ``RunResult``: ``run_dir``, ``report_dir``, ``summary``."""
    from archsearch.tune.runner import run_search

    tmp = tmp_path_factory.mktemp("tiny-run")
    return run_search(tiny_space(tmp), searcher="random", name="tiny-run", storage=tmp / "runs",
                      reports=tmp / "reports", progress=False)


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def sentence_subsets(**rows: int):
    """Rotten Tomatoes sentences (BPE, vocabulary 1000, ``max_len`` 32: the real data of the tiny
    model tests) with each named split cut to its first ``rows[split]`` rows, e.g.
    ``sentence_subsets(train=512, validation=192)``; other splits whole. Call it from a
    fixture that uses ``cache_dir``."""
    import dataclasses

    from archsearch.data import prepare

    data = prepare("rotten_tomatoes_sentences", vocab_size=1000, max_len=32)
    parts = dict(data.data)
    for split, n in rows.items():
        s = data[split]
        assert len(s) >= n, (split, len(s), n)
        parts[split] = dataclasses.replace(s, input_ids=s.input_ids[:n], attention_mask=s.attention_mask[:n],
                                           labels=s.labels[:n])
    return dataclasses.replace(data, data=parts)


def load_benchmark(name: str):
    """A benchmark module: ``load_benchmark("depth.dht_seeded")`` is ``benchmarks.depth.dht_seeded``
    (a question's runner, ``benchmarks/<question>/<runner>.py``; benchmarks/ is a package)."""
    import importlib

    return importlib.import_module(f"benchmarks.{name}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_command(*args: str) -> list[str]:
    """argv running the ``archsearch`` CLI with this interpreter: ``python -m archsearch.cli``."""
    return [sys.executable, "-m", "archsearch.cli", *map(str, args)]


def run_cli(*args, cwd: Path | None = None, env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI to completion; output captured as text (``proc.stdout``, ``proc.stderr``).
    A search run this way starts Ray in a subprocess: mark the test ``ray`` and ``slow``."""
    return subprocess.run(cli_command(*args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
