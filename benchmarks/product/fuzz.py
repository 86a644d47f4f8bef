"""Property-based fuzzing of the CLI's pre-launch path (Hypothesis): bad input never hangs and
never shows a traceback.

Cases, each run through ``archsearch check`` (every check ``archsearch search`` makes before it
launches anything; Ray is never started), in-process (``archsearch.cli.main`` with
``sys.argv`` set, stdout/stderr captured at the file-descriptor level too):

  space      a shipped search space (``search_spaces/*.yaml``) or the tests' tiny one, mutated 1-3
             times: a value replaced by None, "", NaN, inf, 2^70, a list, a dict, a bool, text or
             a number; a key deleted or added; a number negated or scaled by 1e9. Some get a
             text-level mutation of the YAML too (cut short, stray bytes, a BOM, a tab, Latin-1)
             and some command-line overrides (``--trials``, ``--cpus-per-trial``,
             ``--gpus-per-trial``, ``--searcher``).
  fixed      the tiny space with a ``--fixed`` value: JSON objects of known and unknown params
             with any JSON values, other JSON values, text that is not JSON.
  data_file  a CSV, TSV, JSONL, JSON, Parquet or text file named as the tiny space's dataset:
             wrong or missing columns, empty and null fields, mixed label types (ints, strings,
             floats, bools, None, lists), one class, huge rows (over the 100,000-character
             limit), encodings (UTF-8 with BOM, UTF-16, Latin-1, stray bytes), broken quoting
             and lines; with or without ``text_column`` / ``label_column`` / ``task`` / tokenizer.

The property, per case: exit code 0, or exactly one non-empty stderr line ``error: ...`` with
exit code 2; no traceback; within ``HANG_S`` (30) seconds; and nothing written outside the run
directory (``check`` makes none): the case's own directory (its input files, its working
directory) holds the same files afterwards, and the project checkout gains no file. The caches
(``ARCHSEARCH_CACHE``, the Hugging Face datasets cache) are pointed into this benchmark's
scratch directory; they are the only other places written. ``HF_HUB_OFFLINE=1``: a mutated
dataset or tokenizer name that looks like a Hub id fails at once instead of reaching the network.

``impossible_resources_exit_s``: wall seconds of a real ``archsearch search`` subprocess of the
tiny space with ``budget.cpus_per_trial: 1e9`` on this machine, until its exit code 2 (the data
prepared beforehand).

    python -m benchmarks.product.fuzz run [--spaces 2400] [--fixed 300] [--data-files 600] [--seed 0]
    python -m benchmarks.product.fuzz analyze|check   # restate the stored result (no fuzzing)

writes ``benchmarks/product/results/fuzz.json``: ``summary`` (``spaces_tried``, ``data_files_tried``,
``tracebacks``, ``hangs``, ``impossible_resources_exit_s``), ``provenance``, the table of cases
by kind and outcome (``cases``), and every case that broke the property (``failures``, with
its input). ``tests/test_fuzz.py`` runs the same strategies and harness (quick and long
Hypothesis profiles). ``analyze`` and ``check`` pass the stored numbers through the same
builder (:func:`build`) as ``run`` (:mod:`benchmarks.product.stored`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import ROOT, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.product.stored import restate

OUT = Path(__file__).resolve().parent / "results" / "fuzz.json"
#: A case that takes longer than this is a hang.
HANG_S = 30.0
#: Issue 40's targets for the summary.
TARGETS = {"spaces_tried": ">= 2000", "data_files_tried": ">= 500", "tracebacks": "== 0",
           "hangs": "== 0", "impossible_resources_exit_s": "<= 10"}

#: The tests' tiny space (tests/conftest.py TINY_SPACE): 1,024 real sentences, tiny models.
TINY = {
    "name": "tiny",
    "task": "classification",
    "dataset": {"name": "rotten_tomatoes_sentences", "vocab_size": 1000, "max_len": 32,
                "max_train_samples": 1024},
    "objectives": [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}],
    "constraints": {"params_trainable": {"max": 400000}},
    "budget": {"trials": 3, "max_concurrent": 2, "epochs": 2, "batch_size": 64,
               "scheduler": "none", "cpus_per_trial": 1},
    "params": {
        "n_layers": {"type": "int", "low": 1, "high": 2},
        "d_model": {"type": "categorical", "choices": [16, 32]},
        "n_heads": {"type": "categorical", "choices": [2]},
        "lr": {"type": "float", "low": 1e-3, "high": 3e-3, "log": True},
    },
}


# ---------------------------------------------------------------------- bases
def base_spaces(shipped: bool = True) -> dict[str, dict]:
    """``{"tiny": TINY, "default": ..., ...}``: the spaces mutated. Shipped spaces are read from
    ``search_spaces/``, with relative local paths (``dataset.tokenizer: .venv/minilm-l6``)
    made absolute against the checkout, since cases run in their own directories."""
    out = {"tiny": copy.deepcopy(TINY)}
    if not shipped:
        return out
    for path in sorted((ROOT / "search_spaces").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        ds = spec.get("dataset") or {}
        for key in ("name", "tokenizer"):
            v = ds.get(key)
            if isinstance(v, str) and (v.startswith(".") or "/" in v) and (ROOT / v).exists():
                ds[key] = str(ROOT / v)
        for holder in (spec.get("fixed") or {},):
            v = holder.get("init_from")
            if isinstance(v, str) and (ROOT / v).exists():
                holder["init_from"] = str(ROOT / v)
        out[path.stem] = spec
    return out


# ---------------------------------------------------------------------- space mutations
#: The values the issue names (None, "", NaN, inf, 2^70, lists, dicts) and a few more.
SPECIAL_VALUES = [None, "", float("nan"), float("inf"), -float("inf"), 2**70, -(2**70), [], [1, "a"],
                  {}, {"x": 1}, True, False, 0, -1, 1e-300, "zzz", "1e9", "0x10", "~", "null",
                  "rotten_tomatoes_sentences", "shakespeare", "categorical", "int", "float",
                  "max", "min", "asha", "dht", "static", "bpe", "char", "wordpiece"]
#: Names a mutation adds as keys: real field names (in the wrong place) and junk.
KEY_NAMES = ["type", "low", "high", "choices", "when", "log", "step", "max", "min", "metric",
             "mode", "ref", "name", "trials", "epochs", "cpus_per_trial", "gpus_per_trial",
             "memory_per_trial_gb", "pending_timeout_s", "precision", "n_layers", "d_model",
             "n_heads", "gating", "tying", "init_from", "flops_budget", "tokenizer",
             "vocab_size", "max_len", "text_column", "label_column", "dropout", "lr",
             "seed", "fixed", "params", "budget", "dataset", "objectives", "constraints",
             "zzz", "", "0", "n_layerz"]

values = st.one_of(
    st.sampled_from(SPECIAL_VALUES).map(copy.deepcopy),  # a fresh {} / [] each time: a later mutation may add into it
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.one_of(st.integers(-5, 300), st.text(max_size=4), st.none()), max_size=4),
    st.dictionaries(st.sampled_from(KEY_NAMES), st.one_of(st.integers(-5, 300), st.text(max_size=4)),
                    max_size=3),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value below ``doc`` (dict keys and list indices)."""
    out = []
    if isinstance(doc, dict):
        items = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return out
    for k, v in items:
        out.append(prefix + (k,))
        out += _paths(v, prefix + (k,))
    return out


def _containers(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths of every mapping in ``doc`` (the root is ``()``)."""
    out = [prefix] if isinstance(doc, dict) else []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out += _containers(v, prefix + (k,))
    return out


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutations(draw, doc: dict) -> list[str]:
    """Mutate ``doc`` in place 1-3 times; return what was done (``replace budget.trials nan``)."""
    done = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "negate", "scale"]))
        if op == "add":
            where = draw(st.sampled_from(_containers(doc)))
            key, value = draw(st.sampled_from(KEY_NAMES)), draw(values)
            _get(doc, where)[key] = value
            done.append(f"add {'.'.join(map(str, where + (key,))) or '.'} = {value!r}")
            continue
        paths = _paths(doc)
        if op in ("negate", "scale"):
            paths = [p for p in paths if isinstance(_get(doc, p), (int, float))
                     and not isinstance(_get(doc, p), bool)] or paths
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent, key = _get(doc, path[:-1]), path[-1]
        name = ".".join(map(str, path))
        if op == "delete":
            del parent[key]
            done.append(f"delete {name}")
        elif op == "replace":
            value = draw(values)
            parent[key] = value
            done.append(f"replace {name} = {value!r}")
        else:
            old = parent[key]
            if isinstance(old, (int, float)) and not isinstance(old, bool):
                parent[key] = -old if op == "negate" else old * (10**9 if isinstance(old, int) else 1e9)
                done.append(f"{op} {name}")
    return done


@st.composite
def space_text_mutation(draw, text: str) -> tuple[bytes, str | None]:
    """The YAML's bytes, now and then mutated as text: cut short, stray bytes, a BOM, a tab,
    Latin-1."""
    data = text.encode("utf-8")
    kind = draw(st.sampled_from([None] * 6 + ["cut", "bytes", "bom", "tab", "latin1", "empty"]))
    if kind == "cut":
        data = data[:draw(st.integers(0, max(0, len(data) - 1)))]
    elif kind == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    elif kind == "bom":
        data = b"\xef\xbb\xbf" + data
    elif kind == "tab":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\t" + data[at:]
    elif kind == "latin1":
        data = ("# caf\u00e9\n" + text).encode("latin-1", errors="replace")
    elif kind == "empty":
        data = b""
    return data, kind


@dataclass
class Case:
    """One fuzz case: its kind, what it is (for the failure list), the files to write into the
    case directory (name -> bytes) and the CLI arguments (``{dir}`` is the case directory)."""

    kind: str
    what: str
    files: dict[str, bytes]
    argv: list[str]
    meta: dict[str, Any] = field(default_factory=dict)


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@st.composite
def overrides(draw) -> list[str]:
    """Command-line budget overrides, sometimes."""
    argv = []
    if draw(st.integers(0, 9)) == 0:
        argv += ["--trials", str(draw(st.integers(1, 10**6)))]
    for opt in ("--cpus-per-trial", "--gpus-per-trial"):
        if draw(st.integers(0, 11)) == 0:
            v = draw(st.one_of(st.sampled_from([0.0, -1.0, 0.5, 1.0, 2.0, 1e9, math.inf, math.nan]),
                               st.floats(-1e12, 1e12)))
            argv += [opt, repr(v)]
    if draw(st.integers(0, 11)) == 0:
        argv += ["--searcher", draw(st.sampled_from(["random", "tpe", "nsga2", "qnehvi", "ahto",
                                                     "TPE", "", "grid"]))]
    return argv


@st.composite
def space_cases(draw, bases: dict[str, dict]) -> Case:
    name = draw(st.sampled_from(sorted(bases)))
    doc = copy.deepcopy(bases[name])
    done = draw(mutations(doc))
    try:
        text = _dump(doc)
    except Exception:  # a value YAML cannot write: keep the unmutated text
        text, done = _dump(bases[name]), done + ["(not dumpable: unmutated)"]
    data, text_kind = draw(space_text_mutation(text))
    argv = ["check", "{dir}/space.yaml", *draw(overrides())]
    what = f"{name}: {'; '.join(done)}" + (f"; text {text_kind}" if text_kind else "")
    return Case("space", what, {"space.yaml": data}, argv, {"base": name, "text": text_kind})


# ---------------------------------------------------------------------- --fixed
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
              st.text(max_size=10), st.sampled_from([1, 2, 16, 32, 0.001, 0.002, 1e-3, "static"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)


@st.composite
def fixed_cases(draw) -> Case:
    keys = list(TINY["params"]) + ["zzz", "", "init_from", "gating", "dropout"]
    form = draw(st.sampled_from(["object", "object", "object", "json", "text"]))
    if form == "object":
        obj = draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=4))
        text = json.dumps(obj)
    elif form == "json":
        text = json.dumps(draw(json_values))
    else:
        text = draw(st.text(max_size=30))
    if "\x00" in text:  # an argv string cannot hold NUL (nor can a shell pass one)
        text = text.replace("\x00", "")
    return Case("fixed", f"--fixed {text!r}", {"space.yaml": _dump(TINY).encode()},
                ["check", "{dir}/space.yaml", "--fixed", text], {"form": form})


# ---------------------------------------------------------------------- data files
FORMATS = ["csv", "tsv", "jsonl", "json", "parquet", "txt"]
COLUMN_NAMES = ["text", "label", "sentence", "y", "labels", "Text", "", "text ", "col",
                "caf\u00e9", "label"]
COLUMN_KINDS = ["text", "int_label", "str_label", "mixed_label", "float_label", "bool_label",
                "one_class", "empty", "none", "nested", "number_text"]
WORDS = ["good", "bad", "film", "the", "a", "caf\u00e9", "\u6f22\u5b57", "\U0001f600", "\u05e9\u05dc\u05d5\u05dd",
         "x,y", '"quoted"', "tab\there", "new\nline", "semi;colon", "\\", "", " ", "NaN", "null"]


def _cell(kind: str, rng: random.Random, i: int) -> Any:
    if kind == "text":
        if rng.random() < 0.05:
            return rng.choice(["", None])
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
    if kind == "number_text":
        return rng.choice([i, 1.5, None])
    if kind == "int_label":
        return rng.choice([0, 1, 2])
    if kind == "str_label":
        return rng.choice(["pos", "neg", "Pos", " pos"])
    if kind == "mixed_label":
        return rng.choice([0, 1, "1", "pos", 1.0, 2.5, True, None, ""])
    if kind == "float_label":
        return rng.choice([0.0, 1.0, rng.random(), float("nan")])
    if kind == "bool_label":
        return rng.choice([True, False])
    if kind == "one_class":
        return "pos"
    if kind == "empty":
        return ""
    if kind == "none":
        return None
    return rng.choice([[1, 2], {"a": 1}, [], "x"])  # nested


def _table(spec: dict, rng: random.Random) -> tuple[list[str], list[list[Any]]]:
    names = [c[0] for c in spec["columns"]]
    rows = [[_cell(kind, rng, i) for _, kind in spec["columns"]] for i in range(spec["rows"])]
    if spec["huge"] and rows and names:
        text_cols = [j for j, (_, k) in enumerate(spec["columns"]) if k == "text"] or [0]
        rows[rng.randrange(len(rows))][text_cols[0]] = "x" * spec["huge"]
    return names, rows


def _text_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _encode(text: str, encoding: str, rng: random.Random, corrupt: int) -> bytes:
    if encoding in ("latin-1", "cp1252"):
        data = text.encode(encoding, errors="replace")
    else:
        data = text.encode(encoding, errors="surrogatepass")
    for _ in range(corrupt):
        at = rng.randrange(len(data) + 1)
        data = data[:at] + bytes([rng.choice([0x00, 0x80, 0xc3, 0xe9, 0xff, 0x22, 0x0a])]) + data[at:]
    return data


def _arrow_column(vals: list[Any]):
    """A typed Arrow column of ``vals``, its type chosen here (never by Arrow's inference, whose
    failures on mixed values this process should not go through thousands of times): int64,
    float64, bool or list<int64> when every non-null value is one, else strings."""
    import pyarrow as pa

    present = [v for v in vals if v is not None]
    for typ, ok in ((pa.bool_(), lambda v: isinstance(v, bool)),
                    (pa.int64(), lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**62),
                    (pa.float64(), lambda v: isinstance(v, float)),
                    (pa.list_(pa.int64()), lambda v: isinstance(v, list) and all(
                        isinstance(x, int) and not isinstance(x, bool) for x in v))):
        if present and all(ok(v) for v in present):
            return pa.array(vals, type=typ)
    return pa.array([None if v is None else _text_value(v) for v in vals], type=pa.string())


def write_data_file(spec: dict) -> bytes:
    """The bytes of the data file ``spec`` describes (see :func:`data_cases`)."""
    rng = random.Random(spec["seed"])
    names, rows = _table(spec, rng)
    fmt = spec["format"]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = {}
        for j, n in enumerate(names):
            cols[n if n not in cols else f"{n}_{j}"] = _arrow_column([r[j] for r in rows])
        if not cols:  # a table without columns: one column of nulls under an unknown name
            cols = {"col": pa.array([None] * len(rows), type=pa.string())}
        buf = io.BytesIO()
        pq.write_table(pa.table(cols), buf)
        return buf.getvalue()
    if fmt in ("csv", "tsv"):
        out = io.StringIO()
        w = csv.writer(out, delimiter="," if fmt == "csv" else "\t", lineterminator=spec["newline"])
        if spec["header"]:
            w.writerow(names)
        for r in rows:
            w.writerow([_text_value(v) for v in r])
        text = out.getvalue()
        if spec["broken"] and rows:
            text += '"unclosed quote, 1' + spec["newline"]
    elif fmt == "jsonl":
        lines = [json.dumps(dict(zip(names, r)), ensure_ascii=rng.random() < 0.5) for r in rows]
        if spec["broken"]:
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(["{", "[1, 2]", "null", "not json"]))
        text = spec["newline"].join(lines) + (spec["newline"] if lines else "")
    elif fmt == "json":
        shape = rng.choice(["records", "columns", "wrapped"])
        if shape == "records":
            obj: Any = [dict(zip(names, r)) for r in rows]
        elif shape == "columns":
            obj = {n: [r[j] for r in rows] for j, n in enumerate(names)}
        else:
            obj = {"data": [dict(zip(names, r)) for r in rows]}
        text = json.dumps(obj)
        if spec["broken"]:
            text = text[:max(1, len(text) // 2)]
    else:  # txt
        text = spec["newline"].join(" ".join(_text_value(v) for v in r) for r in rows)
    return _encode(text, spec["encoding"], rng, spec["corrupt"])


@st.composite
def data_cases(draw) -> Case:
    fmt = draw(st.sampled_from(FORMATS))
    n_cols = draw(st.integers(0, 4))
    columns = [(draw(st.sampled_from(COLUMN_NAMES)), draw(st.sampled_from(COLUMN_KINDS)))
               for _ in range(n_cols)]
    if draw(st.integers(0, 2)):  # 2 in 3: a plausible text + label pair, then broken elsewhere
        columns = [("text", "text"), (draw(st.sampled_from(["label", "y", "target", "lab"])),
                                      draw(st.sampled_from(COLUMN_KINDS)))] + columns[:1]
    spec = {
        "format": fmt, "columns": columns, "rows": draw(st.sampled_from([30, 60, 30, 60, 10, 9, 3, 2, 1, 0])),
        "seed": draw(st.integers(0, 2**31)),
        "huge": draw(st.sampled_from([0] * 12 + [100_001, 250_000])),
        "encoding": draw(st.sampled_from(["utf-8"] * 10 + ["utf-8-sig", "utf-16", "latin-1", "cp1252"])),
        "corrupt": draw(st.sampled_from([0] * 12 + [1, 3])),
        "header": draw(st.sampled_from([True] * 5 + [False])),
        "broken": draw(st.sampled_from([False] * 6 + [True])),
        "newline": draw(st.sampled_from(["\n", "\n", "\r\n"])),
    }
    clean = draw(st.integers(0, 3)) == 0  # 1 in 4: only the columns and their values are odd
    if clean:
        spec.update(rows=max(spec["rows"], 30), huge=0, encoding="utf-8", corrupt=0, header=True,
                    broken=False)
    dataset: dict[str, Any] = {"name": "{dir}/data." + fmt,
                               "vocab_size": draw(st.sampled_from([300, 1000] * 4 + [64])),
                               "max_len": draw(st.sampled_from([16, 32, 4]))}
    for key, choices in (("text_column", ["text", "sentence", "missing", ""]),
                         ("label_column", ["label", "y", "missing", "text"]),
                         ("tokenizer", ["bpe", "wordpiece", "char"])):
        if draw(st.integers(0, 3)) == 0 and not clean:
            dataset[key] = draw(st.sampled_from(choices))
    if clean:
        dataset["vocab_size"] = 300
    space = copy.deepcopy(TINY)
    del space["dataset"]["max_train_samples"]
    space["dataset"] = dataset
    task = draw(st.sampled_from(["classification"] * 3 + ["lm", None]))
    if task is None:
        del space["task"]
    elif task == "lm":
        space["task"] = "lm"
        space["objectives"] = [{"metric": "perplexity", "mode": "min"},
                               {"metric": "flops_per_sample", "mode": "min"}]
        del space["constraints"]
    what = (f"{fmt} {spec['rows']} rows, columns {columns}, {spec['encoding']}"
            + (f", {spec['corrupt']} stray bytes" if spec["corrupt"] else "")
            + (f", a {spec['huge']:,}-char row" if spec["huge"] else "")
            + (", no header" if not spec["header"] else "") + (", broken" if spec["broken"] else "")
            + f"; dataset {dict((k, v) for k, v in dataset.items() if k != 'name')}, task {task}")
    files = {f"data.{fmt}": write_data_file(spec), "space.yaml": _dump(space).encode()}
    return Case("data_file", what, files, ["check", "{dir}/space.yaml"], {"format": fmt})


# ---------------------------------------------------------------------- running a case
@dataclass
class Outcome:
    """What one case did: ``verdict`` is ``ok`` (exit 0), ``error_line`` (exit 2, one
    ``error:`` line) or a broken property: ``traceback``, ``hang``, ``lines`` (exit 2 but not
    exactly one ``error:`` line), ``exit_code`` (another code), ``wrote`` (files appeared or
    changed outside the run directory)."""

    kind: str
    what: str
    verdict: str
    code: Any
    seconds: float
    stderr: str
    detail: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return self.verdict not in ("ok", "error_line")


class _Hang(BaseException):
    """Raised by SIGALRM in a case that ran past :data:`HANG_S`."""


@contextlib.contextmanager
def _captured_fds():
    """Capture file descriptors 1 and 2 (what C code, logging handlers bound to the real
    streams and subprocesses write) into temporary files; yields a dict filled on exit."""
    got: dict[str, str] = {}
    files = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
    saved = {}
    for fd, f in files.items():
        saved[fd] = os.dup(fd)
        os.dup2(f.fileno(), fd)
    try:
        yield got
    finally:
        for fd, f in files.items():
            with contextlib.suppress(Exception):
                (sys.stdout if fd == 1 else sys.stderr).flush()
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
            f.seek(0)
            got[fd] = f.read().decode("utf-8", errors="replace")
            f.close()


def run_cli_inprocess(argv: list[str], cwd: Path, timeout_s: float = HANG_S) -> tuple[Any, str, str, float, str]:
    """``archsearch ARGV`` through :func:`archsearch.cli.main` in this process, in ``cwd``.

    Returns:
        ``(code, stdout, stderr, seconds, trace)``: ``code`` the exit code, ``"traceback"``
        (an exception escaped ``main``: ``trace`` holds it) or ``"hang"`` (past ``timeout_s``;
        SIGALRM, so the main thread only).
    """
    from archsearch import cli

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    trace = ""

    def alarm(signum, frame):
        raise _Hang()

    old_handler = signal.signal(signal.SIGALRM, alarm)
    t0 = time.perf_counter()
    code: Any = 0
    try:
        os.chdir(cwd)
        sys.argv = ["archsearch", *argv]
        with _captured_fds() as fds, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                cli.main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except _Hang:
                code = "hang"
            except Exception:
                code, trace = "traceback", traceback.format_exc()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        sys.argv = old_argv
        os.chdir(old_cwd)
    seconds = time.perf_counter() - t0
    return code, out.getvalue() + fds.get(1, ""), err.getvalue() + fds.get(2, ""), seconds, trace


def _listing(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def judge(kind: str, what: str, code: Any, stderr: str, seconds: float, trace: str,
          wrote: list[str]) -> Outcome:
    """The property for one case (see :class:`Outcome` for the verdicts)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if code == "hang" or seconds > HANG_S:
        return Outcome(kind, what, "hang", code, seconds, stderr)
    if code == "traceback" or "Traceback (most recent call last)" in stderr:
        return Outcome(kind, what, "traceback", code, seconds, stderr, trace or stderr[-3000:])
    if wrote:
        return Outcome(kind, what, "wrote", code, seconds, stderr, ", ".join(wrote[:5]))
    if code == 0:
        return Outcome(kind, what, "ok", code, seconds, stderr)
    if code == 2:
        if len(lines) == 1 and lines[0].startswith("error: "):
            return Outcome(kind, what, "error_line", code, seconds, stderr)
        return Outcome(kind, what, "lines", code, seconds, stderr)
    return Outcome(kind, what, "exit_code", code, seconds, stderr)


def run_case(case: Case, scratch: Path, *, timeout_s: float = HANG_S) -> Outcome:
    """Write ``case``'s files into a new directory under ``scratch``, run its CLI arguments
    there in-process, judge the property, remove the directory."""
    d = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    try:
        for name, data in case.files.items():
            if name.endswith(".yaml"):
                data = data.replace(b"{dir}", str(d).encode())
            (d / name).write_bytes(data)
        before = _listing(d)
        argv = [a.replace("{dir}", str(d)) for a in case.argv]
        code, _, stderr, seconds, trace = run_cli_inprocess(argv, d, timeout_s)
        after = _listing(d)
        wrote = sorted(k for k in after if before.get(k) != after[k])
        out = judge(case.kind, case.what, code, stderr, seconds, trace, wrote)
        out.meta = dict(case.meta)
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def checkout_entries() -> set[str]:
    """What a case could leave in the checkout, compared before and after a fuzz run: the
    top level's entries and everything under ``runs/``, ``reports/`` and ``.hypothesis/``
    (where a search, a report or Hypothesis would write). Not ``git status``: other people's
    edits to the checkout during the run are not the fuzzer's."""
    out = {p.name for p in ROOT.iterdir()}
    for sub in ("runs", "reports", ".hypothesis"):
        if (ROOT / sub).is_dir():
            out |= {str(p.relative_to(ROOT)) for p in (ROOT / sub).rglob("*")}
    return out


@contextlib.contextmanager
def sandbox_env(scratch: Path, cache: Path | None = None):
    """Environment of a fuzz run: the caches under ``scratch`` (``cache``: an ``ARCHSEARCH_CACHE``
    to use instead), the Hugging Face Hub offline."""
    saved = {k: os.environ.get(k) for k in ("ARCHSEARCH_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE",
                                            "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["ARCHSEARCH_CACHE"] = str(cache or scratch / "cache")
    os.environ["HF_DATASETS_CACHE"] = str(scratch / "hf-datasets")
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[k] = "1"
    old_ds_cache = None
    if "datasets" in sys.modules:  # already imported: it read HF_DATASETS_CACHE then
        import datasets.config as dconf

        old_ds_cache, dconf.HF_DATASETS_CACHE = dconf.HF_DATASETS_CACHE, Path(scratch / "hf-datasets")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if old_ds_cache is not None:
            import datasets.config as dconf

            dconf.HF_DATASETS_CACHE = old_ds_cache


# ---------------------------------------------------------------------- the benchmark
def fuzz(strategy, n: int, scratch: Path, seed: int, outcomes: list[Outcome]) -> None:
    """Run ``n`` cases drawn from ``strategy`` (generation only, no shrinking: every outcome is
    recorded, none raises), appending to ``outcomes``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(case):
        outcomes.append(run_case(case, scratch))
        done = len(outcomes)
        if done % 100 == 0:
            broken = sum(o.broken for o in outcomes)
            print(f"  {done} cases, {broken} broken", file=sys.stderr, flush=True)

    one()


def impossible_resources_exit_s(scratch: Path) -> tuple[float, str, int]:
    """Wall seconds of ``archsearch search`` (a subprocess, local Ray) on the tiny space with
    ``cpus_per_trial: 1e9``, its data prepared first; and its stderr and exit code."""
    d = scratch / "resources"
    d.mkdir(exist_ok=True)
    (d / "warm.yaml").write_text(_dump(TINY))
    spec = copy.deepcopy(TINY)
    spec["budget"]["cpus_per_trial"] = 1e9
    (d / "space.yaml").write_text(_dump(spec))
    cli = [sys.executable, "-m", "archsearch.cli"]
    subprocess.run([*cli, "check", "warm.yaml"], cwd=d, capture_output=True, timeout=600)
    t0 = time.perf_counter()
    proc = subprocess.run([*cli, "search", "space.yaml", "--no-progress", "--no-ray-dashboard",
                           "--storage", "runs", "--reports", "reports"], cwd=d,
                          capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t0, proc.stderr, proc.returncode


def table(outcomes: list[Outcome], by: str | None = None) -> dict[str, dict[str, int]]:
    """``{kind: {verdict: count, "tried": n}}``; with ``by``, rows are ``KIND/META`` for the
    case's ``meta[by]`` (e.g. ``data_file/parquet``)."""
    out: dict[str, dict[str, int]] = {}
    for o in outcomes:
        if by is not None and by not in o.meta:
            continue
        key = o.kind if by is None else f"{o.kind}/{o.meta[by]}"
        row = out.setdefault(key, {"tried": 0})
        row["tried"] += 1
        row[o.verdict] = row.get(o.verdict, 0) + 1
    return dict(sorted(out.items()))


def build(summary: dict[str, Any], prov: dict[str, Any], *, record_reads: bool = True,
          **rest: Any) -> dict[str, Any]:
    """The result in the one schema: :data:`TARGETS` evaluated on ``summary``; ``rest``: the
    case tables, the failures. Reads no test split."""
    return build_result(summary, prov, name="fuzz.json", targets=TARGETS, record_reads=record_reads, **rest)


def run(args: argparse.Namespace) -> int:
    """The fuzz campaign (see the module docstring); writes ``args.out``."""
    t0 = time.time()
    scratch = Path(tempfile.mkdtemp(prefix="archsearch-fuzz-"))
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(scratch / "hypothesis")  # not .hypothesis/ in the working directory
    checkout_before = checkout_entries()
    outcomes: list[Outcome] = []
    warm: dict[str, float] = {}
    try:
        with sandbox_env(scratch):
            bases = base_spaces()
            for name, spec in bases.items():  # prepare every base's data once: not a case
                case = Case("warm", name, {"space.yaml": _dump(spec).encode()}, ["check", "{dir}/space.yaml"])
                w = run_case(case, scratch, timeout_s=1800)
                warm[name] = round(w.seconds, 1)
                print(f"warm {name}: {w.verdict} in {w.seconds:.1f} s {w.stderr.strip()[:200]}",
                      file=sys.stderr, flush=True)
            for label, strategy, n, s in (("space", space_cases(bases), args.spaces, args.seed),
                                          ("fixed", fixed_cases(), args.fixed, args.seed + 1),
                                          ("data_file", data_cases(), args.data_files, args.seed + 2)):
                print(f"{label}: {n} cases", file=sys.stderr, flush=True)
                fuzz(strategy, n, scratch, s, outcomes)
        resources_s, resources_err, resources_code = impossible_resources_exit_s(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    polluted = sorted(checkout_entries() - checkout_before)

    by_kind = table(outcomes)
    summary = {
        "spaces_tried": by_kind.get("space", {}).get("tried", 0),
        "data_files_tried": by_kind.get("data_file", {}).get("tried", 0),
        "tracebacks": sum(o.verdict == "traceback" for o in outcomes),
        "hangs": sum(o.verdict == "hang" for o in outcomes),
        "impossible_resources_exit_s": round(resources_s, 2),
    }
    failures = [{"kind": o.kind, "verdict": o.verdict, "case": o.what, "code": o.code,
                 "seconds": round(o.seconds, 2), "stderr": o.stderr[-1500:], "detail": o.detail[-3000:]}
                for o in outcomes if o.broken]
    seconds = sorted(o.seconds for o in outcomes)
    prov = provenance(seeds={"space": args.seed, "fixed": args.seed + 1, "data_file": args.seed + 2},
                      wall_s=time.time() - t0)
    write_json(args.out, build(
                 summary, prov,
                 cases=by_kind,
                 cases_by={"space_base": table(outcomes, "base"),
                           "space_text_mutation": table(outcomes, "text"),
                           "fixed_form": table(outcomes, "form"),
                           "data_format": table(outcomes, "format")},
                 broken_total=len(failures),
                 checkout_files_added=polluted,
                 case_seconds={"median": round(seconds[len(seconds) // 2], 3) if seconds else None,
                               "max": round(seconds[-1], 2) if seconds else None},
                 warm_up_s=warm,
                 impossible_resources={"exit_code": resources_code, "stderr": resources_err.strip()},
                 failures=failures[:200]))
    print(json.dumps({"summary": summary, "cases": by_kind, "broken": len(failures),
                      "checkout_files_added": polluted}, indent=1))
    return 0


def results(args: argparse.Namespace) -> dict[Path, dict[str, Any]]:
    """The stored result restated through :func:`build` (nothing fuzzed)."""
    return {OUT: restate(OUT, build, record_reads=not args.check)}


def _arguments(p: argparse.ArgumentParser) -> None:
    if p.prog.split()[-1] == "run":
        p.add_argument("--spaces", type=int, default=2400)
        p.add_argument("--fixed", type=int, default=300)
        p.add_argument("--data-files", type=int, default=600)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", type=Path, default=OUT)


COMMAND = Command(__doc__.split("\n\n")[0].replace("\n", " "), run=run, results=results,
                  add_arguments=_arguments)


def main(argv: list[str] | None = None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
