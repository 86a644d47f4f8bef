"""The README's "Measured" section, generated from the benchmark results.

    python benchmarks/summarize.py           # rewrite README.md between the markers
    python benchmarks/summarize.py --check   # exit 1 and print a diff when README.md differs

Reads every ``benchmarks/results/*.json`` (written by ``benchmarks/NAME.py``, see
``benchmarks/common.py``) and ``reports/example/pareto.json`` (the committed example run of
``search_spaces/default.yaml``), and writes three tables between ``<!-- measured:begin -->`` and
``<!-- measured:end -->`` in ``README.md``:

* the headline (:data:`HEADLINE`): one row per claim the product makes (per-sample depth, early
  exit, length-adaptive, tying, AHTO's searcher and scheduler, GPU wall-clock): our number with its
  interval where the result has one (else "no interval"), the simple baseline a user would try
  first, the paper's claim, the target and whether it is met;
* numbers: one row per ``summary`` entry (nested entries flattened to ``a.b``, a section with
  ``_ci`` intervals key by key; a table of
  equal-keyed dicts, e.g. hypervolume per searcher after 10 / 20 / 40 trials, one row per outer
  key), with the target where one is stated and whether the value meets it;
* provenance: per result, the commit(s), machine, wall time and command from its ``provenance``.

A result without ``summary`` or ``provenance`` is shown as such ("no summary", "no provenance"),
never skipped and never an error. Targets come from the result itself (``targets``:
``{"metric": "<= 0.5"}``, a bare number meaning "<="; or ``targets_met``: ``{"metric <= 0.35":
bool}``), else from :data:`TARGETS` (targets issue 18 states that the result does not carry).
Numbers are formatted deterministically (:func:`fmt`). Standard library only;
``tests/test_readme_numbers.py`` fails when the README differs from what this writes.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLE = ROOT / "reports" / "example"
README = ROOT / "README.md"
BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"

#: Targets stated by issue 18 for results that do not carry them: (result, metric) -> "OP VALUE".
TARGETS = {
    ("scaling", "tune_overhead_pct"): "< 5",
    ("scaling", "two_node_speedup"): ">= 1.8",
    ("faults", "lost_trials"): "== 0",
    ("faults", "duplicated_trials"): "== 0",
    # issue 35 (H100, MiniLM-L6, 0.5x FLOPs; full model = 1)
    ("gpu", "dht_wall_ratio_b1_at_0.5"): "<= 0.7",
    ("gpu", "confidence_exit_wall_ratio_b1_at_0.5"): "<= 0.7",
    ("gpu", "dht_wall_ratio_b32_at_0.5"): "<= 1.0",
    ("gpu", "dht_wall_ratio_b256_t256_at_0.5"): "<= 0.7",
    ("gpu", "dht_train_time_ratio"): "<= 1.3",
    ("gpu", "bf16_acc_drop_pts"): "<= 0.5",
}
#: Headline targets that hold only with other targets of the same result: (result, metric) ->
#: the other metrics (e.g. a time ratio that must also be significant).
JOINT_TARGETS = {("schedulers", "ahto_time_to_95_ratio_vs_asha"): ("ahto_wilcoxon_p_vs_asha",)}
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
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT",
     "per-sample layer/head gating keeps accuracy at a fraction of the FLOPs (arXiv 2312.03038)"),
    ("Per-sample depth (DHT) at 0.5x FLOPs, election tweets (second dataset)", "dht#election_tweets",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each)",
     "static cut at the same FLOPs: 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT",
     "the same, on another task"),
    ("DHT, multi-exit recipe chosen on validation (3 epochs), Rotten Tomatoes sentences", "dht#rt_recipe",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each; DHT trained 1.5x as long)",
     "static cut at the same FLOPs (2 epochs): 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT",
     "the same, with the recipe of benchmarks/results/dht_recipe.json"),
    ("DHT, multi-exit recipe chosen on validation (3 epochs), election tweets", "dht#election_tweets_recipe",
     "dht_gain_over_static_pts_at_0.5", "accuracy points over the static cut (3 seeds each; DHT trained 1.5x as long)",
     "static cut at the same FLOPs (2 epochs): 0; confidence exit on the same models: "
     "{confidence_exit_gain_over_static_pts_at_0.5}; full model: {dht_acc_drop_pts_at_0.5} above DHT",
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
    ("Length-adaptive (LengthDrop) at 0.5x FLOPs", "length_adaptive", "lat_acc_drop_pts_at_0.5",
     "accuracy points below the full model",
     "truncated inputs at the same FLOPs: {lat_gain_over_truncation_pts_at_0.5} points below ours",
     "one model for every length budget at about the full model's accuracy (Kim & Cho, ACL 2021)"),
    ("Layer tying (every_4, data-limited LM)", "tying", "tied_minus_untied_best_val_ppl",
     "validation perplexity minus the untied model's",
     "untied model: 0, at {tying_params_ratio}x its parameters and {tying_memory_ratio}x its measured memory",
     "a tied model can be better than the untied one, with far fewer parameters (Hay & Wolf, ICLR 2024)"),
    ("Tying agent (the better of ours and the paper's)", "tying", "rl_minus_best_fixed_best_val_ppl",
     "validation perplexity minus the best fixed map of its size", "best fixed map: 0",
     "the learned map beats fixed sharing patterns (Hay & Wolf, ICLR 2024)"),
    ("AHTO searcher on held-out LCBench tasks, 20 trials", "searchers", "ahto_regret_ratio_vs_qnehvi_at_20",
     "HV regret over qLogNEHVI's (p {ahto_wilcoxon_p_vs_qnehvi_at_20})",
     "qLogNEHVI: 1; TPE: AHTO's regret is {ahto_regret_ratio_vs_tpe_at_20}x TPE's",
     "a meta-trained acquisition beats GP-based BO in the first trials (MetaBO, ICLR 2020)"),
    ("AHTO scheduler: training time to 95% of the best-known HV (protocol v3: per seed)", "schedulers",
     "ahto_time_to_95_ratio_vs_asha",
     "x ASHA's (Wilcoxon p {ahto_wilcoxon_p_vs_asha} over 10 tasks; the target also asks p < 0.05)", "ASHA: 1; Hyperband: {ahto_time_to_95_ratio_vs_hyperband}x",
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


def _targets(name: str, data: dict) -> dict[str, str]:
    """metric -> "OP VALUE" for one result: :data:`TARGETS`, then its ``targets_met`` keys, then
    its ``targets`` (a bare number: an upper bound)."""
    out = {m: t for (b, m), t in TARGETS.items() if b == name}
    met = data.get("targets_met")
    for key in met if isinstance(met, dict) else ():
        m = re.match(r"^\s*(\S+)\s*(<=|>=|==|<|>)\s*(\S+)\s*$", str(key))
        if m:
            out[m[1]] = f"{m[2]} {m[3]}"
    stated = data.get("targets")
    for metric, t in stated.items() if isinstance(stated, dict) else ():
        out[metric] = f"<= {t}" if isinstance(t, (int, float)) and not isinstance(t, bool) else str(t)
    return out


def _target_cell(target: str | None, value: Any) -> str:
    if not target:
        return ""
    m = _TARGET.match(target)
    if not m:
        return target
    op, bound = m[1], float(m[2])
    shown = f"{op} {fmt(int(bound) if bound.is_integer() else bound)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return shown
    return f"{shown}: {'met' if _OPS[op](value, bound) else 'missed'}"


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


def load_results(results: Path = RESULTS, example: Path = EXAMPLE) -> list[tuple[str, dict | None]]:
    """``(name, parsed JSON or None)`` per result, sorted by name, then the
    example report (summary: its best validation accuracy and its number of trials)."""
    out = []
    for path in sorted(Path(results).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        out.append((path.stem, data))
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
        if metric not in summary:
            lines.append(f"| {_cell(claim)} | not measured (`{name}.json` has no `{metric}`) | | {_cell(paper)} | |")
            continue
        value = summary[metric]
        ci = summary.get(f"{metric}_ci")
        interval = (f"95% CI {fmt(ci[0])} to {fmt(ci[1])}" if isinstance(ci, list) and len(ci) == 2
                    else "no interval")
        ours = f"**{fmt(value)}** {_fill(unit, summary)}; {interval}"
        targets = _targets(name, data)
        target = _target_cell(targets.get(f"{section}.{metric}" if section else metric), value)
        also = [(m, targets[m], summary.get(m)) for m in JOINT_TARGETS.get((name, metric), ()) if m in targets]
        if also:  # met only when every joint target is met too
            parts = [target] + [f"`{m}` {_target_cell(t, v)} ({fmt(v)})" for m, t, v in also]
            met = all(p.endswith(": met") or ": met (" in p for p in parts)
            target = f"{'; and '.join(parts)}: **{'met' if met else 'missed'}**"
        lines.append(f"| {_cell(claim)} | {_cell(ours)} | {_cell(_fill(baseline, summary))} | {_cell(paper)} "
                     f"| {_cell(target)} |")
    return lines


def render(results: Path = RESULTS, example: Path = EXAMPLE) -> str:
    """The text between the markers (without them), ending in a newline."""
    items = load_results(results, example)
    lines = ["<!-- generated by `python benchmarks/summarize.py` from the result files; do not edit -->",
             "Read from `benchmarks/results/NAME.json` (written by `benchmarks/NAME.py`) and from",
             "`reports/example/` (the committed run of `search_spaces/default.yaml`, described in its README);",
             "the JSON files hold every number behind these. After rerunning a benchmark, run",
             "`python benchmarks/summarize.py`: `tests/test_readme_numbers.py` fails while this",
             "section differs from what it writes.", "",
             "**Headline**: one row per claim; `benchmarks/results/NAME.json` and the detailed table below",
             "hold the rest (per-seed values, other budgets, provenance).", "", *headline(items),
             "", "| benchmark | metric | value | target |", "|---|---|---|---|"]
    for name, data in items:
        if not isinstance(data, dict):
            lines.append(f"| {name} | unreadable JSON | | |")
            continue
        summary = data.get("summary")
        if not isinstance(summary, dict) or not summary:
            lines.append(f"| {name} | no summary | | |")
            continue
        targets = _targets(name, data)
        for label, shown, raw in flatten(summary):
            lines.append(f"| {name} | `{_cell(label)}` | {_cell(shown)} | {_cell(_target_cell(targets.get(label), raw))} |")
    lines += ["", "| benchmark | commit | machine | wall | command |", "|---|---|---|---|---|"]
    for name, data in items:
        prov = data.get("provenance") if isinstance(data, dict) else None
        if not isinstance(prov, dict):
            lines.append(f"| {name} | no provenance | | | |")
            continue
        wall = prov.get("wall_s", prov.get("wall_time_s"))
        lines.append(f"| {name} | {_cell(_commits(prov.get('git_commit')))} | {_cell(_machine(prov.get('machine')))} "
                     f"| {'' if wall is None else fmt(wall) + ' s'} | {_cell(str(prov.get('command') or ''))} |")
    return "\n".join(lines) + "\n"


def updated(readme: str, section: str) -> str:
    """``readme`` with the text between the markers replaced by ``section``."""
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < begin:
        raise SystemExit(f"error: README.md: no {BEGIN} ... {END} markers (add them where the section goes)")
    return readme[:begin + len(BEGIN)] + "\n" + section + readme[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 with a diff when README.md differs")
    ap.add_argument("--readme", type=Path, default=README)
    args = ap.parse_args(argv)
    current = args.readme.read_text()
    new = updated(current, render())
    if args.check:
        if new == current:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), new.splitlines(True),
                                                   f"{args.readme.name} (committed)", f"{args.readme.name} (generated)"))
        print(f"{args.readme.name} differs: run `python benchmarks/summarize.py`", file=sys.stderr)
        return 1
    if new != current:
        args.readme.write_text(new)
        print(f"rewrote the measured section of {args.readme}")
    else:
        print(f"{args.readme} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
