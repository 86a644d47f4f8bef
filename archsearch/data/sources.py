"""The raw loaders of :func:`archsearch.data.load`: each returns a :class:`datasets.DatasetDict`
with the source's own columns and splits (the bundled ``jsonl.gz`` files, a local file or
directory, or a Hugging Face Hub dataset; which one a name means is
:func:`archsearch.data.names.resolve`). :mod:`archsearch.data.standardise` then makes the columns,
labels and splits standard.

Local files are checked before ``datasets`` reads them, each mistake reported as one
:class:`~archsearch.errors.UserError` line naming the file and the field: an empty file, a CSV/TSV
with a header but no rows, and text files (``.csv .tsv .json .jsonl .txt``) that are not UTF-8
(the line and column of the first bad byte are named). A Hub dataset is loaded with
``datasets.load_dataset``: without network this fails within seconds with a
:class:`~archsearch.errors.UserError`; with ``HF_HUB_OFFLINE=1`` only the local HF cache is used.

``datasets`` and ``huggingface_hub`` are imported inside the functions, so importing this module is
cheap.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from archsearch.data.names import _BUNDLED, BUNDLED_DIR, LOCAL_FORMATS, SPLITS, _manifest, bundled_names
from archsearch.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import datasets

HUB_TIMEOUT_S = 5.0
#: Local file types that are text and must be UTF-8.
_TEXT_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".txt")
_SCAN_CHUNK = 16 << 20


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
