"""Load a dataset by name as a Hugging Face :class:`datasets.DatasetDict` with standard columns
(:func:`load`, exported as :func:`archsearch.data.load`), and the standardisation it applies.

A dataset is named in one of three ways (tried in this order by
:func:`archsearch.data.names.resolve`):

1. a bundled name: ``rotten_tomatoes_sentences`` (default) or ``shakespeare``
   (see :func:`archsearch.data.list_datasets` and ``bundled/PROVENANCE.md``);
2. a local path: a ``.csv``, ``.tsv``, ``.json``, ``.jsonl``, ``.parquet`` or ``.txt`` file, or a
   directory (written by ``DatasetDict.save_to_disk``, or holding such files named by split,
   e.g. ``train.csv`` / ``test.csv``);
3. a Hugging Face Hub dataset: ``imdb``, ``user/name``, or ``name:config`` (``glue:sst2``),
   loaded with ``datasets.load_dataset``. Without network this fails within seconds with a
   :class:`~archsearch.errors.UserError`; with ``HF_HUB_OFFLINE=1`` only the local HF cache is used.

Whatever the source, :func:`load` returns splits ``train``, ``validation`` and, when there is one,
``test``, with the column ``text`` (str) and, for classification, ``label`` (a
:class:`datasets.ClassLabel`, values ``0..C-1``). All other columns are dropped.

Local files are checked before ``datasets`` reads them (:mod:`archsearch.data.sources`), each
mistake reported as one :class:`~archsearch.errors.UserError` line naming the file and the field:
an empty file, a CSV/TSV with a header but no rows, and text files (``.csv .tsv .json .jsonl
.txt``) that are not UTF-8 (the line and column of the first bad byte are named). For classification, a text longer than
:data:`MAX_TEXT_CHARS` characters in one row is refused (row and column named), whatever the
source: it is never silently cut (such a row is almost always a broken file, e.g. an unclosed
quote in a CSV that swallowed the rows after it).

The names and the bundled datasets' facts are :mod:`archsearch.data.names`, the raw loaders
:mod:`archsearch.data.sources`; here the standardisation (columns, labels, splits) and :func:`load`.
``datasets`` and ``huggingface_hub`` are imported inside the functions, so importing this module is
cheap.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

from archsearch.data.names import _BUNDLED, DEFAULT_DATASET, SPLITS, _check_task, resolve
from archsearch.data.sources import _load_bundled, _load_dir, _load_file, _load_hub, _quiet_datasets
from archsearch.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import datasets

#: Seed of the permutation that cuts the splits a source lacks (:func:`_cut`).
SPLIT_SEED = 0
#: Column names tried, in order, when ``text_column`` / ``label_column`` are not given.
TEXT_CANDIDATES = ("text", "sentence", "content", "review", "document", "tweet", "comment")
LABEL_CANDIDATES = ("label", "labels", "class", "target", "category", "y")
_SPLIT_ALIASES = {"valid": "validation", "val": "validation", "dev": "validation", "eval": "validation"}
MAX_CLASSES = 1000
#: Classification: most characters one row's text may have. Tokenised inputs are at most
#: ``max_len`` <= 8192 tokens, far below this, so a longer text is a broken file, not a sample.
MAX_TEXT_CHARS = 100_000


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
