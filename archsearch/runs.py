"""A run directory: its layout, the effective run spec, trial records and atomic writes.

Every path of a run is a property of :class:`RunDir`; no other module spells a file name of
it. The layout (see also ``docs/design.md``)::

    RUN_DIR/
      run.json        RunSpec: what the run was started with (after --fixed/--trials), timings
      space.yaml      the effective search space (the YAML after --fixed and --trials)
      optuna.db       Optuna RDBStorage (SQLite), one study named after the run
      tune/           Ray Tune's experiment directory (trial table, searcher state, checkpoints)
      trials/ID.json  one record per trial (see :func:`new_trial_record`)
      .lock           held (flock) by the driver that runs the search: one driver per run

``archsearch resume`` reads :class:`RunSpec` back, so a resumed search runs with exactly the
searcher, seed, resources per trial and Ray address it was started with. A run is resumed
where it was created (Ray Tune's saved state holds its absolute path); ``report`` and
``compare`` read it anywhere.

Only the standard library and :mod:`archsearch.errors` are imported at module level.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archsearch.errors import UserError

# ---------------------------------------------------------------------- trial status vocabulary
RUNNING = "RUNNING"        #: started, not finished (or the driver died while it ran)
TERMINATED = "TERMINATED"  #: trained for the full budget
STOPPED = "STOPPED"        #: stopped early (the ASHA or AHTO scheduler, or the time budget): metrics of a partial budget
ERROR = "ERROR"            #: raised, returned NaN, or was lost; ``error`` says why
STATUSES = (RUNNING, TERMINATED, STOPPED, ERROR)
FINISHED = (TERMINATED, STOPPED)


# ---------------------------------------------------------------------- atomic writes
def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a
    part (a temp file in the same directory, then ``os.replace``), as Ray's
    ``Searcher.save_to_dir`` does."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    """A value JSON has no type for: a number (numpy scalar, 0-d tensor, Decimal) as a float,
    ``null`` when it is NaN/inf (as :func:`_finite` does for floats); anything else as text."""
    try:
        f = float(o)
    except (TypeError, ValueError):
        return str(o)
    return f if math.isfinite(f) else None


def _finite(v: Any) -> Any:
    """JSON has no NaN/inf: non-finite floats become ``null`` (recursively)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """:func:`atomic_write` of ``obj`` as indented JSON (NaN/inf written as ``null``: what
    jq and JavaScript read; ``NaN`` is not JSON)."""
    atomic_write(path, json.dumps(_finite(obj), indent=1, default=_json_default, allow_nan=False))


# ---------------------------------------------------------------------- run spec
@dataclass
class RunSpec:
    """What a run was started with (``run.json``): enough to resume it exactly.

    The space itself (after ``--fixed`` and ``--trials``) is ``space.yaml`` next to it.
    ``cpus_per_trial``/``gpus_per_trial`` are the resources each trial got (the space's
    budget or the command-line override); ``address`` is the Ray cluster (``None``: local Ray).
    """

    name: str
    searcher: str
    seed: int
    trials: int
    cpus_per_trial: float
    gpus_per_trial: float
    address: str | None = None
    num_cpus: int | None = None          #: CPUs of a local Ray instance (None: all)
    space_file: str | None = None        #: the YAML the user gave (provenance only)
    fixed: dict[str, Any] | None = None  #: the ``--fixed`` config, if any
    argv: list[str] = field(default_factory=list)
    started: float = 0.0                 #: Unix time the search started
    wall_seconds: float | None = None    #: total wall time over all sessions, once finished
    wall_seconds_before: float = 0.0     #: wall time of the sessions before the latest one
    resumed: list[float] = field(default_factory=list)  #: Unix times of each resume
    path: str | None = None              #: the run directory, absolute, as created
    history: list[str] = field(default_factory=list)  #: ``--history`` run directories (warm start)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "run.json") -> "RunSpec":
        """Raises: UserError: a required field is missing or a field has the wrong JSON type."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in d]
        if missing:
            raise UserError(f"missing field(s) {', '.join(missing)}: not written by this version "
                            "of archsearch", file=source, field=missing[0])
        for key, types in _SPEC_TYPES.items():
            if key in d and not (d[key] is None and key in _SPEC_OPTIONAL):
                _check_type(d[key], types, source, key)
        for key, types in _SPEC_ITEMS.items():
            for i, item in enumerate(d.get(key) or []):
                _check_type(item, types, source, f"{key}.{i}")
        for key in _SPEC_TIMES:  # Unix times that a date is made of
            for i, t in enumerate(d.get(key) if isinstance(d.get(key), list) else [d.get(key)]):
                if t is not None and not 0 <= t <= _LAST_TIME:
                    raise UserError(f"not a time: {t!r} (Unix seconds)", file=source,
                                    field=key if key != "resumed" else f"{key}.{i}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_type(value: Any, types: tuple[type, ...], file: str, field: str) -> None:
    """Raises: UserError: ``value`` (``file``'s ``field``) is none of the JSON ``types`` (a
    boolean is not a number), or a number that is not finite (JSON's ``NaN``, ``Infinity``)."""
    if not isinstance(value, types) or isinstance(value, bool):
        raise UserError(f"expected {' or '.join(t.__name__ for t in types)}, got {type(value).__name__}",
                        file=file, field=field)
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"expected a finite number, got {value}", file=file, field=field)


def read_json(path: Path, what: str) -> Any:
    """The JSON document in ``path``, a ``what`` (``"run spec"``, ``"trial record"``).

    Raises:
        UserError: naming ``path``: unreadable, not UTF-8, not JSON, or nested too deeply for
            Python's parser.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"corrupt {what} (line {e.lineno}: {e.msg})", file=str(path)) from None
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise UserError(f"unreadable {what} ({e.__class__.__name__})", file=str(path)) from None


_NUMBER = (int, float)
#: ``run.json``'s fields and their JSON types (what ``resume`` and the report compute with).
_SPEC_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "searcher": (str,), "seed": (int,), "trials": (int,), "cpus_per_trial": _NUMBER,
    "gpus_per_trial": _NUMBER, "address": (str,), "num_cpus": (int,), "space_file": (str,),
    "fixed": (dict,), "argv": (list,), "started": _NUMBER, "wall_seconds": _NUMBER,
    "wall_seconds_before": _NUMBER, "resumed": (list,), "path": (str,), "history": (list,)}
_SPEC_OPTIONAL = {"address", "num_cpus", "space_file", "fixed", "wall_seconds", "path"}
_SPEC_ITEMS = {"argv": (str,), "resumed": _NUMBER, "history": (str,)}  #: the JSON type of each list's items
_SPEC_TIMES = ("started", "resumed")  #: Unix times (seconds)
_LAST_TIME = 253402300799  #: 9999-12-31T23:59:59Z, the last second Python's datetime can show


# ---------------------------------------------------------------------- trial records
def new_trial_record(trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
    """A trial record as written to ``trials/ID.json``:

    ``trial_id``; ``status`` (one of :data:`STATUSES`); ``config`` (active params only);
    ``metrics`` (the last reported epoch); ``history`` (one entry per reported epoch);
    ``error`` (one line, for ``ERROR``); ``started`` (Unix time); once it reported, ``pid`` and
    ``node_ip`` of the worker process that runs it.
    """
    return {"trial_id": trial_id, "status": RUNNING,
            "config": {k: v for k, v in config.items() if v is not None},
            "metrics": {}, "history": [], "error": None, "started": time.time()}


def check_run_name(name: str, *, file: str | None = None, field: str = "--name") -> None:
    """Raises: UserError (``field``, default ``--name``; ``file``: the space file when the name
    is built from its ``name``): ``name`` is not one plain directory name (empty, a ``/`` or
    ``\\``, ``..``, or a leading ``.``)."""
    if not name or name != Path(name).name or name.startswith(".") or "\\" in name:
        raise UserError(f"{name!r} is not a run name: one directory name, no '/', not "
                        "starting with '.'" + ("; pick one with --name" if field != "--name" else ""),
                        file=file, field=field)


class RunDir:
    """The directory of one run. Every path of a run is a property here.

    Args:
        path: the run directory (``STORAGE/NAME``); it need not exist yet.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- layout
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def spec_file(self) -> Path:
        return self.path / "run.json"

    @property
    def space_file(self) -> Path:
        return self.path / "space.yaml"

    @property
    def optuna_db(self) -> Path:
        return self.path / "optuna.db"

    @property
    def optuna_url(self) -> str:
        """SQLAlchemy URL of the run's Optuna storage, the path escaped (SQLAlchemy decodes
        ``%XX`` and cuts at ``?``: a run named ``exp%41`` would otherwise use ``expA/optuna.db``)."""
        from sqlalchemy.engine import URL

        return URL.create("sqlite", database=str(self.optuna_db)).render_as_string(hide_password=False)

    @property
    def tune_name(self) -> str:
        """Ray Tune experiment name: ``RunConfig(name=..., storage_path=str(self.path))``."""
        return "tune"

    @property
    def tune_dir(self) -> Path:
        return self.path / self.tune_name

    @property
    def tune_state_file(self) -> Path:
        """Written by Ray Tune once the experiment started; ``Tuner.restore`` needs it."""
        return self.tune_dir / "tuner.pkl"

    @property
    def trials_dir(self) -> Path:
        return self.path / "trials"

    def trial_file(self, trial_id: str) -> Path:
        return self.trials_dir / f"{trial_id}.json"

    # -- creating and opening
    @classmethod
    def create(cls, storage: str | Path, name: str) -> "RunDir":
        """A new, empty run directory ``storage/name``.

        Raises:
            UserError: ``name`` is not one plain path component, ``storage/name`` exists and is
                not empty (a run is never appended to by accident), or ``storage`` is not writable.
        """
        check_run_name(name)
        run = cls(Path(storage) / name)
        if run.path.exists() and any(run.path.iterdir()):
            raise UserError("a run with this name exists; pick another --name or resume it with "
                            f"`archsearch resume {run.path}`", file=str(run.path), field="--name")
        try:
            run.trials_dir.mkdir(parents=True, exist_ok=True)
            probe = run.path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise UserError(f"storage path is not writable ({e.strerror})",
                            file=str(run.path.parent), field="--storage") from None
        return run

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        """An existing run directory.

        Raises:
            UserError: ``path`` holds no ``run.json`` and ``space.yaml``.
        """
        run = cls(path)
        if not run.spec_file.is_file() or not run.space_file.is_file():
            raise UserError(f"not a run directory (no {run.spec_file.name} / {run.space_file.name})",
                            file=str(run.path))
        return run

    def lock(self):
        """Hold the run for this process: ``fcntl.flock`` on ``RUN/.lock``, released when the
        process ends (even by SIGKILL), so a second driver (a ``resume`` while the first still
        runs) cannot write the same records, study and Tune state.

        Returns:
            the open lock file; the run is held while it is open (keep a reference).

        Raises:
            UserError: another process holds the run (names its pid and host).
        """
        import fcntl
        import socket

        f = open(self.path / ".lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise UserError(f"the run is in use by {holder}: its driver still runs (stop it, "
                            "or wait for it to end; on NFS a dead host's lock lasts until its "
                            "lease expires, about 90 s)", file=str(self.path)) from None
        except OSError as e:  # a file system without locks (ENOLCK, EOPNOTSUPP): run unheld
            print(f"warning: {self.path}: cannot lock the run ({e.strerror or e}); nothing stops "
                  "a second driver on it", file=sys.stderr)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        return f

    # -- spec and space
    def write_spec(self, spec: RunSpec) -> None:
        atomic_write_json(self.spec_file, spec.to_dict())

    def read_spec(self) -> RunSpec:
        """Raises: UserError: ``run.json`` is not valid JSON or lacks a field."""
        d = read_json(self.spec_file, "run spec")
        if not isinstance(d, dict):
            raise UserError("expected a JSON object", file=str(self.spec_file))
        return RunSpec.from_dict(d, source=str(self.spec_file))

    def write_space(self, space) -> None:
        """Write the effective :class:`~archsearch.space.SearchSpace` as YAML."""
        import yaml

        atomic_write(self.space_file, yaml.safe_dump(space.model_dump(mode="json"), sort_keys=False))

    def load_space(self):
        """The run's effective :class:`~archsearch.space.SearchSpace`."""
        from archsearch.space import load_space

        return load_space(self.space_file)

    # -- trial records
    def write_trial(self, record: dict[str, Any]) -> None:
        """Write one trial record (atomically)."""
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.trial_file(record["trial_id"]), record)

    def remove_trial(self, trial_id: str) -> None:
        """Delete one trial record (one a resumed search ran again under a new id); nothing if
        there is none."""
        self.trial_file(trial_id).unlink(missing_ok=True)

    def read_trials(self) -> list[dict[str, Any]]:
        """All trial records, in the order the trials started.

        Raises:
            UserError: a record is unreadable, not valid JSON or not a trial record (names the
                file and field).
        """
        out, seen = [], {}
        for p in sorted(self.trials_dir.glob("*.json")):
            rec = read_json(p, "trial record")
            _check_record(rec, p)
            if rec["trial_id"] in seen:
                raise UserError(f"trial {rec['trial_id']} is also recorded in {seen[rec['trial_id']].name}",
                                file=str(p), field="trial_id")
            seen[rec["trial_id"]] = p
            out.append(rec)
        out.sort(key=lambda r: (r.get("started") or 0, r["trial_id"]))
        return out

    def last_activity(self) -> float:
        """Unix time of the last trial record write (or now, when there is none)."""
        times = [p.stat().st_mtime for p in self.trials_dir.glob("*.json")]
        return max(times) if times else time.time()


#: The fields of a trial record and the JSON types they must have (absent or ``None`` allowed
#: for all but ``trial_id`` and ``status``): what the report, resume and compare read.
_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "trial_id": (str,), "status": (str,), "config": (dict,), "metrics": (dict,),
    "history": (list,), "error": (str,), "started": (int, float)}


def _check_record(rec: Any, path: Path) -> None:
    """Raises: UserError: ``rec`` (read from ``path``) is not a trial record."""
    if not isinstance(rec, dict):
        raise UserError(f"not a trial record (a JSON {type(rec).__name__}, expected an object)", file=str(path))
    for key, types in _RECORD_TYPES.items():
        v = rec.get(key)
        if v is None and key in ("trial_id", "status"):
            raise UserError("not a trial record (missing)", file=str(path), field=key)
        if v is not None:
            _check_type(v, types, str(path), key)
    if rec["status"] not in STATUSES:
        raise UserError(f"unknown status {rec['status']!r} (one of {', '.join(STATUSES)})",
                        file=str(path), field="status")


def read_trials(run_dir: str | Path) -> list[dict[str, Any]]:
    """Shorthand for ``RunDir(run_dir).read_trials()``."""
    return RunDir(run_dir).read_trials()


def export_dirname(trial_id: str) -> str:
    """The subdirectory ``archsearch export --pareto`` writes ``trial_id`` to (and the report's
    export command names): the trial id, a sub-trial ``ID#k`` as ``ID-k`` (a ``#`` in a path
    breaks URLs and shell comments)."""
    return str(trial_id).replace("#", "-")
