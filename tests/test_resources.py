"""One trial's resources against the cluster's, before any trial starts (issue 40).

* A fixed cluster (the local Ray, or ``--address`` without an autoscaler) that no node of which
  can hold one trial: one line naming ``budget.cpus_per_trial`` / ``gpus_per_trial`` (or the
  command-line option) and what the cluster has, exit code 2, no run directory.
* An autoscaling cluster: a warning, and a trial that waits longer than
  ``budget.pending_timeout_s`` for resources no node has stops the search with one line.
* ``archsearch check`` makes the same check against this machine without starting Ray.
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import TINY_SPACE, run_cli, tiny_space, tiny_space_file

NODE = {"CPU": 2.0, "memory": 4 * 2**30}


def _space(tmp_path, **budget):
    return tiny_space(tmp_path, budget={**TINY_SPACE["budget"], **budget})


# ------------------------------------------------------------------------------------------
# the check itself (no Ray)
# ------------------------------------------------------------------------------------------


def test_a_request_no_node_has_is_one_line_naming_the_field(tmp_path):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_resources

    space = _space(tmp_path, cpus_per_trial=1e9)
    with pytest.raises(UserError) as e:
        check_resources(space, [NODE], autoscaling=False, local=True)
    line = e.value.one_line()
    assert line.startswith(f"{space.source}: budget.cpus_per_trial: a trial asks for 1e+09 CPUs")
    assert "this machine's local Ray has 2 CPUs, 0 GPUs, 4 GiB of memory" in line
    assert "\n" not in line

    # set on the command line: the option is named
    with pytest.raises(UserError) as e:
        check_resources(space, [NODE], autoscaling=False, overridden=("cpus_per_trial",))
    assert e.value.one_line().startswith("--cpus-per-trial: a trial asks for 1e+09 CPUs")

    gpu = _space(tmp_path, gpus_per_trial=1)
    with pytest.raises(UserError) as e:
        check_resources(gpu, [NODE], autoscaling=False)
    assert e.value.field == "budget.gpus_per_trial"
    assert "0 GPUs" in e.value.message and "set budget.gpus_per_trial: 0" in e.value.message


def test_a_trial_must_fit_on_one_node_not_in_the_sum(tmp_path):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_resources

    space = _space(tmp_path, cpus_per_trial=3, memory_per_trial_gb=1)
    nodes = [NODE, {"CPU": 2.0, "GPU": 1.0, "memory": 2**30}]
    with pytest.raises(UserError) as e:  # 4 CPUs in all, 2 per node
        check_resources(space, nodes, autoscaling=False)
    assert e.value.field == "budget.cpus_per_trial"
    assert "no node has that (the Ray cluster has 4 CPUs, 1 GPU, 5 GiB of memory on 2 nodes, " \
           "at most 2 CPUs, 1 GPU, 4 GiB of memory per node)" in e.value.message
    assert check_resources(_space(tmp_path, cpus_per_trial=2, gpus_per_trial=1), nodes,
                           autoscaling=False) is None
    big_memory = _space(tmp_path, memory_per_trial_gb=8)
    with pytest.raises(UserError) as e:
        check_resources(big_memory, nodes, autoscaling=False)
    assert e.value.field == "budget.memory_per_trial_gb"


def test_an_autoscaling_cluster_gets_a_warning_not_an_error(tmp_path):
    from archsearch.tune.preflight import check_resources

    space = _space(tmp_path, cpus_per_trial=16, pending_timeout_s=120)
    warning = check_resources(space, [{"CPU": 0.0}], autoscaling=True)
    assert warning.startswith(f"warning: {space.source}: budget.cpus_per_trial: a trial asks for 16 CPUs")
    assert "budget.pending_timeout_s (120 s)" in warning


@pytest.mark.parametrize("budget, says", [
    ({"cpus_per_trial": float("inf")}, "budget.cpus_per_trial: Input should be a finite number"),
    ({"gpus_per_trial": float("nan")}, "budget.gpus_per_trial: Input should be a finite number"),
    ({"pending_timeout_s": 0}, "budget.pending_timeout_s: Input should be greater than 0"),
    ({"memory_per_trial_gb": -1}, "budget.memory_per_trial_gb: Input should be greater than 0"),
])
def test_resource_fields_are_finite_and_positive(tmp_path, budget, says):
    from archsearch.errors import UserError

    with pytest.raises(UserError) as e:
        _space(tmp_path, **budget)
    assert says in e.value.one_line()


def test_check_command_refuses_what_this_machine_lacks_without_ray(tmp_path, cache_dir):
    """``archsearch check`` (a subprocess: the real CLI) never starts Ray (the marker rules in
    conftest would fail this unmarked test if it did)."""
    space = tiny_space_file(tmp_path, budget={**TINY_SPACE["budget"], "cpus_per_trial": 1e9})
    t0 = time.time()
    proc = run_cli("check", space, timeout=120, cwd=tmp_path)
    assert time.time() - t0 < 30
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {space}: budget.cpus_per_trial: a trial asks for 1e+09 CPUs, "
                               f"but this machine's local Ray has {os.cpu_count()} CPUs")
    ok = run_cli("check", tiny_space_file(tmp_path, "ok.yaml"), timeout=120, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert ok.stdout.startswith(f"ok: {tmp_path / 'ok.yaml'}: classification on rotten_tomatoes_sentences")
    assert sorted(os.listdir(tmp_path)) == ["ok.yaml", "tiny.yaml"]  # nothing written


# ------------------------------------------------------------------------------------------
# on a real (local) Ray
# ------------------------------------------------------------------------------------------


def _search_refused(space, tmp_path, **kw):
    from archsearch.errors import UserError
    from archsearch.tune.runner import run_search

    t0 = time.time()
    with pytest.raises(UserError) as e:
        run_search(space, searcher="random", name="refused", storage=tmp_path / "runs",
                   reports=tmp_path / "reports", progress=False, **kw)
    took = time.time() - t0
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reports").exists()
    return e.value, took


def test_impossible_cpus_on_local_ray_exit_at_once(ray_session, tmp_path, cache_dir):
    have = ray_session.cluster_resources()
    err, took = _search_refused(_space(tmp_path, cpus_per_trial=1e9), tmp_path)
    assert took < 10, took
    assert err.field == "budget.cpus_per_trial" and err.file.endswith("tiny.yaml")
    assert f"has {have['CPU']:g} CPUs" in err.message, err.message
    err, _ = _search_refused(_space(tmp_path), tmp_path, cpus_per_trial=64)
    assert err.one_line().startswith("--cpus-per-trial: a trial asks for 64 CPUs")


def test_gpus_on_local_ray_without_them(ray_session, tmp_path, cache_dir):
    gpus = ray_session.cluster_resources().get("GPU", 0)
    err, took = _search_refused(_space(tmp_path, gpus_per_trial=gpus + 1), tmp_path)
    assert took < 10, took
    assert err.field == "budget.gpus_per_trial"
    assert f"{gpus:g} GPU" in err.message, err.message


def test_a_trial_pending_too_long_stops_the_search(ray_session, tmp_path, cache_dir, monkeypatch, capsys):
    """On an autoscaling cluster (here: the local 2-CPU Ray, said to autoscale) a trial asking
    for 3 CPUs only gets a warning before launch; after ``pending_timeout_s`` (2 s) without a
    node that fits, the search stops with one line naming the field, and its run directory
    and report are written."""
    import archsearch.tune.ray_session as rs
    from archsearch.errors import UserError
    from archsearch.runs import RunDir
    from archsearch.tune.runner import start_run, _fit

    monkeypatch.setattr(rs, "cluster_autoscales", lambda address: True)
    space = _space(tmp_path, cpus_per_trial=3, pending_timeout_s=2, trials=2)
    t0 = time.time()
    launch = start_run(space, searcher="random", name="stuck", storage=tmp_path / "runs",
                       address=None, ray=True)
    assert "warning:" in capsys.readouterr().err
    with pytest.raises(UserError) as e:
        _fit(launch, progress=False, ray_dashboard=False, restore=False, reports=tmp_path / "reports")
    took = time.time() - t0
    assert took < 60, took
    line = e.value.one_line()
    assert e.value.field == "budget.cpus_per_trial", line
    assert "(budget.pending_timeout_s) for 3 CPUs" in line and "no node of the cluster has that" in line
    assert RunDir(tmp_path / "runs" / "stuck").read_spec().wall_seconds is not None
    assert (tmp_path / "reports" / "stuck" / "index.html").is_file()


def test_impossible_resources_cli_exits_within_10_s(tmp_path, cache_dir):
    """The real CLI, as a user runs it: a local search whose trial asks for more CPUs than the
    machine has is one line and exit code 2 within 10 s. Ray is not even started (checked
    against Ray's own view of this machine first; the marker rules of conftest would fail
    this unmarked test if a Ray session appeared)."""
    space = tiny_space_file(tmp_path, budget={**TINY_SPACE["budget"], "cpus_per_trial": 1e9})
    run_cli("check", tiny_space_file(tmp_path, "warm.yaml"), timeout=120)  # data cached
    t0 = time.time()
    proc = run_cli("search", space, "--no-progress", "--no-ray-dashboard", "--storage",
                   tmp_path / "runs", "--reports", tmp_path / "reports", cwd=tmp_path, timeout=120)
    took = time.time() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {space}: budget.cpus_per_trial: a trial asks for 1e+09 CPUs")
    assert took < 10, took
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("preset", [None, "token"])
def test_token_auth_is_turned_off_for_local_ray_only(monkeypatch, preset):
    """A local Ray starts with ``RAY_AUTH_MODE=disabled`` (docs/design.md) unless the user set a
    mode; for a cluster at ``--address`` nothing is forced: forced off, a search could not
    connect to a cluster that requires Ray's token."""
    import os

    from archsearch.tune.ray_session import ray_env

    for local in (False, True):
        if preset is None:
            monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        else:
            monkeypatch.setenv("RAY_AUTH_MODE", preset)
        ray_env(local=local)
        expected = preset or ("disabled" if local else None)
        assert os.environ.get("RAY_AUTH_MODE") == expected, (local, preset)
