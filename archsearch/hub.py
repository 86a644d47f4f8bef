"""Hugging Face Hub model ids as checkpoint / tokenizer directories.

``init_from: prajjwal1/bert-tiny`` and ``dataset.tokenizer: prajjwal1/bert-tiny`` name a model
on the Hub instead of a local directory. :func:`local_or_hub` turns such a value into a local
directory: an existing directory wins; otherwise a valid Hub id
(``huggingface_hub.utils.validate_repo_id``) is resolved with
``huggingface_hub.snapshot_download`` into the ordinary Hugging Face cache (``HF_HOME`` /
``HF_HUB_CACHE``), fetching only what we read: ``config.json``, the tokenizer files and one
weight file (``model.safetensors``, else ``pytorch_model.bin``).

The cache is tried first without any network access (Ray workers resolve the same id again
and must not download); only an id missing from the cache, or cached without the files
needed, is downloaded, and never when ``HF_HUB_OFFLINE`` is set. Every failure is one
:class:`~archsearch.errors.UserError` line naming the space file and field.

Nothing heavy is imported at module level (``huggingface_hub`` only inside the functions).
Source: huggingface_hub ``_snapshot_download.py`` (cache layout ``models--ORG--NAME/refs/main``
-> ``snapshots/<commit>/``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from archsearch.errors import UserError

What = Literal["model", "tokenizer"]

#: The files a pretrained tokenizer may consist of (transformers' tokenizer classes for the
#: BERT, RoBERTa, XLM-R, CamemBERT and DistilBERT families).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
                   "sentencepiece.bpe.model", "spiece.model", "sentencepiece.model")
#: Weight files the checkpoint loader reads, in order of preference.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def is_hub_id(value: str) -> bool:
    """Whether ``value`` is a syntactically valid Hub model id (``name`` or ``org/name``);
    absolute paths, ``./x``, ``~/x`` and ``a/b/c`` are not."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not value or value.startswith(("~", "/", ".")):
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _complete(d: Path, what: What) -> str | None:
    """What ``d`` lacks for ``what`` (a short phrase), or None when it has it all."""
    if what == "model":
        if not (d / "config.json").is_file():
            return "no config.json"
        if not any((d / f).is_file() for f in WEIGHT_FILES):
            return "no model.safetensors or pytorch_model.bin"
        return None
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                                           "vocab.json")):
        return "no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.txt or vocab.json)"
    return None


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


@functools.lru_cache(maxsize=64)
def _hub_snapshot(repo_id: str, what: What) -> Path:
    """The local snapshot directory of ``repo_id`` holding what ``what`` needs; cached per
    process (only successes are cached).

    Raises:
        ValueError: the message of the one-line error (the caller adds file and field).
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    lacks = "it is not in the cache"
    try:  # the cache only: no network (allow_patterns keeps the completeness check to config)
        first = "config.json" if what == "model" else list(TOKENIZER_FILES)
        d = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=first))
        lacks = _complete(d, what)
        if lacks is None:
            return d
        lacks = f"its cached snapshot {d} has {lacks}"
    except Exception:  # LocalEntryNotFoundError, IncompleteSnapshotError
        pass
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{repo_id!r} is no local directory, and as a Hugging Face Hub model id "
                         f"{lacks} ({constants.HF_HUB_CACHE}); HF_HUB_OFFLINE is set, so nothing "
                         f"is downloaded (unset it, or `hf download {repo_id}` where the Hub is "
                         f"reachable)")
    patterns = ["config.json", *TOKENIZER_FILES] + (["model.safetensors"] if what == "model" else [])
    try:
        d = Path(snapshot_download(repo_id, allow_patterns=patterns))
        if what == "model" and not (d / "model.safetensors").is_file():
            d = Path(snapshot_download(repo_id, allow_patterns=["pytorch_model.bin"]))
    except GatedRepoError:
        raise ValueError(f"the Hugging Face Hub model {repo_id!r} is gated: accept its terms and "
                         f"log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{repo_id!r} is no local directory and no Hugging Face Hub model (or a "
                         f"private one: log in with `hf auth login`)") from None
    except RevisionNotFoundError as e:
        raise ValueError(f"the Hugging Face Hub model {repo_id!r}: {_short(e)}") from None
    except Exception as e:  # connection errors, Hub downtime, disk full...
        raise ValueError(f"{repo_id!r} is no local directory, and downloading it from the Hugging "
                         f"Face Hub failed ({_short(e)})") from None
    lacks = _complete(d, what)
    if lacks is not None:
        raise ValueError(f"the Hugging Face Hub model {repo_id!r} has {lacks}")
    return d


def local_or_hub(value: str, *, what: What, file: str | None, field: str) -> Path | None:
    """The directory ``value`` names: itself if it exists (``~`` expanded), else the cached or
    downloaded snapshot of the Hub model id ``value``; None when ``value`` is neither an
    existing path nor a valid Hub id (the caller reports that in its own words).

    Args:
        value: a directory or a Hub model id (``org/name``).
        what: ``"model"`` (needs ``config.json`` and a weight file) or ``"tokenizer"``
            (needs tokenizer files).
        file, field: where ``value`` came from, for the error (e.g. the space file and
            ``fixed.init_from``).

    Raises:
        UserError: a Hub id that is not cached while ``HF_HUB_OFFLINE`` is set, not on the
            Hub, gated, unreachable, or lacking the files ``what`` needs.
    """
    p = Path(value).expanduser()
    if p.exists():
        return p
    if not is_hub_id(value):
        return None
    try:
        return _hub_snapshot(value, what)
    except ValueError as e:
        raise UserError(str(e), file=file, field=field) from None
