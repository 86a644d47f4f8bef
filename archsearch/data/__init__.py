"""Datasets for archsearch: bundled real data, local files and the Hugging Face Hub.

Public API (importing this package is cheap: torch / datasets are imported inside functions)::

    list_datasets() -> list[DatasetInfo]
    load(name, *, text_column=None, label_column=None, task=None) -> datasets.DatasetDict
    prepare(name, *, vocab_size=8000, max_len=48, tokenizer=None, cache_dir=None,
            text_column=None, label_column=None, task=None) -> PreparedData
    classification_batches(split, batch_size, shuffle=True, generator=None, *, drop_last=False, trim=False)
    lm_batches(stream, block_size, batch_size, generator=None, *, shuffle=True, drop_last=False)

Bundled datasets (``bundled/PROVENANCE.md``): ``rotten_tomatoes_sentences`` (default, binary
sentiment of movie review sentences) and ``shakespeare`` (character-level language modelling).

Example::

    from archsearch.data import prepare, classification_batches
    data = prepare("rotten_tomatoes_sentences", vocab_size=8000, max_len=48)
    data.train.input_ids.shape      # (8452, 48) int64
    for batch in classification_batches(data.train, 32, generator=torch.Generator().manual_seed(0)):
        ...                          # batch["input_ids"] (32, 48), ["attention_mask"], ["labels"]
"""

from archsearch.data.batches import classification_batches, lm_batches, num_batches
from archsearch.data.names import DEFAULT_DATASET, DatasetInfo, bundled_names, list_datasets
from archsearch.data.prepare import ClassificationSplit, PreparedData, cache_root, prepare, prepare_for_space
from archsearch.data.standardise import load

__all__ = [
    "DEFAULT_DATASET",
    "ClassificationSplit",
    "DatasetInfo",
    "PreparedData",
    "bundled_names",
    "cache_root",
    "classification_batches",
    "list_datasets",
    "lm_batches",
    "load",
    "num_batches",
    "prepare",
    "prepare_for_space",
]
