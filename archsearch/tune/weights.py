"""Checkpoints a user can afford: what a finished search keeps of its trials' weights.

Each trial's Tune checkpoint (``state.pt``, :meth:`archsearch.tune.trainable.TrialLoop.save`)
holds the model, the optimizer state (AdamW: two more tensors per weight) and the random
states, so that a trial can resume mid-training; the checkpoint of a trial's last epoch is
written weights only as it finishes (``TrialLoop.save(weights_only=True)``: nothing is left to
resume). Once the search has ended, a trial that
finished (``TERMINATED``, ``STOPPED``) or failed (``ERROR``) never trains again, so
:func:`keep_weights` applies ``budget.keep_weights`` to it:

* ``pareto`` (default): the trials on the Pareto front (a sub-trial ``ID#k`` keeps its trial
  ``ID``) and the best successful trial of each objective keep their newest checkpoint, weights
  only (model, gating and tying state: what ``archsearch export`` reads); every other
  checkpoint is deleted;
* ``all``: every finished trial keeps its newest checkpoint, weights only;
* ``none``: every finished trial's checkpoints are deleted.

A trial still ``RUNNING`` (a search stopped by Ctrl-C, which ``archsearch resume`` continues)
keeps its checkpoints as they are. ``state.pt`` is rewritten atomically (a reader sees the old
file or the new one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterable

from archsearch.runs import ERROR, FINISHED, RunDir

#: the keys of a weights-only ``state.pt`` (what :meth:`TrialLoop.load` needs to predict)
WEIGHTS_KEYS = ("model", "gating", "tying")


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def checkpoints(run: RunDir, trial_id: str) -> list[Path]:
    """The checkpoint directories of ``trial_id`` under the run's ``tune/``, oldest first."""
    dirs = list(run.tune_dir.glob(f"train_trial_{trial_id}_*/checkpoint_*"))
    dirs += run.tune_dir.glob(f"*/train_trial_{trial_id}_*/checkpoint_*")
    return sorted((d for d in dirs if d.is_dir()), key=lambda d: (d.stat().st_mtime, d.name))


def kept_trials(summary: dict[str, Any], records: Iterable[dict[str, Any]]) -> set[str]:
    """The trials ``pareto`` keeps: the front's (``ID#k`` -> ``ID``) and the best successful
    trial of each objective (``summary`` is the report's ``pareto.json``)."""
    keep = {str(p["trial_id"]).split("#")[0] for p in summary.get("pareto", [])}
    ok = [r for r in records if r["status"] in FINISHED and isinstance(r.get("metrics"), dict)]
    for obj in summary.get("objectives", []):
        scored = [r for r in ok if isinstance(r["metrics"].get(obj["metric"]), (int, float))]
        if scored:
            pick = (max if obj["mode"] == "max" else min)(scored, key=lambda r: r["metrics"][obj["metric"]])
            keep.add(pick["trial_id"])
    return keep


def weights_only(ckpt: Path) -> None:
    """Rewrite ``ckpt/state.pt`` with :data:`WEIGHTS_KEYS` only (atomically)."""
    import torch

    path = ckpt / "state.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    if set(state) <= set(WEIGHTS_KEYS):
        return
    tmp = path.with_name(f".state.pt.{os.getpid()}.tmp")
    torch.save({k: state[k] for k in WEIGHTS_KEYS if k in state}, tmp)
    os.replace(tmp, path)


def keep_weights(run: RunDir, policy: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Apply ``budget.keep_weights`` (``pareto``, ``all`` or ``none``) to the run's finished
    trials (module docstring).

    Returns:
        ``{"policy", "kept": [trial ids], "deleted": [trial ids], "tune_mb_before",
        "tune_mb_after", "run_mb"}`` (MB = 2**20 bytes).

    Raises:
        ValueError: an unknown ``policy``.
    """
    if policy not in ("pareto", "all", "none"):
        raise ValueError(f"keep_weights must be pareto, all or none, not {policy!r}")
    records = run.read_trials()
    before = dir_bytes(run.tune_dir)
    chosen = kept_trials(summary, records) if policy == "pareto" else set()
    kept, deleted = [], []
    for rec in records:
        if rec["status"] not in (*FINISHED, ERROR):
            continue  # RUNNING: a resume continues it from its checkpoint
        dirs = checkpoints(run, rec["trial_id"])
        if not dirs:
            continue
        keep = rec["status"] in FINISHED and (policy == "all" or rec["trial_id"] in chosen)
        for d in dirs[:-1] if keep else dirs:
            shutil.rmtree(d, ignore_errors=True)
        if keep and (dirs[-1] / "state.pt").is_file():
            weights_only(dirs[-1])
            kept.append(rec["trial_id"])
        else:
            deleted.append(rec["trial_id"])
    mb = 2.0**20
    return {"policy": policy, "kept": kept, "deleted": deleted,
            "tune_mb_before": round(before / mb, 1), "tune_mb_after": round(dir_bytes(run.tune_dir) / mb, 1),
            "run_mb": round(dir_bytes(run.path) / mb, 1)}
