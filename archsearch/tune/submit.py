"""``archsearch submit`` and ``archsearch logs``: a search as a Ray job on a remote cluster.

The search runs as a Ray job (Ray's job API, ``ray.job_submission.JobSubmissionClient``,
talking to the head's dashboard at ``http://HEAD:8265``). What the job gets:

* **code**: a staged copy of the project directory (the source tree archsearch is imported
  from, without ``.venv``, ``.git``, ``reports``, ``runs``, ``benchmarks`` (the evidence: run logs and stored models), caches and build
  output), shipped as the job's ``runtime_env`` ``working_dir``. When archsearch is installed
  from a wheel (no source tree), the installed package directory is staged instead. The job
  runs with that directory as its working directory, so ``python -m archsearch.cli`` imports
  this code, not whatever version the cluster has installed. The cluster must have the
  dependencies (``cluster/Dockerfile`` builds such an image).
* **space file**: a space inside the project travels at its own relative path (so relative
  dataset paths in it resolve as they do here); a space outside the project is copied to
  ``_submitted/NAME.yaml`` in the staged directory.
* **entrypoint**: ``python archsearch/tune/envcheck.py VERSION && python -m archsearch.cli
  search SPACE --address auto --storage STORAGE --reports REPORTS --name NAME --no-progress``
  plus the search options given to ``submit`` (:func:`job_command`). The first command
  (:mod:`archsearch.tune.envcheck`, standard library only) checks that the cluster's ``python``
  has archsearch's dependencies and imports the shipped archsearch of the submitter's
  ``VERSION``; otherwise the job ends with one ``error:`` line naming the missing package, the
  Python that ran and how to fix it (exit code 2, passed on by ``submit --wait``).

``--storage`` is passed through to ``archsearch search``, which writes the run directory
(``run.json``, ``optuna.db``, trial records, Tune checkpoints) as ordinary files: it must be an
absolute filesystem path on the cluster, shared by every node for multi-node runs (NFS, EFS, a
ReadWriteMany volume, a bucket mounted with s3fs/gcsfuse). ``s3://`` / ``gs://`` URIs are
refused here with that explanation, because the search itself does not accept them.

Only the standard library is imported at module level; Ray is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from archsearch.errors import UserError

#: Dashboard (job API) address used when neither ``--address`` nor ``RAY_API_SERVER_ADDRESS``
#: is given: a local head, or a tunnel / ``kubectl port-forward`` to a remote one.
DEFAULT_ADDRESS = "http://127.0.0.1:8265"

#: Directory names never shipped, at any depth.
EXCLUDE_ANYWHERE = (".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache",
                    ".ruff_cache", ".ipynb_checkpoints", "node_modules", "*.egg-info", "*.pyc")
#: Paths (relative to the project root) never shipped: generated output and large data.
EXCLUDE_AT_ROOT = ("reports", "runs", "build", "dist", "benchmarks", ".ci")

#: Ray refuses a working_dir package over 512 MiB; we stop well before, with a useful message.
MAX_SHIP_BYTES = 256 * 2**20

#: Where a space file from outside the project goes in the shipped directory.
SUBMITTED_DIR = "_submitted"

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")

#: The environment check the job runs first, relative to its working directory.
ENVCHECK_SCRIPT = "archsearch/tune/envcheck.py"


@dataclass
class Submission:
    """A submitted search.

    Attributes:
        job_id: the Ray job's submission id (``raysubmit_...``).
        address: the dashboard URL it was submitted to.
        run_name: the run's name (``--name`` or generated here).
        run_dir: the run directory on the cluster (``STORAGE/NAME``).
        report_dir: the report directory on the cluster (``REPORTS/NAME``).
        entrypoint: the shell command the job runs.
    """

    job_id: str
    address: str
    run_name: str
    run_dir: str
    report_dir: str
    entrypoint: str


# ---------------------------------------------------------------------- address
def dashboard_url(address: str | None) -> str:
    """The job API URL for ``--address``: ``http(s)://HOST:PORT`` as given, ``HOST:PORT`` gets
    ``http://``; ``None`` means ``$RAY_API_SERVER_ADDRESS`` or :data:`DEFAULT_ADDRESS`.

    Raises:
        UserError: a ``ray://`` (Ray Client) address, another scheme, or no host or port.
    """
    if address is None:
        address = os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_ADDRESS
    address = address.strip().rstrip("/")
    if address.startswith("ray://"):
        raise UserError("submit talks to the head's dashboard (job API), e.g. http://HEAD:8265; "
                        "ray:// is the Ray Client port", file=address, field="--address")
    if "://" not in address:
        address = f"http://{address}"
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError:  # "http://[::1" (an unclosed IPv6 bracket), a port out of range
        parts, port = urlsplit("http://"), None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise UserError("expected http://HOST:PORT (the head's dashboard, default port 8265)",
                        file=address, field="--address")
    return address


def connect(address: str | None, timeout_s: float = 5.0):
    """A ``JobSubmissionClient`` for the dashboard at ``address`` (see :func:`dashboard_url`).

    A TCP connect with ``timeout_s`` seconds comes first, so a closed port fails at once
    instead of after Ray's retries.

    Raises:
        UserError: malformed address, nothing listening, or not a Ray dashboard.
    """
    url = dashboard_url(address)
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s):
            pass
    except OSError as e:
        raise UserError(f"no Ray dashboard answers there ({e.strerror or e.__class__.__name__}); "
                        "start a head (`ray start --head`) or open a tunnel to its port 8265",
                        file=url, field="--address") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    from ray.job_submission import JobSubmissionClient

    # no INFO lines about packaging, uploads and websockets (these loggers set INFO themselves)
    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                 "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)

    try:
        return JobSubmissionClient(url)
    except Exception as e:  # ConnectionError, RuntimeError (version check), ValueError
        first = " ".join(str(e).split())[:200]
        raise UserError(f"not a reachable Ray job API ({e.__class__.__name__}: {first})",
                        file=url, field="--address") from None


# ---------------------------------------------------------------------- what is shipped
def project_root() -> Path | None:
    """The source tree archsearch is imported from (the directory holding ``pyproject.toml``
    with ``name = "archsearch"`` next to the package), or ``None`` for an installed wheel."""
    import archsearch

    root = Path(archsearch.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "archsearch"' in text else None


def _ignore(root: Path, extra: list[Path]):
    """A ``shutil.copytree`` ignore function for :data:`EXCLUDE_ANYWHERE`,
    :data:`EXCLUDE_AT_ROOT` and the absolute paths ``extra``."""
    import fnmatch

    at_root = {root / p for p in EXCLUDE_AT_ROOT} | {p.resolve() for p in extra}

    def ignore(directory: str, names: list[str]) -> set[str]:
        d = Path(directory)
        out = set()
        for n in names:
            if any(fnmatch.fnmatch(n, pat) for pat in EXCLUDE_ANYWHERE) or (d / n) in at_root:
                out.add(n)
        return out

    return ignore


def _gitignored(root: Path, path: Path) -> bool:
    """Whether git ignores ``path`` in the project ``root``: Ray's packager drops such files
    from the working directory (it obeys ``.gitignore``, which keeps the user's secrets and
    scratch off the cluster), so a space file there goes under :data:`SUBMITTED_DIR` instead.
    ``False`` without git or outside a repository."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(path)],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def planned_sizes(root: Path, ignore) -> dict[str, int]:
    """Bytes that ``shutil.copytree(root, ..., ignore=ignore)`` would copy, per top-level entry
    of ``root``, counted before anything is copied: symlinks followed as copytree follows them
    (a link to a large dataset outside the project counts in full; a directory reached through
    two paths counts twice, as it is copied twice), dangling links skipped.

    Raises:
        UserError: a link leads back to a directory it is inside (copytree would copy it again
            and again until the path is too long), naming the link.
    """
    sizes: dict[str, int] = {}

    def walk(d: Path, top: str | None, ancestors: frozenset[str]) -> None:
        real = os.path.realpath(d)
        if real in ancestors:
            raise UserError(f"{d.relative_to(root)} links back to a directory it is in: the "
                            "project cannot be shipped with it; remove the link or exclude it",
                            file=str(root), field="working_dir")
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return
        skipped = ignore(str(d), names)
        for n in names:
            if n in skipped:
                continue
            p, key = d / n, top or n
            try:
                is_dir, is_file = p.is_dir(), p.is_file()
                if is_file:
                    sizes[key] = sizes.get(key, 0) + p.stat().st_size
            except OSError:  # dangling or unreadable: copytree skips or fails on it itself
                continue
            if is_dir:
                walk(p, key, ancestors | {real})

    walk(root, None, frozenset())
    return sizes


def stage(space_file: Path, dest: Path, *, skip: list[Path] = ()) -> str:
    """Copy what the job needs into the empty directory ``dest``; return the space file's path
    relative to it (the path the entrypoint names).

    The project tree (see :func:`project_root`) minus the exclusions, or the installed package
    alone; the space at its relative path if it is inside the project and not gitignored (Ray
    would drop it), else under ``_submitted/``. ``skip``: more absolute paths to leave out (e.g. a ``--storage`` inside
    the project).

    Raises:
        UserError: what would be staged is over :data:`MAX_SHIP_BYTES` (names its largest
            entries; checked before anything is copied, links followed).
    """
    import archsearch

    space_file = space_file.resolve()
    root = project_root()
    src, into = (root, dest) if root is not None else \
        (Path(archsearch.__file__).resolve().parent, dest / "archsearch")
    ignore = _ignore(src, list(skip) if root is not None else [])
    sizes = planned_sizes(src, ignore)  # before copying: a linked dataset is refused, not copied
    total = sum(sizes.values()) + space_file.stat().st_size
    if total > MAX_SHIP_BYTES:
        biggest = sorted(((b, n) for n, b in sizes.items()), reverse=True)[:3]
        what = ", ".join(f"{n} ({b / 2**20:.0f} MiB)" for b, n in biggest)
        raise UserError(f"the project directory to ship is {total / 2**20:.0f} MiB, over "
                        f"{MAX_SHIP_BYTES / 2**20:.0f} MiB; largest: {what}; move large data "
                        "(or links to it) out of it (onto the cluster's shared storage)",
                        file=str(src), field="working_dir")
    shutil.copytree(src, into, ignore=ignore, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    if (root is not None and space_file.is_relative_to(root)
            and (dest / space_file.relative_to(root)).is_file() and not _gitignored(root, space_file)):
        rel = space_file.relative_to(root).as_posix()
    else:
        (dest / SUBMITTED_DIR).mkdir(exist_ok=True)
        rel = f"{SUBMITTED_DIR}/{space_file.name}"
        shutil.copyfile(space_file, dest / rel)
    return rel


# ---------------------------------------------------------------------- the job
def check_storage(storage: str, field: str = "--storage") -> str:
    """``storage`` as the search will get it: an absolute path on the cluster.

    Raises:
        UserError: a URI (``s3://``, ``gs://``...: ``archsearch search`` writes plain files), or
            a relative path (it would land in the job's temporary working directory).
    """
    if "://" in storage:
        raise UserError("archsearch search writes its run directory (run.json, optuna.db, trial "
                        "records) as plain files, so this must be a filesystem path on the "
                        "cluster; mount the bucket on every node (s3fs, gcsfuse, a CSI driver) "
                        "and give the mount point", file=storage, field=field)
    if not storage.startswith("/"):
        raise UserError("must be an absolute path on the cluster, shared by every node (a "
                        "relative path would land in the job's temporary working directory)",
                        file=storage, field=field)
    return storage.rstrip("/") or "/"


def search_command(space_rel: str, *, name: str, storage: str, reports: str,
                   searcher: str, trials: int | None = None, fixed: str | None = None,
                   cpus_per_trial: float | None = None,
                   gpus_per_trial: float | None = None) -> list[str]:
    """argv of the job's driver: ``python -m archsearch.cli search ...`` on the cluster."""
    argv = ["python", "-m", "archsearch.cli", "search", space_rel, "--address", "auto",
            "--searcher", searcher, "--name", name, "--storage", storage, "--reports", reports,
            "--no-progress"]
    for flag, value in (("--trials", trials), ("--fixed", fixed),
                        ("--cpus-per-trial", cpus_per_trial), ("--gpus-per-trial", gpus_per_trial)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def job_command(search_argv: list[str]) -> str:
    """The job's shell entrypoint: the environment check (:mod:`archsearch.tune.envcheck`, with
    this archsearch's version), then the search ``search_argv`` (:func:`search_command`)."""
    import archsearch

    check = ["python", ENVCHECK_SCRIPT, str(archsearch.__version__)]
    return f"{shlex.join(check)} && {shlex.join(search_argv)}"


def submit_search(space_file: Path, *, address: str | None, storage: str,
                  reports: str | None = None, searcher: str = "gp", trials: int | None = None,
                  name: str | None = None, fixed: str | None = None,
                  cpus_per_trial: float | None = None, gpus_per_trial: float | None = None,
                  env: dict[str, str] | None = None) -> Submission:
    """Check the input here, stage the project, submit the search as a Ray job.

    Args:
        space_file: the search-space YAML on this machine (validated here).
        address: the head's dashboard (``http://HEAD:8265``; see :func:`dashboard_url`).
        storage: absolute path on the cluster for run directories (see :func:`check_storage`).
        reports: absolute path on the cluster for reports (default: ``reports`` next to
            ``storage``).
        searcher, trials, name, fixed, cpus_per_trial, gpus_per_trial: as ``archsearch search``
            (``name`` defaults to ``SPACE-SEARCHER-YYYYmmdd-HHMMSS``, made here so the run
            directory is known at once).
        env: extra environment variables for the job.

    Returns:
        the :class:`Submission`.

    Raises:
        UserError: missing or invalid space file, bad ``--fixed``/``--searcher``/``--storage``,
            unreachable address, project too large to ship, or the job API refused the job.
    """
    from archsearch.runs import check_run_name
    from archsearch.space import load_space, parse_fixed
    from archsearch.tune.searchers import check_searcher

    check_searcher(searcher)
    space = load_space(space_file)  # UserError: missing file, bad YAML, bad field
    if fixed is not None:
        pinned = parse_fixed(fixed)
        space.pinned(pinned)
        fixed = json.dumps(pinned, separators=(",", ":"))
    storage = check_storage(storage)
    reports = check_storage(reports, "--reports") if reports else str(Path(storage).parent / "reports")
    if not name:  # here, not on the cluster after the upload
        check_run_name(space.name, file=space.source, field="name")
    name = name or f"{space.name}-{searcher}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_run_name(name)
    client = connect(address)
    url = dashboard_url(address)
    with tempfile.TemporaryDirectory(prefix="archsearch-submit-") as tmp:
        staged = Path(tmp) / "project"
        skip = [Path(p) for p in (storage, reports)]
        rel = stage(Path(space_file), staged, skip=skip)
        argv = search_command(rel, name=name, storage=storage, reports=reports,
                              searcher=searcher, trials=trials, fixed=fixed,
                              cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial)
        entrypoint = job_command(argv)
        runtime_env = {"working_dir": str(staged),
                       "env_vars": {"PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0",
                                    **(env or {})}}
        try:
            job_id = client.submit_job(
                entrypoint=entrypoint, runtime_env=runtime_env,
                metadata={"archsearch_run": name, "archsearch_storage": storage,
                          "archsearch_space": Path(space_file).name})
        except Exception as e:  # RuntimeError from the job API (HTTP error), ConnectionError
            first = " ".join(str(e).split())[:300]
            raise UserError(f"the job API refused the job ({e.__class__.__name__}: {first})",
                            file=url, field="--address") from None
    return Submission(job_id=job_id, address=url, run_name=name, run_dir=f"{storage}/{name}",
                      report_dir=f"{reports}/{name}", entrypoint=entrypoint)


# ---------------------------------------------------------------------- following a job
def _job_info(client, job_id: str, url: str):
    try:
        return client.get_job_info(job_id)
    except Exception as e:  # RuntimeError "Request failed with status code 404"
        if "404" in str(e) or "does not exist" in str(e):
            raise UserError("no such job on this cluster (see `ray job list --address "
                            f"{url}`)", file=job_id, field="JOB") from None
        raise UserError(f"job API error ({e.__class__.__name__}: {' '.join(str(e).split())[:200]})",
                        file=url, field="--address") from None


def follow_logs(client, job_id: str, out=None) -> bool:
    """Print the job's logs to ``out`` (default stdout) as they come, until the job ends.

    Returns:
        whether the stream delivered anything (``False``: it never opened, e.g. a proxy
        without websockets; the caller decides from the job's status or its logs so far).

    Raises:
        UserError: unknown job (or the job API failed).
    """
    import asyncio

    out = out or sys.stdout
    got = []

    async def tail():
        async for chunk in client.tail_job_logs(job_id):
            got.append(True)
            out.write(chunk)
            out.flush()

    try:
        asyncio.run(tail())
    except Exception as e:  # RuntimeError from the job API; aiohttp's connection and websocket
        # handshake errors (a port-forward that died, a proxy without websockets)
        if "does not exist" in str(e) or "404" in str(e):
            raise UserError("no such job on this cluster", file=job_id, field="JOB") from None
        # the stream closed early or never opened: the job's status decides (wait_for polls it)
    return bool(got)


def print_logs(address: str | None, job_id: str, follow: bool = False, out=None) -> None:
    """``archsearch logs``: print a job's logs so far, or follow them until it ends.

    Raises:
        UserError: unreachable address, unknown job.
    """
    client = connect(address)
    _job_info(client, job_id, dashboard_url(address))
    out = out or sys.stdout
    if follow and follow_logs(client, job_id, out):
        return
    if follow:  # the stream gave nothing: print what the job API holds rather than nothing
        print("warning: the log stream did not open; the logs so far:", file=sys.stderr)
    try:
        logs = client.get_job_logs(job_id)
    except Exception as e:  # RuntimeError (HTTP error), connection errors
        raise UserError(f"job API error ({e.__class__.__name__}: {' '.join(str(e).split())[:200]})",
                        file=dashboard_url(address), field="--address") from None
    out.write(logs)
    out.flush()


def wait_for(address: str | None, job_id: str, *, follow: bool = True,
             poll_s: float = 2.0, out=None) -> int:
    """Wait until the job ends (following its logs if ``follow``); return the exit code for
    ``archsearch submit --wait``: 0 when it SUCCEEDED, else the driver's exit code (2: bad
    input found on the cluster, 1: every trial failed or the driver crashed), 1 if unknown.
    On failure one ``error:`` line goes to stderr: the job's last ``error:`` line or Ray's
    message.

    Raises:
        UserError: unreachable address, unknown job.
    """
    client = connect(address)
    url = dashboard_url(address)
    _job_info(client, job_id, url)
    if follow:
        follow_logs(client, job_id, out)
    while True:
        info = _job_info(client, job_id, url)
        status = str(getattr(info.status, "value", info.status))
        if status in TERMINAL:
            break
        time.sleep(poll_s)
    if status == "SUCCEEDED":
        return 0
    reason = None
    try:
        lines = [ln for ln in client.get_job_logs(job_id).splitlines() if ln.startswith("error:")]
        reason = lines[-1][len("error:"):].strip() if lines else None
    except Exception:  # logs unavailable (node gone): Ray's message is enough
        pass
    reason = reason or " ".join(str(info.message or "no message").split())[:300]
    print(f"error: job {job_id} {status}: {reason}", file=sys.stderr)
    code = info.driver_exit_code
    return code if isinstance(code, int) and code > 0 else 1
