"""``archsearch submit`` / ``archsearch logs``: a search as a Ray job.

Fast tests: bad input is one line with exit code 2 before anything is submitted, and the
staged working directory holds the project without its large directories. The slow test
starts a real Ray head (its own temp dir and ports) in a subprocess, submits the tiny space
with ``--wait`` and reads the run directory it produced on ``--storage``; then it submits the
same ``--name`` again and checks that the job fails with the search's exit code 2. It stops
that head only (its own process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, cli_command, free_port, run_cli, tiny_space_file


def one_line_exit_2(proc: subprocess.CompletedProcess, *, says: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------
# bad input (no Ray anywhere)
# ------------------------------------------------------------------------------------------


def test_missing_space_file_is_one_line_exit_2(tmp_path):
    line = one_line_exit_2(run_cli("submit", tmp_path / "nope.yaml", "--storage", "/shared/runs",
                                   "--address", f"http://127.0.0.1:{free_port()}", timeout=120),
                           says="file not found")
    assert "nope.yaml" in line


def test_unreachable_address_is_one_line_exit_2(tmp_path):
    port = free_port()  # nothing listens there
    line = one_line_exit_2(run_cli("submit", tiny_space_file(tmp_path), "--storage", "/shared/runs",
                                   "--address", f"http://127.0.0.1:{port}", timeout=120),
                           says="no Ray dashboard answers there")
    assert f"127.0.0.1:{port}: --address:" in line
    one_line_exit_2(run_cli("logs", "raysubmit_x", "--address", f"127.0.0.1:{port}", timeout=120),
                    says="no Ray dashboard answers there")


@pytest.mark.parametrize("storage, says", [("s3://bucket/runs", "mount the bucket"),
                                           ("gs://bucket/runs", "mount the bucket"),
                                           ("runs", "must be an absolute path")])
def test_storage_must_be_a_cluster_path(tmp_path, storage, says):
    line = one_line_exit_2(run_cli("submit", tiny_space_file(tmp_path), "--storage", storage,
                                   "--address", f"http://127.0.0.1:{free_port()}", timeout=120),
                           says=says)
    assert line.startswith(f"error: {storage}: --storage:")


def test_ray_client_address_is_refused(tmp_path):
    one_line_exit_2(run_cli("submit", tiny_space_file(tmp_path), "--storage", "/shared/runs",
                            "--address", "ray://127.0.0.1:10001", timeout=120),
                    says="http://HEAD:8265")


def test_bad_fixed_is_refused_before_submitting(tmp_path):
    one_line_exit_2(run_cli("submit", tiny_space_file(tmp_path), "--storage", "/shared/runs",
                            "--fixed", "{n_layers: 1", "--address",
                            f"http://127.0.0.1:{free_port()}", timeout=120),
                    says="--fixed: not valid JSON")


@pytest.mark.parametrize("item", ["NOEQUALS", "A-B=1"])
def test_a_bad_env_is_refused_before_submitting(tmp_path, item):
    one_line_exit_2(run_cli("submit", tiny_space_file(tmp_path), "--storage", "/shared/runs",
                            "--env", item, "--address", f"http://127.0.0.1:{free_port()}", timeout=120),
                    says=f"--env: '{item}': expected KEY=VALUE")


def test_a_bad_run_name_is_refused_before_submitting(tmp_path):
    """Not after the upload, on the cluster (nothing answers at the address: the check came first)."""
    one_line_exit_2(run_cli("submit", tiny_space_file(tmp_path), "--storage", "/shared/runs",
                            "--name", "a/b", "--address", f"http://127.0.0.1:{free_port()}", timeout=120),
                    says="--name: 'a/b' is not a run name")



@pytest.mark.parametrize("command", ["submit", "search"])
def test_a_space_name_that_cannot_name_a_run_is_refused_first_unless_name_is_given(tmp_path, command):
    """The default run name starts with the space's ``name``: one with a '/' is refused before
    anything starts (search: before the data and Ray; submit: before the upload), naming the
    space file's field; with ``--name`` the space is fine (it loads, e.g. for a resume)."""
    import yaml

    from archsearch.space import load_space

    space = tiny_space_file(tmp_path)
    space.write_text(yaml.safe_dump({**yaml.safe_load(space.read_text()), "name": "team/x"}))
    assert load_space(space).name == "team/x"
    where = ["--storage", "/shared/runs", "--address", f"http://127.0.0.1:{free_port()}"] \
        if command == "submit" else ["--storage", str(tmp_path / "runs")]
    line = one_line_exit_2(run_cli(command, space, *where, timeout=120),
                           says=f"{space}: name: 'team/x' is not a run name")
    assert line.endswith("pick one with --name")
    assert not (tmp_path / "runs").exists()
    if command == "search":  # an empty --name names the run after the space too
        one_line_exit_2(run_cli(command, space, *where, "--name", "", timeout=120),
                        says=f"{space}: name: 'team/x' is not a run name")
    if command == "submit":  # with --name it gets past the check, to the unreachable address
        proc = run_cli(command, space, *where, "--name", "ok", timeout=120)
        assert proc.returncode != 0 and "not a run name" not in proc.stderr


# ------------------------------------------------------------------------------------------
# what is shipped
# ------------------------------------------------------------------------------------------


def test_stage_ships_the_project_without_large_directories(tmp_path):
    from archsearch.tune.submit import EXCLUDE_AT_ROOT, stage

    inside = stage(ROOT / "search_spaces" / "default.yaml", tmp_path / "a",
                   skip=[ROOT / "tests"])
    assert inside == "search_spaces/default.yaml"
    staged = tmp_path / "a"
    assert (staged / inside).read_bytes() == (ROOT / inside).read_bytes()
    assert (staged / "archsearch" / "cli.py").is_file() and (staged / "pyproject.toml").is_file()
    assert (staged / "archsearch" / "data" / "bundled").is_dir()
    for gone in (".git", ".venv", "tests", *EXCLUDE_AT_ROOT):
        assert not (staged / gone).exists(), gone
    assert not list(staged.rglob("__pycache__")) and not list(staged.rglob("*.egg-info"))

    outside = stage(tiny_space_file(tmp_path), tmp_path / "b")
    assert outside == "_submitted/tiny.yaml"
    assert (tmp_path / "b" / outside).read_bytes() == (tmp_path / "tiny.yaml").read_bytes()


def test_a_linked_dataset_over_the_limit_is_refused_before_anything_is_copied(tmp_path, monkeypatch):
    """A symlink in the project to data outside it would be copied in full (copytree follows
    links): the size is counted first, links followed (data reached twice counts twice, as
    copytree copies it twice), and the refusal names the link and leaves the staging directory
    empty. A link loop is refused by name (copytree copied the directory ~40 times over, then
    raised a bare shutil.Error)."""
    from archsearch.errors import UserError
    from archsearch.tune import submit

    project, outside = tmp_path / "project", tmp_path / "big"
    (project / "pkg").mkdir(parents=True)
    outside.mkdir()
    (project / "pyproject.toml").write_text('name = "archsearch"\n')
    (project / "pkg" / "m.py").write_text("x = 1\n")
    (project / "space.yaml").write_text("name: x\n")
    (outside / "train.bin").write_bytes(b"\0" * (3 * 2**20))
    (project / "data").symlink_to(outside)
    (project / "pkg" / "data").symlink_to(outside)  # the same data through a second link
    monkeypatch.setattr(submit, "project_root", lambda: project)
    monkeypatch.setattr(submit, "MAX_SHIP_BYTES", 5 * 2**20)
    sizes = submit.planned_sizes(project, submit._ignore(project, []))
    assert sizes["data"] == 3 * 2**20 and sizes["pkg"] == 3 * 2**20 + len("x = 1\n")
    dest = tmp_path / "staged"
    with pytest.raises(UserError, match=r"working_dir: .* 6 MiB, over 5 MiB; largest: (data|pkg) \(3 MiB\)"):
        submit.stage(project / "space.yaml", dest)
    assert not dest.exists() or not any(dest.iterdir())
    (project / "pkg" / "data").unlink()
    (project / "pkg" / "loop").symlink_to(project / "pkg")
    with pytest.raises(UserError, match=r"working_dir: pkg/loop links back to a directory it is in"):
        submit.stage(project / "space.yaml", dest)
    assert not dest.exists() or not any(dest.iterdir())
    (project / "pkg" / "loop").unlink()
    assert submit.stage(project / "space.yaml", dest) == "space.yaml"
    assert (dest / "pkg" / "m.py").is_file() and (dest / "data" / "train.bin").stat().st_size == 3 * 2**20


def test_a_space_in_a_gitignored_directory_is_shipped(tmp_path, monkeypatch):
    """Ray's packager drops what a ``.gitignore`` in the working directory names (and should:
    the user's secrets stay home): a space file in a gitignored ``scratch/`` is shipped under
    ``_submitted/`` instead, and reaches the cluster; the gitignored ``.env`` does not."""
    from ray._private.runtime_env.packaging import create_package

    from archsearch.tune import submit

    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text('name = "archsearch"\n')
    (project / "pkg" / "m.py").write_text("x = 1\n")
    (project / ".gitignore").write_text("scratch/\n.env\n")
    (project / ".env").write_text("TOKEN=secret\n")
    (project / "scratch").mkdir()
    (project / "scratch" / "my.yaml").write_text("name: x\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    monkeypatch.setattr(submit, "project_root", lambda: project)
    rel = submit.stage(project / "scratch" / "my.yaml", tmp_path / "staged")
    assert rel == "_submitted/my.yaml"
    create_package(str(tmp_path / "staged"), tmp_path / "pkg.zip", include_gitignore=True)
    with zipfile.ZipFile(tmp_path / "pkg.zip") as z:
        shipped = {Path(n).as_posix() for n in z.namelist() if not n.endswith("/")}
    assert {"_submitted/my.yaml", "pkg/m.py", "pyproject.toml"} <= shipped, shipped
    assert ".env" not in shipped and "scratch/my.yaml" not in shipped, shipped
    # a space the project tracks keeps its relative path
    (project / "spaces").mkdir()
    (project / "spaces" / "s.yaml").write_text("name: y\n")
    assert submit.stage(project / "spaces" / "s.yaml", tmp_path / "staged2") == "spaces/s.yaml"


# ------------------------------------------------------------------------------------------
# the job's environment check (archsearch/tune/envcheck.py)
# ------------------------------------------------------------------------------------------


def test_job_runs_the_environment_check_first():
    import archsearch
    from archsearch.tune.submit import job_command, search_command

    argv = search_command("s.yaml", name="n", storage="/s/runs", reports="/s/reports", searcher="tpe")
    assert job_command(argv) == (f"python archsearch/tune/envcheck.py {archsearch.__version__} && "
                                 "python -m archsearch.cli search s.yaml --address auto --searcher "
                                 "tpe --name n --storage /s/runs --reports /s/reports --no-progress")


def test_envcheck_knows_every_dependency_of_pyproject():
    import re
    import tomllib

    from archsearch.tune.envcheck import REQUIRED

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps}
    assert set(REQUIRED) == names


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """The project as a job's working directory gets it."""
    from archsearch.tune.submit import stage

    dest = tmp_path_factory.mktemp("staged") / "project"
    stage(ROOT / "search_spaces" / "default.yaml", dest)
    return dest


def _envcheck(python: list[str], staged: Path, version: str, **extra_env) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(extra_env)
    return subprocess.run([*python, "archsearch/tune/envcheck.py", version], cwd=staged, env=env,
                          capture_output=True, text=True, timeout=60)


def test_envcheck_passes_in_the_projects_environment(staged):
    import archsearch

    proc = _envcheck([sys.executable], staged, archsearch.__version__)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_envcheck_names_what_a_bare_python_lacks(staged, tmp_path):
    """A Python without the dependencies (a fresh ``venv --without-pip``, and this Python with
    ``-S``: no site-packages): one line naming the Python, the first missing package, the
    rest, and the fix; exit code 2."""
    import venv

    import archsearch
    from archsearch.tune.envcheck import REQUIRED

    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "bare")
    bare = tmp_path / "bare" / "bin" / "python"
    for python, exe in (([str(bare)], str(bare)), ([sys.executable, "-S"], sys.executable)):
        proc = _envcheck(python, staged, archsearch.__version__)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        line, = proc.stderr.splitlines()
        assert line.startswith(f"error: {exe}: torch: this Python (")
        assert "lacks torch, ray, optuna," in line and "typer" in line
        assert f"of the {len(REQUIRED)} packages archsearch {archsearch.__version__} needs" in line
        assert "the image in cluster/" in line and "`ray start` from the project's environment" in line


def test_envcheck_refuses_another_archsearch_version(staged):
    proc = _envcheck([sys.executable], staged, "0.0.1")
    assert proc.returncode == 2
    line, = proc.stderr.splitlines()
    assert line.startswith(f"error: {sys.executable}: archsearch: imports archsearch ")
    assert "not the submitted 0.0.1" in line


def test_envcheck_refuses_an_installed_copy_of_the_same_version(staged):
    """With PYTHONSAFEPATH, ``python -m archsearch.cli`` would not put the job's working
    directory on sys.path and would run the installed archsearch (here this checkout, an
    editable install: the same version string, other code). The check sees what ``-m`` will."""
    import archsearch

    proc = _envcheck([sys.executable], staged, archsearch.__version__, PYTHONSAFEPATH="1")
    assert proc.returncode == 2, proc.stderr
    line, = proc.stderr.splitlines()
    assert f"imports archsearch {archsearch.__version__} from {ROOT}, not the submitted code" in line \
        or "cannot import the shipped archsearch" in line, line


def _group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` still runs (zombies do not count: Ray's daemons are
    reparented to PID 1, which in a container may never reap them, so ``killpg(pgid, 0)``
    kept succeeding and each teardown waited its whole grace periods, ~30 s)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the signal test, zombies included
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


@contextlib.contextmanager
def _ray_head(tmp: Path, env: dict, *, num_cpus: int, stop_jobs: bool = False):
    """``ray start --head`` under ``env`` in a process group of its own (``tmp/ray`` as its
    temp dir, free ports, ``num_cpus`` CPUs, dashboard on 127.0.0.1); yields the dashboard URL
    once the job API answers. Afterwards (with ``stop_jobs``) stops the jobs still running,
    then that process group (SIGTERM, then SIGKILL), and removes ``tmp``."""
    dash = free_port()
    argv = [str(Path(sys.executable).parent / "ray"), "start", "--head",
            f"--port={free_port()}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
            f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--num-cpus={num_cpus}", f"--temp-dir={tmp / 'ray'}", "--disable-usage-stats"]
    log = open(tmp / "ray-start.log", "w")
    starter = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        assert starter.wait(timeout=180) == 0, (tmp / "ray-start.log").read_text()[-2000:]
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + 120
        while True:
            try:
                JobSubmissionClient(url).get_version()
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        yield url
    finally:
        if stop_jobs:
            try:
                from ray.job_submission import JobSubmissionClient

                client = JobSubmissionClient(url)
                for job in client.list_jobs():
                    if str(job.status) not in ("SUCCEEDED", "FAILED", "STOPPED") and job.submission_id:
                        client.stop_job(job.submission_id)
            except Exception:
                pass
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):  # a throwaway head: no need to wait long
            try:
                os.killpg(starter.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + grace
            while time.time() < deadline and _group_alive(starter.pid):
                time.sleep(0.5)
            if not _group_alive(starter.pid):
                break
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def bare_head(tmp_path_factory, cache_dir):
    """A Ray head started outside the project's environment as far as its jobs can tell: its
    ``python`` (the one a job's entrypoint runs) is a fresh ``venv --without-pip``, without a
    dependency of archsearch. Ray itself runs from this environment (the head must run); own
    temp dir and ports, its process group stopped afterwards."""
    import venv

    tmp = Path(tempfile.mkdtemp(prefix="asb-", dir="/tmp"))
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp / "bare")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{tmp / 'bare' / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    env.pop("RAY_ADDRESS", None)
    env.pop("VIRTUAL_ENV", None)
    with _ray_head(tmp, env, num_cpus=1) as url:
        yield url, tmp / "bare" / "bin" / "python"


@pytest.mark.ray
@pytest.mark.slow
def test_submit_wait_to_a_head_without_the_dependencies(tmp_path, bare_head):
    """The job ends with the environment check's one line (no ``ModuleNotFoundError``
    traceback), and ``submit --wait`` passes it on with the job's exit code 2."""
    url, bare_python = bare_head
    space = tiny_space_file(tmp_path)
    proc = subprocess.run(cli_command("submit", space, "--address", url, "--storage",
                                      tmp_path / "runs", "--name", "bare", "--wait"),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    (tmp_path / "transcript.txt").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: job raysubmit_") and " FAILED: " in last, proc.stderr
    assert f"{bare_python}: torch: this Python (" in last
    assert "the image in cluster/" in last
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------
# a real head
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_head(cache_dir):
    """A Ray head started with ``ray start --head`` in a process group of its own (its own
    --temp-dir and free ports, 2 CPUs, dashboard on 127.0.0.1), one per module. Yields the
    dashboard URL; afterwards stops the jobs still running on it and that process group,
    nothing else."""
    tmp = Path(tempfile.mkdtemp(prefix="ash-", dir="/tmp"))  # short: Ray's socket paths
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "ARCHSEARCH_CACHE": str(cache_dir),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    with _ray_head(tmp, env, num_cpus=2, stop_jobs=True) as url:
        yield url


@pytest.mark.ray
@pytest.mark.slow
def test_submit_to_a_real_head(tmp_path, ray_head):
    from ray.job_submission import JobSubmissionClient

    from archsearch.runs import FINISHED, RunDir

    space = tiny_space_file(tmp_path)  # outside the project: shipped under _submitted/
    storage, name = tmp_path / "shared" / "runs", "submitted"
    out = tmp_path / "submit.out"
    with open(out, "w") as f:
        proc = subprocess.run(cli_command("submit", space, "--address", ray_head,
                                          "--storage", storage, "--name", name,
                                          "--searcher", "random", "--trials", "2",
                                          "--fixed", '{"n_layers": 1}', "--wait",
                                          "--env", "ARCHSEARCH_AUTOSCALING=0"),
                              stdout=f, stderr=subprocess.PIPE, text=True, timeout=600,
                              cwd=tmp_path)
    client = JobSubmissionClient(ray_head)
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("archsearch_run") == name]
    assert len(jobs) == 1, [j.metadata for j in client.list_jobs()]
    job = jobs[0]
    assert proc.returncode == 0, (proc.stderr, client.get_job_logs(job.submission_id)[-3000:])
    assert str(job.status) == "SUCCEEDED", job.message
    assert job.runtime_env.get("working_dir", "").startswith("gcs://")
    assert job.runtime_env["env_vars"]["ARCHSEARCH_AUTOSCALING"] == "0"  # --env

    run = RunDir(storage / name)
    spec = run.read_spec()
    assert (spec.searcher, spec.trials, spec.address, spec.fixed) == ("random", 2, "auto",
                                                                      {"n_layers": 1})
    records = run.read_trials()
    assert len(records) == 2
    assert all(r["status"] in FINISHED and r["config"]["n_layers"] == 1 for r in records)
    assert all(0.0 <= r["metrics"]["accuracy"] <= 1.0 for r in records)
    assert (storage.parent / "reports" / name / "index.html").is_file()  # default --reports

    # archsearch logs prints what the job API holds
    logs = tmp_path / "logs.out"
    with open(logs, "w") as f:
        assert subprocess.run(cli_command("logs", job.submission_id, "--address", ray_head),
                              stdout=f, timeout=120).returncode == 0
    assert logs.read_text() == client.get_job_logs(job.submission_id)

    # the same --name again: the search refuses it on the cluster; --wait passes its exit 2 on
    again = subprocess.run(cli_command("submit", space, "--address", ray_head, "--storage", storage,
                                       "--name", name, "--searcher", "random", "--wait"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=600, cwd=tmp_path)
    assert again.returncode == 2, again.stderr
    failed = [j for j in client.list_jobs()
              if (j.metadata or {}).get("archsearch_run") == name
              and j.submission_id != job.submission_id]
    assert [str(j.status) for j in failed] == ["FAILED"]
    assert "a run with this name exists" in again.stderr.strip().splitlines()[-1]
    assert json.loads(run.spec_file.read_text())["trials"] == 2  # the first run is untouched


@pytest.mark.ray
@pytest.mark.slow
def test_submit_a_space_of_the_project(tmp_path, ray_head):
    """A space inside the project travels at its relative path: the job's driver finds
    ``search_spaces/default.yaml`` in the shipped working directory and starts the run (which
    is then stopped: the default search takes minutes)."""
    from ray.job_submission import JobSubmissionClient

    from archsearch.runs import RunDir

    storage = tmp_path / "runs"
    proc = subprocess.run(cli_command("submit", ROOT / "search_spaces" / "default.yaml",
                                      "--address", ray_head, "--storage", storage,
                                      "--name", "inproject", "--trials", "1"),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    client = JobSubmissionClient(ray_head)
    job, = [j for j in client.list_jobs() if (j.metadata or {}).get("archsearch_run") == "inproject"]
    check, search = job.entrypoint.split(" && ")
    assert check.split()[:2] == ["python", "archsearch/tune/envcheck.py"]
    assert search.split()[:5] == ["python", "-m", "archsearch.cli", "search",
                                  "search_spaces/default.yaml"]
    run = RunDir(storage / "inproject")
    deadline = time.time() + 240
    while not run.spec_file.is_file():
        status = str(client.get_job_status(job.submission_id))
        assert status in ("PENDING", "RUNNING"), (status, client.get_job_logs(job.submission_id))
        assert time.time() < deadline, client.get_job_logs(job.submission_id)
        time.sleep(1)
    client.stop_job(job.submission_id)
    spec = run.read_spec()
    assert (spec.space_file, spec.trials) == ("search_spaces/default.yaml", 1)
    assert run.load_space().name == "default"
    deadline = time.time() + 60
    while str(client.get_job_status(job.submission_id)) not in ("STOPPED", "FAILED", "SUCCEEDED"):
        assert time.time() < deadline
        time.sleep(1)


def test_a_log_stream_that_breaks_leaves_the_verdict_to_the_jobs_status():
    """``follow_logs`` on a connection that dies (aiohttp's error, raised by a client double
    standing in for a port-forward that went away) returns instead of a traceback: ``wait_for``
    then reads the job's status. An unknown job is still one line."""
    import aiohttp

    from archsearch.errors import UserError
    from archsearch.tune.submit import follow_logs

    class Broken:
        def __init__(self, error):
            self.error = error

        async def tail_job_logs(self, job_id):
            yield "first line\n"
            raise self.error

    out = __import__("io").StringIO()
    follow_logs(Broken(aiohttp.ClientConnectionError("Connection reset by peer")), "raysubmit_x", out)
    assert out.getvalue() == "first line\n"
    follow_logs(Broken(aiohttp.ServerDisconnectedError()), "raysubmit_x", out)
    with pytest.raises(UserError, match="raysubmit_x: JOB: no such job"):
        follow_logs(Broken(RuntimeError("Job raysubmit_x does not exist")), "raysubmit_x", out)

    class NeverOpens:  # a proxy without websockets: the caller prints the logs so far instead
        async def tail_job_logs(self, job_id):
            raise aiohttp.ClientConnectionError("websocket refused")
            yield  # an async generator

    assert follow_logs(Broken(aiohttp.ServerDisconnectedError()), "raysubmit_x", out) is True
    assert follow_logs(NeverOpens(), "raysubmit_x", out) is False
