"""Tokenise a dataset once, cache the tensors, and hand them to training as :class:`PreparedData`.

Cache layout (``cache_dir``, default ``$ARCHSEARCH_CACHE`` or ``~/.cache/archsearch``)::

    prepared/<dataset>-<tokenizer>-<key>.pt               tensors + metadata (torch.save)
    prepared/<dataset>-<tokenizer>-<key>.tokenizer.json   the trained tokenizer (bpe/wordpiece/char)
    prepared/<dataset>-<tokenizer>-<key>.lock             file lock held while building

``key`` hashes the dataset identity (bundled file sha256s; local files' path, size and mtime;
Hub id), the column/task arguments, the tokenizer (kind, or the checkpoint files' names, sizes,
mtimes), ``vocab_size`` and ``max_len``. Files are written to a temporary name and moved into place
with ``os.replace``, and building holds a file lock, so concurrent Ray trials tokenise once and
never read a half-written file. A second :func:`prepare` with the same arguments only reads the
``.pt`` file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from archsearch.data.names import DEFAULT_DATASET, SPLITS, _check_task, dataset_fingerprint
from archsearch.data.standardise import load
from archsearch.data.tokenizer import (
    CharTokenizer,
    TextTokenizer,
    build_tokenizer,
    check_tokenizer_arg,
    load_tokenizer,
    pretrained_dir,
    pretrained_identity,
)
from archsearch.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import torch

CACHE_FORMAT = 1
MIN_VOCAB = {"bpe": 260, "wordpiece": 32}  # byte-level BPE needs the 256 bytes + 4 specials


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` if given, else ``$ARCHSEARCH_CACHE``, else ``~/.cache/archsearch``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ARCHSEARCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "archsearch"


@dataclass
class ClassificationSplit:
    """One split of a classification dataset, as tensors.

    Attributes:
        input_ids: LongTensor (N, max_len): token ids, right-padded with ``pad_id``, truncated to
            ``max_len`` (a trained tokenizer puts ``<cls>`` first; a pretrained one its own
            specials, e.g. ``[CLS] ... [SEP]``).
        attention_mask: BoolTensor (N, max_len): True on real tokens, False on padding.
        labels: LongTensor (N,): class ids in ``0..n_classes-1``.
    """

    input_ids: "torch.Tensor"
    attention_mask: "torch.Tensor"
    labels: "torch.Tensor"

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def lengths(self) -> "torch.Tensor":
        """LongTensor (N,): number of real tokens per row."""
        return self.attention_mask.sum(dim=1)


Split = Union[ClassificationSplit, "torch.Tensor"]


@dataclass
class PreparedData:
    """A tokenised dataset ready for training.

    Attributes:
        name: the dataset name/path given to :func:`prepare`.
        task: ``"classification"`` or ``"lm"``.
        vocab_size: actual vocabulary size (rows of the embedding table).
        pad_id: padding id (classification inputs; never in an LM stream).
        max_len: classification: sequence length of ``input_ids``; lm: suggested block size.
        n_classes: number of classes (classification), else None.
        label_names: class names, index = label id (classification), else None.
        tokenizer: ``"bpe"``, ``"wordpiece"``, ``"char"`` or the pretrained checkpoint path.
        tokenizer_file: where the tokenizer is stored (the checkpoint dir for pretrained).
        data: ``{split: ClassificationSplit}`` or, for lm, ``{split: LongTensor (n_tokens,)}``, a
            1-D stream where documents are separated by ``<eos>`` (char: a newline).
        stats: per split counts: ``rows``, ``tokens``, ``n_truncated`` (classification rows longer
            than ``max_len`` before truncation), ``mean_len``, ``label_counts``.
        cache_path: the ``.pt`` cache file.
        from_cache: True when this call read the cache instead of tokenising.
        seconds: wall time of this :func:`prepare` call.
    """

    name: str
    task: str
    vocab_size: int
    pad_id: int
    max_len: int
    n_classes: int | None
    label_names: list[str] | None
    tokenizer: str
    tokenizer_file: str | None
    data: dict[str, Split]
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_path: Path | None = None
    from_cache: bool = False
    seconds: float = 0.0

    def splits(self) -> list[str]:
        """Split names in order: ``train``, ``validation``[, ``test``]."""
        return [s for s in SPLITS if s in self.data]

    def __getitem__(self, split: str) -> Split:
        return self.data[split]

    @property
    def train(self) -> Split:
        return self.data["train"]

    @property
    def validation(self) -> Split:
        return self.data["validation"]

    @property
    def test(self) -> Split | None:
        """The test split, or None when the dataset has none."""
        return self.data.get("test")

    def load_tokenizer(self) -> TextTokenizer:
        """The tokenizer that produced the ids (loaded from ``tokenizer_file``)."""
        kind = self.tokenizer if self.tokenizer in ("bpe", "wordpiece", "char") else "pretrained"
        return load_tokenizer(kind, self.tokenizer_file)

    def decode(self, ids) -> str:
        """Token ids (any iterable / 1-D tensor) -> text, special tokens dropped."""
        if not hasattr(self, "_tok"):
            self._tok = self.load_tokenizer()
        return self._tok.decode(ids.tolist() if hasattr(ids, "tolist") else ids)


def pad_encoded(tok: TextTokenizer, ids_list, max_len: int):
    """Token ids of texts (``tok.encode_batch``, no special tokens) as the model's classification
    inputs: the tokenizer's prefix, the text's ids cut to what ``max_len`` leaves, its suffix,
    then ``pad_id`` to ``max_len`` (how :func:`prepare` encodes every split, and how an exported
    model encodes new text: :mod:`archsearch.export`).

    Returns:
        ``(input_ids, attention_mask)``: ``N x max_len`` int64 and bool (True = real token).
    """
    import numpy as np
    import torch

    room = max_len - len(tok.prefix) - len(tok.suffix)
    arr = np.full((len(ids_list), max_len), tok.pad_id, dtype=np.int64)
    lengths = np.empty(len(ids_list), dtype=np.int64)
    for i, ids in enumerate(ids_list):
        seq = tok.prefix + list(ids[:room]) + tok.suffix
        arr[i, :len(seq)] = seq
        lengths[i] = len(seq)
    mask = torch.arange(max_len)[None, :] < torch.from_numpy(lengths)[:, None]
    return torch.from_numpy(arr), mask


def _slug(name: str) -> str:
    """Readable file-name part: a path's last component, or the name (``/`` -> ``__``)."""
    path_like = name.startswith((".", "/", "~")) or bool(Path(name).suffix) or os.sep in name
    base = Path(name.rstrip("/" + os.sep)).name if path_like else name.replace("/", "__")
    return re.sub(r"[^\w.-]+", "_", base)[:40] or "dataset"


def _atomic(path: Path, write) -> None:
    """``write(tmp)`` to a unique temp file beside ``path``, then ``os.replace`` it into place:
    concurrent trials building the same cache entry never see a partial file."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic(path, lambda tmp: tmp.write_bytes(data))


def _atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    _atomic(path, lambda tmp: torch.save(obj, tmp))


def prepare(
    name: str = DEFAULT_DATASET,
    *,
    vocab_size: int = 8000,
    max_len: int = 48,
    tokenizer: str | None = None,
    cache_dir: str | Path | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    task: str | None = None,
) -> PreparedData:
    """Load, tokenise and tensorise a dataset, with an on-disk cache.

    Args:
        name: as :func:`archsearch.data.load` (bundled name, local path or Hub id).
        vocab_size: target vocabulary size for trained ``bpe``/``wordpiece`` tokenizers (incl. 4
            special tokens; the actual size, possibly smaller, is ``PreparedData.vocab_size``).
            Ignored by ``char`` and pretrained tokenizers.
        max_len: classification sequence length in tokens (incl. special tokens); longer
            sequences are truncated, shorter ones right-padded. For lm: recorded as the suggested
            block size only.
        tokenizer: ``"bpe"``, ``"wordpiece"``, ``"char"``, or a pretrained checkpoint directory.
            Default (None): ``"char"`` for language modelling, ``"bpe"`` for classification.
            Trained tokenizers see the train split only.
        cache_dir: cache root (default ``$ARCHSEARCH_CACHE`` or ``~/.cache/archsearch``).
        text_column, label_column, task: as :func:`archsearch.data.load`.

    Returns:
        :class:`PreparedData`. Classification: per split ``input_ids`` (N, max_len) int64,
        ``attention_mask`` (N, max_len) bool, ``labels`` (N,) int64. lm: per split a 1-D int64 stream.

    Raises:
        UserError: anything :func:`load` raises; bad ``tokenizer``, ``vocab_size`` or ``max_len``.
    """
    from filelock import FileLock

    t0 = time.perf_counter()
    _check_task(task)
    kind = check_tokenizer_arg(tokenizer) if tokenizer is not None else None
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 2:
        raise UserError(f"max_len must be an integer >= 2, got {max_len!r}", field="max_len")
    min_vocab = MIN_VOCAB.get(kind or "bpe", 32)
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < min_vocab:
        raise UserError(f"vocab_size must be an integer >= {min_vocab} for the {kind or 'bpe'} "
                        f"tokenizer, got {vocab_size!r}", field="vocab_size")
    name = os.fspath(name)
    tok_path = pretrained_dir(tokenizer) if kind == "pretrained" else None  # a dir or Hub snapshot
    key_obj = {
        "format": CACHE_FORMAT,
        "dataset": dataset_fingerprint(name),
        "text_column": text_column, "label_column": label_column, "task": task,
        "tokenizer": kind or "auto",
        "tokenizer_files": pretrained_identity(Path(tok_path)) if tok_path else None,
        "tokenizer_path": tok_path,
        "vocab_size": vocab_size, "max_len": max_len,
    }
    key = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()[:20]
    root = cache_root(cache_dir) / "prepared"
    root.mkdir(parents=True, exist_ok=True)
    stem = f"{_slug(name)}-{'pretrained' if tok_path else (kind or 'auto')}-{key}"
    pt_path = root / f"{stem}.pt"

    data = _read_cache(pt_path, name, max_len)
    if data is None:
        with FileLock(str(root / f"{stem}.lock")):
            data = _read_cache(pt_path, name, max_len)  # another process may have built it
            if data is None:
                obj = _build(name, kind, tok_path, vocab_size, max_len, root / f"{stem}.tokenizer.json",
                             text_column=text_column, label_column=label_column, task=task)
                obj["meta"]["key"] = key_obj
                _atomic_torch_save({"meta": json.dumps(obj["meta"]), "tensors": obj["tensors"]}, pt_path)
                data = _from_obj(obj["meta"], obj["tensors"], name, max_len, root)
                data.from_cache = False
    data.cache_path = pt_path
    data.seconds = time.perf_counter() - t0
    return data


def _read_cache(path: Path, name: str, max_len: int) -> PreparedData | None:
    """Load a cache entry; None if absent or unreadable (then it is rebuilt)."""
    import torch

    if not path.exists():
        return None
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
        meta = json.loads(obj["meta"])
        if meta.get("format") != CACHE_FORMAT:
            return None
        data = _from_obj(meta, obj["tensors"], name, max_len, path.parent)
    except Exception:  # truncated/corrupt file from a killed process of an older version
        return None
    data.from_cache = True
    return data


def _from_obj(meta: dict, tensors: dict, name: str, max_len: int, root: Path) -> PreparedData:
    splits: dict[str, Split] = {}
    for split in meta["splits"]:
        if meta["task"] == "classification":
            splits[split] = ClassificationSplit(
                input_ids=tensors[f"{split}.input_ids"],
                attention_mask=tensors[f"{split}.attention_mask"],
                labels=tensors[f"{split}.labels"],
            )
        else:
            splits[split] = tensors[f"{split}.stream"]
    return PreparedData(
        name=name, task=meta["task"], vocab_size=meta["vocab_size"], pad_id=meta["pad_id"],
        max_len=max_len, n_classes=meta["n_classes"], label_names=meta["label_names"],
        tokenizer=meta["tokenizer"], tokenizer_file=str(root / meta["tokenizer_file"]), data=splits,
        stats=meta["stats"],
    )


def _build(name: str, kind: str | None, tok_path: str | None, vocab_size: int, max_len: int,
           tok_file: Path, **load_kwargs) -> dict:
    """Load the dataset, train/load the tokenizer, tokenise every split; return meta + tensors."""
    import numpy as np
    import torch

    dd = load(name, **load_kwargs)
    task = "classification" if "label" in dd["train"].column_names else "lm"
    kind = kind or ("char" if task == "lm" else "bpe")
    train_texts = list(dd["train"]["text"])
    tok = build_tokenizer(kind, train_texts, vocab_size, tok_path)
    if kind != "pretrained":
        _atomic(tok_file, tok.save)

    tensors: dict[str, torch.Tensor] = {}
    stats: dict[str, dict[str, Any]] = {}
    label_names = None
    if task == "classification":
        label_names = list(dd["train"].features["label"].names)
        room = max_len - len(tok.prefix) - len(tok.suffix)
        if room < 1:
            raise UserError(f"max_len={max_len} leaves no room for text after the tokenizer's "
                            f"{len(tok.prefix) + len(tok.suffix)} special tokens", field="max_len")
        for split, ds in dd.items():
            texts = train_texts if split == "train" else list(ds["text"])
            ids_list = tok.encode_batch(texts)
            n = len(ids_list)
            ids, mask = pad_encoded(tok, ids_list, max_len)
            n_trunc = sum(len(x) > room for x in ids_list)
            lengths = mask.sum(1).numpy()
            labels = np.asarray(ds["label"], dtype=np.int64)
            tensors[f"{split}.input_ids"] = ids
            tensors[f"{split}.attention_mask"] = mask
            tensors[f"{split}.labels"] = torch.from_numpy(labels)
            n_special = len(tok.prefix) + len(tok.suffix)
            stats[split] = {
                "rows": n, "tokens": int(lengths.sum()), "n_truncated": n_trunc,
                "mean_len": float(lengths.mean()) if n else 0.0,
                "full_len_mean": float(np.mean([len(x) for x in ids_list]) + n_special) if n else 0.0,
                "label_counts": np.bincount(labels, minlength=len(label_names)).tolist(),
            }
    else:
        sep = np.asarray(tok.doc_sep, dtype=np.int64)
        for split, ds in dd.items():
            texts = train_texts if split == "train" else list(ds["text"])
            if isinstance(tok, CharTokenizer):
                parts = [tok.encode(t) for t in texts]
            else:
                parts = [np.asarray(ids, dtype=np.int64) for ids in tok.encode_batch(texts)]
            pieces = [p for part in parts for p in (part, sep)]
            stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
            tensors[f"{split}.stream"] = torch.from_numpy(stream.astype(np.int64, copy=False))
            stats[split] = {"rows": len(texts), "tokens": int(stream.size),
                            "chars": int(sum(len(t) for t in texts))}
            if isinstance(tok, CharTokenizer):
                stats[split]["unk"] = int((stream == 1).sum())
    meta = {
        "format": CACHE_FORMAT, "task": task, "vocab_size": int(tok.vocab_size),
        "pad_id": int(tok.pad_id), "n_classes": len(label_names) if label_names else None,
        "label_names": label_names, "tokenizer": tok_path or kind,
        "tokenizer_file": tok_path or tok_file.name, "splits": list(dd.keys()), "stats": stats,
    }
    return {"meta": meta, "tensors": tensors}


#: A :func:`prepare` argument -> the search-space field it comes from (errors name that field).
SPACE_FIELDS = {"vocab_size": "dataset.vocab_size", "max_len": "dataset.max_len",
                "tokenizer": "dataset.tokenizer", "text_column": "dataset.text_column",
                "label_column": "dataset.label_column", "dataset": "dataset.name", "task": "task"}


def prepare_for_space(space) -> PreparedData:
    """The prepared (tokenized, cached) dataset of a search space: ``space.dataset`` with its
    ``max_train_samples`` cut: a fixed random subset of the training split (seed 0, in the split's
    order), for quick runs and tests -- not a prefix: bundled splits may be ordered (the first
    1,600 rows of rotten_tomatoes_sentences are 97% positive). For ``lm`` the cut is a prefix
    of the token stream.

    Raises:
        UserError: the dataset cannot be loaded, or its task is not the space's ``task``; a
            mistake in an argument (``vocab_size`` too small for the tokenizer...) names the
            space file and its field (:data:`SPACE_FIELDS`).
    """
    import dataclasses

    ds = space.dataset
    try:
        data = prepare(ds.name, vocab_size=ds.vocab_size, max_len=ds.max_len, tokenizer=ds.tokenizer,
                       text_column=ds.text_column, label_column=ds.label_column, task=space.task)
    except UserError as e:  # an argument's mistake: it is the space file's field
        if e.file is None and e.field in SPACE_FIELDS:
            raise UserError(e.message, file=space.source, field=SPACE_FIELDS[e.field]) from None
        raise
    if data.task != space.task:
        raise UserError(f"dataset {ds.name!r} is a {data.task} dataset but the space's task is "
                        f"{space.task!r}", file=space.source, field="task")
    n = ds.max_train_samples
    if n is None:
        return data
    train = data.train
    if data.task == "lm":
        train = train[:n]
    elif n < len(train.labels):
        import torch

        idx = torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(0))[:n].sort().values
        train = dataclasses.replace(train, input_ids=train.input_ids[idx],
                                    attention_mask=train.attention_mask[idx], labels=train.labels[idx])
    return dataclasses.replace(data, data={**data.data, "train": train})
