"""The measured numbers of README.md and docs/, generated from the benchmark results.

    python benchmarks/summarize.py             # rewrite the generated parts of README.md and docs/*.md
    python benchmarks/summarize.py --check     # exit 1, printing a diff, when a page differs
    python -m benchmarks.summarize [--check]   # the same

Results: every ``benchmarks/**/results/*.json`` (written by the benchmark runners, one folder per
question, e.g. ``benchmarks/depth/results/dht.json``; the older ``benchmarks/results/*.json``
too) is found by its file name, which names the result (``dht``); a name found twice is an
error. ``reports/example/pareto.json`` (the committed example run of ``search_spaces/default.yaml``)
is the result ``reports/example``.

What is generated:

* ``README.md``, between ``<!-- measured:begin -->`` and ``<!-- measured:end -->``: the headline
  table (:data:`HEADLINE`): one row per claim the product makes (per-sample depth, early exit,
  length-adaptive, tying, AHTO's searcher and scheduler, GPU wall-clock): our number with its
  interval where the result has one (else "no interval"), the simple baseline a user would try
  first, the paper's claim, the target and whether it is met.
* ``docs/measured.md``, between the same markers (the file is created when missing): the
  headline, then the numbers table, one row per ``summary`` entry (nested entries flattened to
  ``a.b``, a section with ``_ci`` intervals key by key; a table of equal-keyed dicts, e.g.
  hypervolume per searcher after 10 / 20 / 40 trials, one row per outer key) with the target
  where one is stated and whether the value meets it, then the provenance table: per result, the
  commit(s), machine, wall time and command from its ``provenance``.
* Placeholders, in the prose of ``README.md`` and ``docs/*.md`` (outside code): a measured
  number in prose is never typed by hand. Write ``{{RESULT.KEY}}`` where it goes: ``RESULT`` is
  the result's file name without ``.json``, ``KEY`` the path of the value in its ``summary``
  (sections joined by ``.``; a key that itself holds dots, ``dht_gain_over_static_pts_at_0.5``,
  is found whole; a path not in the summary is looked up from the top of the JSON, e.g.
  ``tying.extra.switch_minus_best_fixed_best_val_ppl``), optionally ``:SPEC``, a Python format
  spec applied to each number (``{{dht.rt.dht_gain_over_static_pts_at_0.5:.1f}}``). The
  generator rewrites it to ``<!--{{RESULT.KEY}}-->VALUE<!--/-->``: HTML comments, so a rendered
  page shows VALUE only; the page stays the source (edit the text around it, or the placeholder
  inside the comment, and rerun). VALUE is :func:`fmt` of the number (a list ``[a, b]``, e.g.
  an interval). ``--check`` fails when a VALUE differs from its result, when a placeholder names
  a value no result has, and when :func:`scan` finds a hand-typed number next to a result key
  (a token such as ``dht_gain_over_static_pts_at_0.5`` followed, in the same sentence, first by a
  number that is none of that key's values, to the digits shown).

A result without ``summary`` or ``provenance`` is shown as such ("no summary", "no provenance"),
never skipped and never an error. Targets come from the result itself: ``targets`` as
``{"metric": {"target": "<= 0.5", "value": 0.43, "met": true}}`` (what ``benchmarks.evidence``
writes; ``met`` is the verdict shown, joint rules included), or a bare ``{"metric": "<= 0.5"}``
(a number meaning "<="), evaluated here. A result marked
exploratory (top-level ``"exploratory": true``, or its ``ledger``'s) says so in every table: its
name reads "NAME (exploratory)" in the numbers table and the headline, "NAME (exploratory: WHY)"
in the provenance table. Numbers are formatted deterministically (:func:`fmt`). Standard library
only, no import of its siblings (so it runs as a script and as ``benchmarks.summarize``);
``tests/test_readme_numbers.py`` and ``tests/test_docs_numbers.py`` fail when a page differs
from what this writes.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "reports" / "example"
README = "README.md"  # pages, relative to the root
MEASURED = "docs/measured.md"
DOCS = "docs"
BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"

#: The headline rows: (claim, result, metric, unit, baseline, the paper's claim); ``result#section``
#: reads the summary's section (a dataset's). ``baseline`` may name summary keys of the same
#: result (section) in braces (``{key}``: its formatted value); the interval is the summary's
#: ``<metric>_ci`` (``[low, high]``) when present; the target is the result's.
HEADLINE = [
    ("Per-sample depth (DHT) at 0.5x FLOPs, Rotten Tomatoes sentences", "dht#rt",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each; DHT's "
     "stop rule, tuned_trajectory_match, was picked on this test split in stop 27: on validation "
     "shared_threshold wins, stop_policies.json)",
     "static cut at the same FLOPs: 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT; "
     "a cascade of complete cuts (CascadeBERT, chosen on validation): {cascade_gain_over_static_pts_at_0.5}",
     "per-sample layer/head gating keeps accuracy at a fraction of the FLOPs (arXiv 2312.03038)"),
    ("Per-sample depth (DHT) at 0.5x FLOPs, election tweets (second dataset)", "dht#election_tweets",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each)",
     "static cut at the same FLOPs: 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT; "
     "a cascade of complete cuts (CascadeBERT, chosen on validation): {cascade_gain_over_static_pts_at_0.5}",
     "the same, on another task"),
    ("DHT, multi-exit recipe chosen on validation (3 epochs), Rotten Tomatoes sentences", "dht#rt_recipe",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each; DHT trained 1.5x as long)",
     "static cut at the same FLOPs (2 epochs): 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT; "
     "a cascade of complete cuts (CascadeBERT, chosen on validation): {cascade_gain_over_static_pts_at_0.5}",
     "the same, with the recipe of benchmarks/depth/results/dht_recipe.json"),
    ("DHT, multi-exit recipe chosen on validation (3 epochs), election tweets", "dht#election_tweets_recipe",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each; DHT trained 1.5x as long)",
     "static cut at the same FLOPs (2 epochs): 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT; "
     "a cascade of complete cuts (CascadeBERT, chosen on validation): {cascade_gain_over_static_pts_at_0.5}",
     "the same, on another task"),
    ("DHT (3-epoch recipe) vs a static cut trained as long, Rotten Tomatoes sentences",
     "dht#rt_recipe_vs_equally_trained_cuts", "dht_gain_over_static_pts_at_0.5",
     "accuracy points over the 3-epoch static cut (3 seeds each)",
     "static cut at the same FLOPs and epochs: 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}", "the same, at equal training"),
    ("DHT (3-epoch recipe) vs a static cut trained as long, election tweets",
     "dht#election_tweets_recipe_vs_equally_trained_cuts", "dht_gain_over_static_pts_at_0.5",
     "accuracy points over the 3-epoch static cut (3 seeds each)",
     "static cut at the same FLOPs and epochs: 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}", "the same, at equal training"),
    ("DHT (3-epoch recipe) vs cuts trained as long, Reuters R52 (52 topics: issue 63's harder dataset)",
     "dht#reuters_r52", "dht_gain_over_static_pts_at_0.5",
     "accuracy points over the 3-epoch static cut (3 seeds each)",
     "static cut at the same FLOPs and epochs: 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT; "
     "a cascade of complete cuts (CascadeBERT, chosen on validation): {cascade_gain_over_static_pts_at_0.5}; "
     "6-block over 3-block cut on validation: {val_static6_minus_static3_pts} points",
     "the same, on a task where depth matters more"),
    ("DHT head gating on long inputs (20 Newsgroups, 128 tokens) at 0.5x FLOPs", "head_gating",
     "dht_head_gating_gain_pts_long_inputs", "accuracy points over depth-only DHT (1 seed)",
     "depth-only DHT: 0; depth-only DHT minus the static cut at 0.5x: {depth_only_gain_over_static_pts_at_0.5} points",
     "gating heads as well as layers saves more at the same accuracy (arXiv 2312.03038 sec. 3.3)"),
    ("DHT's stop / continue decision by a per-exit LinUCB bandit at 0.5x FLOPs, Rotten Tomatoes sentences",
     "stop_bandit#rt", "bandit_minus_tuned_pts_at_0.5",
     "accuracy points over the least-squares cascade on the same models (3 seeds; exploration 0.3)",
     "least-squares cascade (the default): 0, accuracy {test_acc_tuned_trajectory_match_at_0.5}; "
     "bandit with exploration 1: accuracy {test_acc_bandit1_trajectory_match_at_0.5}",
     "per-sample depth decided by contextual bandits (arXiv 2312.03038 sec. 3)"),
    ("Learned early exit (depth predictor) at 0.5x FLOPs, Rotten Tomatoes sentences", "depth_predictor#rt",
     "dp_gain_over_static_pts_at_0.5", "accuracy points over the static curve (3 seeds each)",
     "static cut at the same FLOPs: 0; at 0.33x: {dp_gain_over_static_pts_at_0.33}; "
     "full model: {dp_acc_drop_pts_at_0.5} above it",
     "adaptive depth beats static depth at equal cost (Li, Li & Wang)"),
    ("Learned early exit (depth predictor) at 0.5x FLOPs, election tweets", "depth_predictor#election_tweets",
     "dp_gain_over_static_pts_at_0.5", "accuracy points over the static curve (3 seeds each)",
     "static cut at the same FLOPs: 0; at 0.33x: {dp_gain_over_static_pts_at_0.33}; "
     "full model: {dp_acc_drop_pts_at_0.5} above it",
     "the same, on another task"),
    ("DHT wall-clock on this CPU (2 cores) at 0.5x FLOPs, batch 1", "dht#cpu_wall", "dht_wall_over_flops_b1",
     "x its FLOPs ratio (wall ratio {dht_wall_ratio_b1}; 1 seed, median of 3 processes: {dht_wall_over_flops_b1_range})",
     "static 3-block cut: wall ratio {static3_wall_ratio_b1}; batch 32: {dht_wall_over_flops_b32}x its FLOPs ratio "
     "(processes {dht_wall_over_flops_b32_range})",
     "FLOPs saved are time saved"),
    ("DHT's stop rule adapted online under a domain shift (NYT editorials, unlabeled; 3 seeds)", "shift#nyt",
     "bandit_budget_abs_error",
     "|executed FLOPs fraction - 0.5| on the scored stream (adapt bandit: dual step + 5% exploration)",
     "the frozen rule: {frozen_budget_abs_error}; the bandit's accuracy at equal FLOPs: "
     "{bandit_gain_over_frozen_pts_at_0.5} points against it (target >= -0.3: missed)",
     "exit thresholds learned online from unlabeled traffic (CeeBERT, Findings ACL 2024)"),
    ("An exported DHT trial in archsearch's runtime on this CPU (2 cores), batch 1", "export",
     "runtime_wall_ratio_cpu_b1",
     "x the full model's wall time in the same runtime (batch 32: {runtime_wall_ratio_cpu_b32}; at most "
     "{runtime_wall_ratio_cpu_max} over batch 1, 8, 32, 128; the default search's best trial)",
     "the full model: 1; served on Ray Serve: {serve_vs_predict_b32} of predict's rows/s at batch 32",
     "per-sample exits pay only where a runtime serves them (issue 62)"),
    ("Length-adaptive (LengthDrop) at 0.5x FLOPs", "length_adaptive", "lat_acc_drop_pts_at_0.5",
     "accuracy points below the full model",
     "truncated inputs at the same FLOPs: {lat_gain_over_truncation_pts_at_0.5} points below ours",
     "one model for every length budget at about the full model's accuracy (Kim & Cho, ACL 2021)"),
    ("Layer tying (every_4, data-limited LM)", "tying", "tied_minus_untied_best_val_ppl",
     "validation perplexity minus the untied model's",
     "untied model: 0, at {tying_params_ratio}x its parameters and {tying_state_memory_ratio}x its measured training-state memory",
     "a tied model can be better than the untied one, with far fewer parameters (Hay & Wolf, ICLR 2024)"),
    ("Tying agent (the better of ours and the paper's)", "tying", "rl_minus_best_fixed_best_val_ppl",
     "validation perplexity minus the best fixed map of its size", "best fixed map: 0",
     "the learned map beats fixed sharing patterns (Hay & Wolf, ICLR 2024)"),
    ("AHTO searcher on held-out LCBench tasks, 20 trials", "searchers", "ahto_regret_ratio_vs_qnehvi_at_20",
     "HV regret over qLogNEHVI's (p {ahto_wilcoxon_p_vs_qnehvi_at_20})",
     "qLogNEHVI: 1; TPE: AHTO's regret is {ahto_regret_ratio_vs_tpe_at_20}x TPE's",
     "a meta-trained acquisition beats GP-based BO in the first trials (MetaBO, ICLR 2020)"),
    ("AHTO scheduler without hindsight: training time to a per-task target fixed in advance (protocol v4: "
     "34 LCBench tasks, 3-fold cross-validation, noisy curves, costs seen once observed)", "schedulers",
     "ahto_time_to_target_ratio_vs_asha",
     "x ASHA's (Wilcoxon p {ahto_wilcoxon_p_vs_asha}, faster on {ahto_faster_than_asha_tasks} tasks; the target "
     "also asks p < 0.05)",
     "ASHA: 1; Hyperband: {ahto_time_to_target_ratio_vs_hyperband}x; the one-epoch rule: "
     "{ahto_time_to_target_ratio_vs_one_epoch}x; HV at half the budget: {ahto_hv_ratio_vs_asha_at_equal_time}x ASHA's",
     "15% less training time at equal quality (the AHTO paper's headline)"),
    ("DHT wall-clock on a GPU at 0.5x FLOPs, batch 32 (the worse of the machines measured)", "gpu",
     "dht_wall_ratio_b32_at_0.5", "x the full model's time ({device})",
     "full model (eager, the protocol's denominator): 1; batch 1: {dht_wall_ratio_b1_at_0.5}x; batch 256 x 256 "
     "tokens: {dht_wall_ratio_b256_t256_at_0.5}x; against the full model CUDA-graphed as DHT is: "
     "{dht_wall_ratio_b1_vs_graphed_full_at_0.5}x at batch 1, {dht_wall_ratio_b32_vs_graphed_full_at_0.5}x at batch 32",
     "FLOPs saved are time saved"),
]

_OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
        ">": lambda a, b: a > b, "==": lambda a, b: a == b}
_TARGET = re.compile(r"^\s*(<=|>=|==|<|>)\s*(-?[0-9.eE+-]+)\s*$")


def fmt(v: Any) -> str:
    """A value as the table shows it: ints with thousands separators, floats to 4 significant
    digits (from 1,000 on: whole, with separators), booleans yes/no, None (JSON null) "none"."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _leaf(v: Any) -> bool:
    return not isinstance(v, (dict, list)) or (isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v))


def _leaf_dict(v: Any) -> bool:
    return isinstance(v, dict) and bool(v) and all(_leaf(x) for x in v.values())


def _series_table(v: Any) -> bool:
    """Dicts of equal-keyed leaf dicts whose keys are numbers (values at 10 / 20 / 40 trials)."""
    if not isinstance(v, dict) or not v or not all(_leaf_dict(x) for x in v.values()):
        return False
    keys = {tuple(x) for x in v.values()}
    return len(keys) == 1 and all(re.fullmatch(r"-?[0-9.]+", str(k)) for k in next(iter(keys)))


def flatten(summary: dict, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """``(label, shown value, raw value or None)`` rows of a summary, in its own order."""
    for key, v in summary.items():
        name = f"{prefix}{key}"
        if _leaf(v):
            yield name, fmt(v), v
        elif isinstance(v, dict) and any(str(k).endswith("_ci") for k in v):
            yield from flatten(v, f"{name}.")  # a section with ``_ci`` intervals: key by key, with targets
        elif _leaf_dict(v):
            yield name, fmt(v), None
        elif _series_table(v):
            # e.g. {searcher: {"10": hv, "20": hv, "40": hv}}: one row, the columns in the label
            cols = list(next(iter(v.values())))
            yield (f"{name} (at {' / '.join(map(str, cols))})",
                   "; ".join(f"{k} {' / '.join(fmt(x[c]) for c in cols)}" for k, x in v.items()), None)
        elif isinstance(v, dict):
            yield from flatten(v, f"{name}.")
        elif all(_leaf_dict(x) for x in v):  # a list of records, e.g. [{gamma, speedup, ...}]
            for rec in v:
                (k0, v0), *rest = rec.items()
                yield f"{name}[{k0}={fmt(v0)}]", fmt(dict(rest)), None
        else:
            yield name, fmt(v), None


def _targets(name: str, data: dict) -> dict[str, dict[str, Any]]:
    """metric -> ``{"target": "OP VALUE", "met": bool | None, "with": [metrics]}`` for one result:
    its ``targets`` (a bare number: an upper bound; a dict: the evidence library's ``{"target",
    "value", "met"[, "with"]}``)."""
    out: dict[str, dict[str, Any]] = {}
    stated = data.get("targets")
    for metric, t in stated.items() if isinstance(stated, dict) else ():
        if isinstance(t, dict):
            if "target" not in t:
                continue
            spec: dict[str, Any] = {"target": _target_text(t["target"])}
            if isinstance(t.get("met"), bool):
                spec["met"] = t["met"]
            if isinstance(t.get("with"), list) and t["with"]:
                spec["with"] = [str(w) for w in t["with"]]
            out[metric] = spec
        else:
            out[metric] = {"target": _target_text(t)}
    return out


def _target_text(t: Any) -> str:
    return f"<= {t}" if isinstance(t, (int, float)) and not isinstance(t, bool) else str(t)


def _target_cell(spec: dict[str, Any] | str | None, value: Any) -> str:
    """"OP BOUND: met|missed" (the result's own ``met`` when it states one, else the bound applied
    to ``value``); the bare target when neither can say."""
    if isinstance(spec, str):
        spec = {"target": spec}
    if not spec or not spec.get("target"):
        return ""
    target = spec["target"]
    m = _TARGET.match(target)
    if not m:
        shown = target
    else:
        op, bound = m[1], float(m[2])
        shown = f"{op} {fmt(int(bound) if bound.is_integer() else bound)}"
    if isinstance(spec.get("met"), bool):
        return f"{shown}: {'met' if spec['met'] else 'missed'}"
    if not m or isinstance(value, bool) or not isinstance(value, (int, float)):
        return shown
    return f"{shown}: {'met' if _OPS[op](value, bound) else 'missed'}"


def exploratory(data: Any) -> str | None:
    """Why a result is exploratory ("" when it gives no reason), or None when it is not."""
    if not isinstance(data, dict):
        return None
    ledger = data.get("ledger") if isinstance(data.get("ledger"), dict) else {}
    if data.get("exploratory") is True or ledger.get("exploratory") is True:
        return str(ledger.get("why") or data.get("why") or "")
    return None


def _label(name: str, data: Any, why: bool = False) -> str:
    """The result's name as the tables show it: marked when exploratory (with the reason: ``why``)."""
    reason = exploratory(data)
    if reason is None:
        return name
    return f"{name} (exploratory: {reason})" if why and reason else f"{name} (exploratory)"


def _machine(m: Any) -> str:
    if not isinstance(m, dict):
        return fmt(m)
    parts = []
    if m.get("platform") or m.get("processor"):
        parts.append(" ".join(str(x) for x in (str(m.get("platform", "")).split("-")[0], m.get("processor")) if x))
    if m.get("cpu_count") is not None:
        parts.append(f"{m['cpu_count']} CPUs")
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    if m.get("torch"):
        n = m.get("torch_threads")
        threads = "" if n is None else f" ({n} thread{'' if n == 1 else 's'})"
        parts.append(f"torch {m['torch']}{threads}")
    return ", ".join(parts)


def _commits(c: Any) -> str:
    commits = c if isinstance(c, list) else [c]
    return ", ".join(re.sub(r"^([0-9a-f]{7})[0-9a-f]*", r"\1", str(x)) for x in commits if x) or "n/a"


class DuplicateResult(ValueError):
    """Two result files share a name (``benchmarks/a/results/x.json`` and ``benchmarks/b/results/x.json``)."""


def result_paths(root: Path = ROOT) -> dict[str, Path]:
    """name -> file of every result under ``root``: ``benchmarks/**/results/*.json``, sorted by name.

    Raises:
        DuplicateResult: one name in two places.
    """
    bench = Path(root) / "benchmarks"
    found: dict[str, Path] = {}
    for path in sorted(set(bench.glob("**/results/*.json")) | set(bench.glob("results/*.json"))):
        if path.stem in found:
            raise DuplicateResult(f"result {path.stem!r} is in two places: {found[path.stem].relative_to(root)} "
                                  f"and {path.relative_to(root)}; rename or remove one")
        found[path.stem] = path
    return dict(sorted(found.items()))


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_results(results: Path | None = None, example: Path = EXAMPLE,
                 root: Path = ROOT) -> list[tuple[str, dict | None]]:
    """``(name, parsed JSON or None)`` per result, sorted by name, then the example report
    (summary: its best validation accuracy and its number of trials). ``results``: one folder of
    ``*.json`` instead of every result under ``root`` (:func:`result_paths`)."""
    paths = ({p.stem: p for p in sorted(Path(results).glob("*.json"))} if results is not None
             else result_paths(root))
    out = [(name, _read(path)) for name, path in paths.items()]
    pareto = Path(example) / "pareto.json"
    if pareto.is_file():
        try:
            front = json.loads(pareto.read_text())["pareto"]
            summary = {"best_val_accuracy": max(p["metrics"]["accuracy"] for p in front)}
            trials = Path(example) / "trials.csv"
            if trials.is_file():
                with trials.open(newline="") as f:
                    summary["trials"] = sum(1 for _ in csv.DictReader(f))
            data = {"summary": summary}
        except (OSError, ValueError, KeyError, TypeError):
            data = None
        out.append((f"reports/{Path(example).name}", data))
    return out


def _fill(template: str, summary: dict) -> str:
    """``template`` with each ``{key}`` replaced by the formatted ``summary[key]`` ("?" if absent)."""
    return re.sub(r"\{([^{}]+)\}", lambda m: fmt(summary[m[1]]) if m[1] in summary else "?", template)


def headline(items: list[tuple[str, dict | None]]) -> list[str]:
    """The headline table's lines (:data:`HEADLINE`), from the loaded results."""
    by_name = {name: data for name, data in items if isinstance(data, dict)}
    lines = ["| claim | ours | simple baseline | paper's claim | target |", "|---|---|---|---|---|"]
    for claim, name, metric, unit, baseline, paper in HEADLINE:
        name, _, section = name.partition("#")  # "result#section": a per-dataset summary section
        data = by_name.get(name) or {}
        summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
        if section:
            summary = summary.get(section) if isinstance(summary.get(section), dict) else {}
        ledger = data.get("ledger") if isinstance(data.get("ledger"), dict) else {}
        if section and isinstance(ledger.get(section), dict):  # a section read its own test split
            if ledger[section].get("exploratory") is True:
                claim = f"{claim} (exploratory)"
        elif exploratory(data) is not None:
            claim = f"{claim} (exploratory)"
        # a section's own sub-reads (e.g. "rt.cascade": rows added under a later protocol)
        sub = [k.split(".", 1)[1] for k, v in ledger.items() if section and k.startswith(f"{section}.")
               and isinstance(v, dict) and v.get("exploratory") is True]
        if sub and "(exploratory)" not in claim:
            baseline = f"{baseline} ({', '.join(sub)} rows exploratory)"
        if metric not in summary:
            lines.append(f"| {_cell(claim)} | not measured (`{name}.json` has no `{metric}`) | | {_cell(paper)} | |")
            continue
        value = summary[metric]
        ci = summary.get(f"{metric}_ci")
        interval = (f"95% CI {fmt(ci[0])} to {fmt(ci[1])}" if isinstance(ci, list) and len(ci) == 2
                    else "no interval")
        ours = f"**{fmt(value)}** {_fill(unit, summary)}; {interval}"
        targets = _targets(name, data)
        spec = targets.get(f"{section}.{metric}" if section else metric)
        target = _target_cell(spec, value)
        joint = (spec or {}).get("with") or ()
        also = [(m, targets[m], summary.get(m)) for m in joint if m in targets]
        if also:  # met only when every joint target is met too (or as the result says)
            parts = [target] + [f"`{m}` {_target_cell(t, v)} ({fmt(v)})" for m, t, v in also]
            met = (spec["met"] if isinstance((spec or {}).get("met"), bool)
                   else all(p.endswith(": met") or ": met (" in p for p in parts))
            target = f"{'; and '.join(parts)}: **{'met' if met else 'missed'}**"
        lines.append(f"| {_cell(claim)} | {_cell(ours)} | {_cell(_fill(baseline, summary))} | {_cell(paper)} "
                     f"| {_cell(target)} |")
    return lines


def render(results: Path | None = None, example: Path = EXAMPLE, full: bool = True, root: Path = ROOT) -> str:
    """The text between the markers (without them), ending in a newline: the headline, and with
    ``full`` (docs/measured.md) the numbers and provenance tables."""
    items = load_results(results, example, root)
    lines = ["<!-- generated by `python benchmarks/summarize.py` from the result files; do not edit -->"]
    if not full:
        lines += ["One row per claim, from the result files (`benchmarks/**/results/NAME.json`); every other",
                  "number, with provenance: [docs/measured.md](docs/measured.md).", "", *headline(items)]
        return "\n".join(lines) + "\n"
    lines += ["Read from `benchmarks/**/results/NAME.json` (written by the benchmark runners) and from",
              "`reports/example/` (the committed run of `search_spaces/default.yaml`, described in its README);",
              "the JSON files hold every number behind these. After rerunning a benchmark, run",
              "`python benchmarks/summarize.py`: `tests/test_readme_numbers.py` fails while this",
              "section differs from what it writes.", "",
              "**Headline**: one row per claim (also in the README); the tables below hold the rest",
              "(per-seed values, other budgets, provenance).", "", *headline(items),
              "", "| benchmark | metric | value | target |", "|---|---|---|---|"]
    for name, data in items:
        if not isinstance(data, dict):
            lines.append(f"| {name} | unreadable JSON | | |")
            continue
        label = _label(name, data)
        summary = data.get("summary")
        if not isinstance(summary, dict) or not summary:
            lines.append(f"| {label} | no summary | | |")
            continue
        targets = _targets(name, data)
        for row, shown, raw in flatten(summary):
            lines.append(f"| {label} | `{_cell(row)}` | {_cell(shown)} | {_cell(_target_cell(targets.get(row), raw))} |")
    lines += ["", "| benchmark | commit | machine | wall | command |", "|---|---|---|---|---|"]
    for name, data in items:
        prov = data.get("provenance") if isinstance(data, dict) else None
        label = _cell(_label(name, data, why=True))
        if not isinstance(prov, dict):
            lines.append(f"| {label} | no provenance | | | |")
            continue
        wall = prov.get("wall_s", prov.get("wall_time_s"))
        lines.append(f"| {label} | {_cell(_commits(prov.get('git_commit')))} | {_cell(_machine(prov.get('machine')))} "
                     f"| {'' if wall is None else fmt(wall) + ' s'} | {_cell(str(prov.get('command') or ''))} |")
    return "\n".join(lines) + "\n"


def updated(page: str, section: str, name: str = "README.md") -> str:
    """``page`` with the text between the measured markers replaced by ``section``.

    Raises:
        ValueError: the markers are missing.
    """
    begin, end = page.find(BEGIN), page.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"{name}: no {BEGIN} ... {END} markers (add them where the section goes)")
    return page[:begin + len(BEGIN)] + "\n" + section + page[end:]


# ---- placeholders: {{RESULT.KEY}} in prose -> <!--{{RESULT.KEY}}-->VALUE<!--/--> ----

PLACED = re.compile(r"<!--\{\{([^{}\n]+?)\}\}-->(.*?)<!--/-->")
BARE = re.compile(r"\{\{([^{}\s]+?)\}\}")
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)  # an inline code span


class UnknownKey(KeyError):
    """A placeholder names a value no result has."""


def lookup(tree: Any, path: str) -> Any:
    """The value at ``path`` (keys joined by ``.``; a key holding dots is found whole, the
    longest first) in nested dicts; raises ``KeyError`` when absent."""
    if not isinstance(tree, dict):
        raise KeyError(path)
    if path in tree:
        return tree[path]
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in tree:
            try:
                return lookup(tree[head], ".".join(parts[i:]))
            except KeyError:
                continue
    raise KeyError(path)


def value_of(key: str, results: dict[str, dict | None]) -> Any:
    """The value a placeholder ``RESULT.KEY`` names: ``KEY`` in the result's summary, else from
    the top of its JSON.

    Raises:
        UnknownKey: no such result or key.
    """
    name, _, path = key.partition(".")
    data = results.get(name)
    if not path or not isinstance(data, dict):
        raise UnknownKey(f"{{{{{key}}}}}: no result {name!r}" if not isinstance(data, dict)
                         else f"{{{{{key}}}}}: no key after the result's name")
    for tree in (data.get("summary"), data):
        try:
            return lookup(tree, path)
        except KeyError:
            pass
    raise UnknownKey(f"{{{{{key}}}}}: {name}.json has no {path!r}")


def show(value: Any, spec: str = "") -> str:
    """A placeholder's text: :func:`fmt` of the value (``spec``: a format spec for each number),
    a list as ``[a, b]``."""
    if isinstance(value, list):
        return "[" + ", ".join(show(v, spec) for v in value) + "]"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return fmt(value)


def _prose_spans(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of the text outside fenced code blocks and inline code spans."""
    pos, fence = 0, None
    chunks, start = [], 0
    for line in text.splitlines(True):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            chunks.append((start, pos))
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence, start = None, pos + len(line)
        pos += len(line)
    if fence is None:
        chunks.append((start, pos))
    for a, b in chunks:
        at = a
        for m in _CODE.finditer(text, a, b):
            yield at, m.start()
            at = m.end()
        yield at, b


def fill(text: str, results: dict[str, dict | None], errors: list[str] | None = None) -> str:
    """``text`` with every placeholder (bare or already rendered) rendered from ``results``;
    an unknown one is left as it is and reported in ``errors``."""
    errors = [] if errors is None else errors

    def one(key: str, whole: str) -> str:
        path, _, spec = key.partition(":")
        try:
            return f"<!--{{{{{key}}}}}-->{show(value_of(path, results), spec)}<!--/-->"
        except UnknownKey as e:
            errors.append(e.args[0])
        except (ValueError, TypeError) as e:
            errors.append(f"{{{{{key}}}}}: {e}")
        return whole

    out, last = [], 0
    for a, b in _prose_spans(text):
        out.append(text[last:a])
        chunk = text[a:b]
        pieces, at = [], 0
        for m in PLACED.finditer(chunk):
            pieces.append(BARE.sub(lambda n: one(n[1], n[0]), chunk[at:m.start()]))
            pieces.append(one(m[1], m[0]))
            at = m.end()
        pieces.append(BARE.sub(lambda n: one(n[1], n[0]), chunk[at:]))
        out.append("".join(pieces))
        last = b
    out.append(text[last:])
    return "".join(out)


# ---- the scan: a hand-typed number next to a result key ----

_GENERATED = re.compile(r"<!-- ([a-z-]+):begin\b.*?<!-- \1:end -->", re.S)
_FENCED = re.compile(r"^\s*(```|~~~).*?^\s*\1[^\n]*$", re.S | re.M)
_TOKEN = re.compile(r"(?<![\w./-])[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")
_NUMBER = re.compile(r"(?<![\w.])[-\u2212+]?\d[\d,]*(?:\.\d+)?(?![\w])|\u27e6v\u27e7")
_STOP = re.compile(r"[.!?;](?=\s|$)|\n\s*\n")


def _numbers(v: Any) -> list[float]:
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, (int, float)):
        return [float(v)] if math.isfinite(v) else []
    if isinstance(v, list):
        return [x for item in v for x in _numbers(item)]
    return []


def result_keys(results: dict[str, dict | None]) -> dict[str, list[float]]:
    """Every key that names a number in a result's summary (with at least one ``_``), alone and as
    ``section.key`` and ``result.section.key``, -> the numbers it names (in every result)."""
    keys: dict[str, list[float]] = {}

    def walk(tree: dict, prefix: list[str]) -> None:
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, prefix + [str(k)])
                continue
            nums = _numbers(v)
            if not nums or "_" not in str(k):
                continue
            path = prefix + [str(k)]
            for i in range(len(path)):
                keys.setdefault(".".join(path[i:]), []).extend(nums)

    for name, data in results.items():
        if isinstance(data, dict) and isinstance(data.get("summary"), dict):
            walk(data["summary"], [name])
    return keys


def _matches(shown: str, values: list[float]) -> bool:
    """Whether a number as typed is one of ``values`` (or its magnitude) to the digits typed."""
    text = shown.replace(",", "").replace("\u2212", "-")
    try:
        x = float(text)
    except ValueError:
        return True
    decimals = len(text.split(".")[1]) if "." in text else 0
    tol = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(v - x) <= tol or abs(abs(v) - abs(x)) <= tol for v in values)


def scan(text: str, keys: dict[str, list[float]], name: str = "page") -> list[str]:
    """Problems in ``text``: a result key (a token of :func:`result_keys`) whose first number
    after it, in the same sentence and before the next key, is none of that key's values.
    Generated blocks and fenced code are skipped; a rendered placeholder counts as a right number."""
    blank = lambda m: re.sub(r"[^\n]", " ", m[0])  # keep offsets and line numbers
    text = _FENCED.sub(blank, _GENERATED.sub(blank, text))
    text = PLACED.sub(lambda m: "\u27e6v\u27e7".ljust(len(m[0])), text)
    found = []
    for m in _TOKEN.finditer(text):
        token = m[0]
        parts = token.split(".")
        key = next((".".join(parts[i:]) for i in range(len(parts)) if ".".join(parts[i:]) in keys), None)
        if key is not None:
            found.append((m.start(), m.end(), key))
    problems = []
    for i, (start, end, key) in enumerate(found):
        limit = found[i + 1][0] if i + 1 < len(found) else len(text)
        stop = _STOP.search(text, end, limit)
        scope = text[end:stop.start() if stop else limit]
        num = _NUMBER.search(scope)
        if num is None or num[0] == "\u27e6v\u27e7" or _matches(num[0], keys[key]):
            continue
        line = text.count("\n", 0, start) + 1
        values = ", ".join(sorted({fmt(v) for v in keys[key]}))
        problems.append(f"{name}:{line}: `{key}` is followed by {num[0]}, but its value is {values}: "
                        f"write {{{{RESULT.{key}}}}} there")
    return problems


# ---- the pages ----

MEASURED_PAGE = ("# Measured\n\nEvery number the benchmarks measured, generated from the result files "
                 "(`python benchmarks/summarize.py`).\n\n" + BEGIN + "\n" + END + "\n")


def pages(root: Path = ROOT, results: Path | None = None,
          example: Path | None = None) -> tuple[dict[Path, tuple[str, str]], list[str]]:
    """path -> (current text, generated text) for README.md, docs/measured.md and every other
    docs/*.md with placeholders; and the problems (unknown placeholders, :func:`scan`)."""
    root = Path(root)
    example = root / "reports" / "example" if example is None else example
    items = load_results(results, example, root)
    by_name = dict(items)
    keys = result_keys(by_name)
    out: dict[Path, tuple[str, str]] = {}
    problems: list[str] = []
    readme, measured = root / README, root / MEASURED
    docs = sorted((root / DOCS).glob("*.md")) if (root / DOCS).is_dir() else []
    for path in [readme, measured, *[d for d in docs if d != measured]]:
        current = path.read_text(encoding="utf-8") if path.is_file() else (MEASURED_PAGE if path == measured else None)
        if current is None:
            continue
        rel = path.relative_to(root).as_posix()
        new = current
        if path in (readme, measured):
            new = updated(new, render(results, example, full=path == measured, root=root), rel)
        errors: list[str] = []
        new = fill(new, by_name, errors)
        problems += [f"{rel}: {e}" for e in errors] + scan(new, keys, rel)
        out[path] = ((current if path.is_file() else ""), new)
    return out, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 with a diff when README.md or a docs page differs from what this writes")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    try:
        generated, problems = pages(args.root)
    except ValueError as e:  # a duplicate result, missing markers
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = {p: (cur, new) for p, (cur, new) in generated.items() if cur != new}
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if args.check:
        for path, (cur, new) in stale.items():
            rel = path.relative_to(args.root).as_posix()
            sys.stdout.writelines(difflib.unified_diff(cur.splitlines(True), new.splitlines(True),
                                                       f"{rel} (committed)", f"{rel} (generated)"))
            print(f"{rel} differs: run `python benchmarks/summarize.py`", file=sys.stderr)
        return 1 if stale or problems else 0
    for path, (_, new) in stale.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new, encoding="utf-8")
        print(f"rewrote {path.relative_to(args.root).as_posix()}")
    if not stale:
        print("README.md and docs/ are up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
