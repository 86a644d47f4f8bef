"""constraints.txt, the lock a fresh clone installs (scripts/run.sh), agrees with pyproject.toml:
every dependency is pinned (torch excepted: TORCH_SPEC picks its build) at a version its bounds
allow, and the environment the tests run in is the locked one (CI installs with the lock)."""

import os
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml with tomllib")


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [ln.split("==") for ln in lines if ln.strip() and not ln.startswith("#")]
    return {canonicalize_name(name): version for name, version in pins}


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]


def test_every_dependency_is_pinned_within_its_bounds():
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "torch":
            assert name not in pins  # TORCH_SPEC decides the build
            continue
        assert name in pins, f"{req.name} is not in constraints.txt: run bash scripts/run.sh lock"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), \
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"


@pytest.mark.skipif(os.environ.get("LOCK", "constraints.txt") == "none" or not os.environ.get("CI_LOCKED"),
                    reason="the installed versions are checked where scripts/run.sh installed with the lock "
                           "(CI_LOCKED=1, set by .ci/run)")
def test_the_environment_is_the_locked_one():
    pins = _pins()
    wrong = {}
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name in pins and metadata.version(req.name) != pins[name]:
            wrong[req.name] = (metadata.version(req.name), pins[name])
    assert not wrong, f"installed vs locked: {wrong}"
