"""Tokenizers used by :func:`archsearch.data.prepare`.

Three kinds, one small interface (:class:`TextTokenizer`):

- ``"bpe"``: byte-level BPE trained with Hugging Face ``tokenizers`` on the train split only
  (GPT-2 style pre-tokenisation; every byte is in the alphabet, so no unknown tokens);
- ``"wordpiece"``: lower-cased BERT-style WordPiece trained on the train split;
- ``"char"``: one id per character seen in the train split (others map to ``<unk>``);
- a path to a pretrained checkpoint directory: ``transformers.AutoTokenizer`` with
  ``local_files_only=True`` (nothing is downloaded), any family ``AutoTokenizer`` knows (BERT
  WordPiece, RoBERTa byte-level BPE, DistilBERT...);
- a Hugging Face Hub model id (``prajjwal1/bert-tiny``): its tokenizer files, from the Hugging
  Face cache or downloaded into it (:func:`archsearch.hub.local_or_hub`; never with
  ``HF_HUB_OFFLINE`` set), then as a directory.

Trained tokenizers reserve ids ``0..3`` for ``<pad> <unk> <cls> <eos>``. For classification a
sequence is ``<cls> tokens...`` (pretrained: the checkpoint's own, e.g. ``[CLS] tokens [SEP]``); for
language modelling documents are joined by ``<eos>`` (``char``: by a newline character).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from archsearch.errors import UserError

SPECIALS = ("<pad>", "<unk>", "<cls>", "<eos>")
PAD, UNK, CLS, EOS = range(4)
TRAINED_KINDS = ("bpe", "wordpiece", "char")


class TextTokenizer:
    """Interface: ``encode_batch`` (no special tokens), ``decode``, ids of special tokens.

    Attributes:
        kind: ``"bpe"``, ``"wordpiece"``, ``"char"`` or ``"pretrained"``.
        vocab_size: number of ids (embedding rows needed).
        pad_id: id used for right padding.
        prefix / suffix: ids wrapped around a classification sequence.
        doc_sep: ids placed after every document in a language-modelling stream.
    """

    kind: str
    vocab_size: int
    pad_id: int
    prefix: list[int]
    suffix: list[int]
    doc_sep: list[int]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:  # pragma: no cover
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:  # pragma: no cover
        raise NotImplementedError

    def save(self, path: Path) -> None:  # pragma: no cover
        """Write the tokenizer to a single file (trained kinds only)."""
        raise NotImplementedError


class HFTrainedTokenizer(TextTokenizer):
    """A ``tokenizers.Tokenizer`` (BPE or WordPiece) trained here."""

    def __init__(self, tok, kind: str):
        self.tok = tok
        self.kind = kind
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.pad_id, self.prefix, self.suffix, self.doc_sep = PAD, [CLS], [], [EOS]

    #: Longest word (a run of non-space characters) the trainer reads: WordPiece encodes longer
    #: words as ``<unk>`` (its ``max_input_chars_per_word``, 100), and merges learnt inside one
    #: are noise, while training time grows with the word's length (a 250,000-character row
    #: took the trainer 36 s, issue 40's fuzzing).
    MAX_WORD_CHARS = 100
    _LONG_WORD = re.compile(r"\S{%d,}" % (MAX_WORD_CHARS + 1))

    @classmethod
    def train(cls, texts: Sequence[str], kind: str, vocab_size: int) -> "HFTrainedTokenizer":
        """Train on ``texts`` (the train split), words of more than :attr:`MAX_WORD_CHARS`
        characters left out. ``vocab_size`` includes the 4 special tokens."""
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        if kind == "bpe":
            tok = Tokenizer(models.BPE(unk_token=None))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        elif kind == "wordpiece":
            tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
            tok.normalizer = normalizers.BertNormalizer(lowercase=True)
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece()
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                show_progress=False)
        else:  # pragma: no cover - guarded by the caller
            raise ValueError(kind)
        tok.train_from_iterator((cls._LONG_WORD.sub(" ", t) for t in texts), trainer=trainer, length=len(texts))
        return cls(tok, kind)

    @classmethod
    def load(cls, path: Path, kind: str) -> "HFTrainedTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), kind)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, path: Path) -> None:
        path.write_text(self.tok.to_str(), encoding="utf-8")


class CharTokenizer(TextTokenizer):
    """Character vocabulary: ids ``0..3`` are specials, then the train split's characters in
    code-point order. Encoding is vectorised with numpy (5M characters in well under a second)."""

    kind = "char"

    def __init__(self, chars: Sequence[str]):
        import numpy as np

        self.chars = list(chars)
        self.vocab_size = len(SPECIALS) + len(self.chars)
        self._codepoints = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        self.pad_id, self.prefix, self.suffix = PAD, [CLS], []
        nl = self.chars.index("\n") + len(SPECIALS) if "\n" in self.chars else EOS
        self.doc_sep = [nl]

    @classmethod
    def train(cls, texts: Iterable[str]) -> "CharTokenizer":
        seen: set[str] = set()
        for t in texts:
            seen.update(t)
        return cls(sorted(seen))

    @classmethod
    def load(cls, path: Path) -> "CharTokenizer":
        return cls(json.loads(path.read_text(encoding="utf-8"))["chars"])

    def encode(self, text: str):
        """One text -> int64 numpy array of ids, shape (len(text),)."""
        import numpy as np

        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        pos = np.searchsorted(self._codepoints, cps)
        pos_c = np.minimum(pos, max(len(self._codepoints) - 1, 0))
        known = self._codepoints[pos_c] == cps if len(self._codepoints) else np.zeros(len(cps), bool)
        return np.where(known, pos_c + len(SPECIALS), UNK).astype(np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t).tolist() for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        n = len(SPECIALS)
        return "".join(self.chars[i - n] for i in map(int, ids) if i >= n)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"kind": "char", "chars": self.chars}, ensure_ascii=False),
                        encoding="utf-8")


class PretrainedTokenizer(TextTokenizer):
    """``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)``."""

    kind = "pretrained"

    def __init__(self, path: Path):
        import transformers

        self.path = Path(path)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            self.tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:
            raise UserError(f"could not load a pretrained tokenizer from this directory: "
                            f"{' '.join(str(e).split())[:300]}", file=str(path), field="tokenizer") from e
        finally:
            transformers.logging.set_verbosity(verbosity)
        tok = self.tok
        self.vocab_size = len(tok)
        with_sp = tok("a")["input_ids"]
        without = tok("a", add_special_tokens=False)["input_ids"]
        k = _find_sub(with_sp, without)
        self.prefix, self.suffix = (with_sp[:k], with_sp[k + len(without):]) if k >= 0 else ([], [])
        sep = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        self.doc_sep = [sep] if sep is not None else []
        pad = tok.pad_token_id
        self.pad_id = int(pad if pad is not None else (sep if sep is not None else 0))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "sequence longer than 512" warnings
        try:
            return self.tok(list(texts), add_special_tokens=False)["input_ids"]
        finally:
            transformers.logging.set_verbosity(verbosity)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _find_sub(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1


def check_tokenizer_arg(tokenizer: str | os.PathLike, *, file: str | None = None,
                        field: str = "tokenizer") -> str:
    """Validate the ``tokenizer`` argument; return ``"bpe"|"wordpiece"|"char"|"pretrained"``.
    A Hub model id is resolved (from the cache, else downloaded) here.

    Args:
        tokenizer: a trained kind, a checkpoint directory or a Hub model id.
        file, field: where the value came from, for the error (default: the value itself
            and ``tokenizer``).

    Raises:
        UserError: not one of the kinds, not an existing directory and not a Hub model id
            that can be had (see :func:`archsearch.hub.local_or_hub`).
    """
    t = os.fspath(tokenizer)
    if t in TRAINED_KINDS:
        return t
    from archsearch.hub import local_or_hub

    file = t if file is None else file
    try:
        p = local_or_hub(t, what="tokenizer", file=file, field=field)
    except UserError as e:  # a Hub id that cannot be had; maybe a misspelt kind
        raise UserError(f"{e.message}; the trained kinds are {', '.join(TRAINED_KINDS)}",
                        file=file, field=field) from None
    if p is not None and p.is_dir():
        return "pretrained"
    hint = " (a path that does not exist)" if p is None and ("/" in t or os.sep in t) else ""
    hint = f" ({p} is a file)" if p is not None else hint
    raise UserError(f"unknown tokenizer {t!r}{hint}; use one of {', '.join(TRAINED_KINDS)}, the "
                    "path of a pretrained checkpoint directory (with tokenizer files) or a "
                    "Hugging Face Hub model id", file=file, field=field)


def pretrained_dir(tokenizer: str | os.PathLike) -> str:
    """The absolute directory of a pretrained tokenizer: the path itself (``~`` expanded,
    resolved) or the Hub snapshot of a model id. Call :func:`check_tokenizer_arg` first.

    Raises:
        UserError: as :func:`check_tokenizer_arg`.
    """
    from archsearch.hub import local_or_hub

    t = os.fspath(tokenizer)
    p = local_or_hub(t, what="tokenizer", file=t, field="tokenizer")
    if p is None:
        check_tokenizer_arg(t)  # raises the usual error
    return str(Path(p).resolve())


def pretrained_identity(path: Path) -> list:
    """(name, size, mtime_ns) of every file at the top of a checkpoint directory."""
    out = []
    for p in sorted(Path(path).iterdir()):
        if p.is_file():
            st = p.stat()
            out.append([p.name, st.st_size, st.st_mtime_ns])
    return out


def build_tokenizer(kind: str, texts: Sequence[str], vocab_size: int,
                    path: str | None = None) -> TextTokenizer:
    """Train (``bpe``/``wordpiece``/``char``) on ``texts`` or load a pretrained one from ``path``."""
    if kind == "char":
        return CharTokenizer.train(texts)
    if kind in ("bpe", "wordpiece"):
        return HFTrainedTokenizer.train(texts, kind, vocab_size)
    return PretrainedTokenizer(Path(path))


def load_tokenizer(kind: str, file: str | Path) -> TextTokenizer:
    """Load a tokenizer saved by :meth:`TextTokenizer.save` (or a pretrained directory)."""
    if kind == "char":
        return CharTokenizer.load(Path(file))
    if kind in ("bpe", "wordpiece"):
        return HFTrainedTokenizer.load(Path(file), kind)
    return PretrainedTokenizer(Path(file))
