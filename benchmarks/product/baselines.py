"""Baseline: TF-IDF + logistic regression on the split archsearch searches on.

What a searched transformer has to beat on ``rotten_tomatoes_sentences``: a bag-of-n-grams
linear classifier, trained on exactly the train split that ``archsearch.data.prepare`` tokenises
(the splits come from :func:`archsearch.data.load`, which ``prepare`` itself calls), with its two
hyper-parameters chosen on the validation split only:

* ``C`` (inverse L2 strength) in ``GRID["C"]`` x word n-gram range in ``GRID["ngram_range"]``;
  TF-IDF with sublinear tf, fitted on the train split only; ``LogisticRegression`` (lbfgs).
* The setting with the best validation accuracy (ties: the first in grid order) is evaluated
  once on the test split. The test split plays no part in the choice.

Also the majority-class accuracy (the train split's most frequent label) on validation and test.

Protocol: ``benchmarks/product/protocols/baselines.json`` (this text and ``GRID`` as they were
before the run). The test split is read once: the result records the read in the test-read
ledger (``rt_sentences:test``).

Writes ``benchmarks/product/results/baselines.json``: ``summary`` (``tfidf_logreg_val_accuracy``,
``tfidf_logreg_test_accuracy``, ``majority_val_accuracy``, ``majority_test_accuracy``),
``protocol``, ``ledger``, ``provenance`` (:mod:`benchmarks.evidence`), the split sizes and
SHA-256 of each split's (text, label) rows, every grid point's validation accuracy and the
chosen setting.

Run: ``python -m benchmarks.product.baselines run`` (well under a minute on 2 cores).
``analyze`` and ``check`` restate the stored result through the same builder (:func:`build`)
without fitting (:mod:`benchmarks.product.stored`).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.product.stored import restate

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "baselines.json"
PROTOCOL = HERE / "protocols" / "baselines.json"
#: The test split the result scores (once, the chosen setting and the majority class).
TEST_SET = "rt_sentences:test"
DATASET = "rotten_tomatoes_sentences"
GRID = {"C": [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0], "ngram_range": [(1, 1), (1, 2), (1, 3)]}
SEED = 0

Split = tuple[list[str], list[int]]


def load_splits(name: str = DATASET) -> dict[str, Split]:
    """``{split: (texts, labels)}`` for train/validation/test, as archsearch loads them."""
    from archsearch.data import load

    dd = load(name)
    return {s: (list(dd[s]["text"]), [int(y) for y in dd[s]["label"]]) for s in dd}


def split_digest(split: Split) -> str:
    """SHA-256 of a split's rows (text, label) in order: names the exact data used."""
    h = hashlib.sha256()
    for text, label in zip(*split, strict=True):
        h.update(json.dumps([text, label], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def fit(train: Split, C: float, ngram_range: tuple[int, int]):
    """A TF-IDF + logistic-regression pipeline fitted on ``train``."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(TfidfVectorizer(ngram_range=ngram_range, sublinear_tf=True),
                          LogisticRegression(C=C, max_iter=5000, random_state=SEED))
    return model.fit(*train)


def accuracy(model, split: Split) -> float:
    texts, labels = split
    pred = model.predict(texts)
    return sum(int(p == y) for p, y in zip(pred, labels, strict=True)) / len(labels)


def run(splits: dict[str, Split], grid: dict[str, list] = GRID) -> dict:
    """Grid search on validation, one test evaluation of the chosen setting.

    Returns ``{"grid": [{"C", "ngram_range", "val_accuracy"}, ...], "chosen": {"C",
    "ngram_range"}, "val_accuracy", "test_accuracy"}`` (``test_accuracy`` is None without a
    test split).
    """
    rows, best, best_model = [], None, None
    for C, ngrams in itertools.product(grid["C"], grid["ngram_range"]):
        model = fit(splits["train"], C, tuple(ngrams))
        row = {"C": C, "ngram_range": list(ngrams), "val_accuracy": accuracy(model, splits["validation"])}
        rows.append(row)
        if best is None or row["val_accuracy"] > best["val_accuracy"]:  # ties: the first in grid order
            best, best_model = row, model
    test = accuracy(best_model, splits["test"]) if "test" in splits else None
    return {"grid": rows, "chosen": {"C": best["C"], "ngram_range": best["ngram_range"]},
            "val_accuracy": best["val_accuracy"], "test_accuracy": test}


def majority(splits: dict[str, Split]) -> dict[str, float]:
    """Accuracy of always predicting the train split's most frequent label."""
    label = Counter(splits["train"][1]).most_common(1)[0][0]
    return {s: sum(y == label for y in ys) / len(ys) for s, (_, ys) in splits.items() if s != "train"}


def build(summary: dict[str, Any], prov: dict[str, Any], *, record_reads: bool = True,
          **rest: Any) -> dict[str, Any]:
    """The result in the one schema: the protocol hashed, the test read judged by the ledger;
    ``rest``: the splits, the model, the selection rule, the grid."""
    return build_result(summary, prov, name="baselines.json", protocol=PROTOCOL,
                        reads=[Read(TEST_SET, PROTOCOL)], record_reads=record_reads, **rest)


def run(args: argparse.Namespace) -> int:
    """Fit the grid, evaluate the chosen setting once on test; writes ``args.out``."""
    started = time.perf_counter()
    splits = load_splits()
    res = run(splits)
    maj = majority(splits)
    for row in res["grid"]:
        print(f"C={row['C']:<5} ngrams={tuple(row['ngram_range'])}  val acc {row['val_accuracy']:.4f}")
    print(f"chosen on validation: {res['chosen']}  val {res['val_accuracy']:.4f}  test {res['test_accuracy']:.4f}")
    summary = {"tfidf_logreg_val_accuracy": res["val_accuracy"],
               "tfidf_logreg_test_accuracy": res["test_accuracy"],
               "majority_val_accuracy": maj["validation"], "majority_test_accuracy": maj["test"]}
    write_json(args.out, build(
        summary, provenance(seeds=SEED, wall_s=time.perf_counter() - started),
        dataset=DATASET,
        splits={s: {"rows": len(sp[1]), "sha256": split_digest(sp)} for s, sp in splits.items()},
        model="TfidfVectorizer(sublinear_tf=True, ngram_range) fitted on train + LogisticRegression(C, lbfgs)",
        selection="best validation accuracy over the grid (ties: first in grid order); test evaluated once",
        chosen=res["chosen"], grid=res["grid"]))
    print(json.dumps(summary))
    print(f"wrote {args.out}")
    return 0


def results(args: argparse.Namespace) -> dict[Path, dict[str, Any]]:
    """The stored result restated through :func:`build` (nothing fitted)."""
    return {OUT: restate(OUT, build, record_reads=not args.check)}


def _arguments(p: argparse.ArgumentParser) -> None:
    if p.prog.split()[-1] == "run":
        p.add_argument("--out", type=Path, default=OUT)


COMMAND = Command(__doc__.splitlines()[0], run=run, results=results, add_arguments=_arguments)


def main(argv: list[str] | None = None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
