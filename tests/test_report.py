"""Tests of archsearch.report on realistic synthetic trial records (no Ray, no training).

They exercise the public contract only: ``write_report`` with its output files,
``report_run`` on a run directory, and the comparison. Front and hypervolume are checked
against :mod:`archsearch.pareto` (itself tested in ``tests/test_pareto.py``) and against
BoTorch's exact ``Hypervolume`` as an independent reference.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re

import numpy as np
import pytest

from archsearch.pareto import hypervolume, non_dominated_mask, reference_point
from archsearch.report import write_report

OBJECTIVES = [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}]
XSS = "</script><script>alert(1)</script>"
PARETO_KEYS = {"objectives", "reference_point", "hypervolume", "pareto", "n_trials", "n_failed"}


def make_trial(k: int, acc: float, flops: float, *, status: str = "TERMINATED", epochs: int = 5,
               error: str | None = None, **config) -> dict:
    """One record shaped like the runner's: last metrics plus a per-epoch history."""
    cfg = {"n_layers": 2, "d_model": 64, "n_heads": 4, "lr": 1e-3, "dynamic": "none"}
    cfg.update(config)
    history = []
    for ep in range(1, epochs + 1):
        a = acc if not math.isfinite(acc) else 0.5 + (acc - 0.5) * ep / epochs
        history.append({"epoch": ep, "accuracy": a, "val_loss": 0.69 - 0.8 * (a - 0.5),
                        "flops_per_sample": flops, "train_seconds": 9.0 * ep})
    metrics = {"accuracy": acc, "val_loss": 0.69 - 0.8 * (acc - 0.5),
               "flops_per_sample": flops, "params_total": int(flops / 40),
               "params_trainable": int(flops / 40), "latency_ms": 0.05 + flops / 2e8,
               "train_seconds": 9.0 * epochs}
    if status == "ERROR":
        metrics = {}
    return {"trial_id": f"trial_{k:05d}", "status": status, "config": cfg, "metrics": metrics,
            "history": history if status != "ERROR" else history[:1], "error": error}


def realistic_trials(n: int = 40, seed: int = 0) -> list[dict]:
    """A deterministic mix of finished, early-stopped, failed and diverged (NaN) trials."""
    rng = random.Random(seed)
    trials = []
    for k in range(n):
        layers, width = rng.randint(1, 6), rng.choice([64, 128, 256])
        flops = 2 * 48 * layers * 12 * width * width
        acc = 0.66 + 0.12 * (1 - math.exp(-flops / 1e7)) + rng.gauss(0, 0.01)
        status, epochs, error = "TERMINATED", 5, None
        if k % 7 == 3:
            status, epochs = "STOPPED", rng.choice([1, 2])
            acc -= 0.05
        if k % 11 == 5:
            status, error = "ERROR", "RuntimeError: shape mismatch in attention"
        if k % 13 == 6:
            acc = math.nan  # diverged: TERMINATED but NaN
        trials.append(make_trial(k, acc, float(flops), status=status, epochs=epochs,
                                 error=error, n_layers=layers, d_model=width))
    return trials


def botorch_hv(Y_max: np.ndarray, ref_max: list[float]) -> float:
    """Independent reference: BoTorch's exact hypervolume in max-convention."""
    import torch
    from botorch.utils.multi_objective.hypervolume import Hypervolume
    from botorch.utils.multi_objective.pareto import is_non_dominated

    pts = torch.tensor(Y_max, dtype=torch.double)
    pts = pts[is_non_dominated(pts)]
    return float(Hypervolume(torch.tensor(ref_max, dtype=torch.double)).compute(pts))


# ------------------------------------------------------------------------------------------
# write_report
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One report of 40 realistic trials with a constraint; reused by several tests."""
    out = tmp_path_factory.mktemp("report")
    trials = realistic_trials()
    summary = write_report(trials, OBJECTIVES, out,
                           constraints={"latency_ms": {"max": 0.05 + 3e7 / 2e8}},
                           run_info={"name": "unit-run", "searcher": "random",
                                     "space_file": "search_spaces/tiny.yaml",
                                     "wall_time_s": 123.4})
    return trials, summary, out


def test_pareto_json_shape_exactly(report):
    trials, summary, out = report
    on_disk = json.loads((out / "pareto.json").read_text())
    assert on_disk == summary
    assert set(summary) == PARETO_KEYS
    assert summary["objectives"] == OBJECTIVES
    assert isinstance(summary["hypervolume"], float) and summary["hypervolume"] > 0
    assert len(summary["reference_point"]) == 2
    assert all(isinstance(r, float) for r in summary["reference_point"])
    assert summary["n_trials"] == len(trials)
    assert summary["pareto"], "a front is expected"
    for p in summary["pareto"]:
        assert set(p) == {"trial_id", "config", "metrics"}
    json.dumps(summary, allow_nan=False)  # strictly valid JSON: no NaN/Infinity


def test_failed_and_nan_trials_counted_and_off_the_front(report):
    trials, summary, _ = report
    failed = {t["trial_id"] for t in trials
              if t["status"] == "ERROR" or not math.isfinite(t["metrics"].get("accuracy", math.nan))}
    assert any(t["status"] == "ERROR" for t in trials)
    assert any(t["status"] != "ERROR" and math.isnan(t["metrics"]["accuracy"]) for t in trials)
    assert summary["n_failed"] == len(failed)
    assert not failed & {p["trial_id"] for p in summary["pareto"]}


def test_front_is_feasible_and_non_dominated(report):
    trials, summary, _ = report
    limit = 0.05 + 3e7 / 2e8
    ok = [t for t in trials if t["status"] != "ERROR" and math.isfinite(t["metrics"]["accuracy"])
          and t["metrics"]["latency_ms"] <= limit]
    Y = np.array([[t["metrics"]["accuracy"], t["metrics"]["flops_per_sample"]] for t in ok])
    expected = {t["trial_id"] for t, on in zip(ok, non_dominated_mask(Y, ["max", "min"])) if on}
    assert {p["trial_id"] for p in summary["pareto"]} == expected
    ref = reference_point(Y, ["max", "min"], [None, None])
    assert summary["reference_point"] == pytest.approx(ref)
    assert summary["hypervolume"] == pytest.approx(hypervolume(Y, ["max", "min"], ref))


def test_trials_csv_one_row_per_trial(report):
    trials, summary, out = report
    with (out / "trials.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["trial_id"] for r in rows] == [t["trial_id"] for t in trials]
    header = rows[0].keys()
    for col in ("trial_id", "status", "config/n_layers", "config/d_model", "accuracy",
                "flops_per_sample", "feasible", "pareto"):
        assert col in header
    on_front = {r["trial_id"] for r in rows if r["pareto"] == "True"}
    assert on_front == {p["trial_id"] for p in summary["pareto"]}


def test_png_is_valid_and_not_blank(report):
    import matplotlib.image as mpimg

    path = report[2] / "pareto.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
    assert float(img[..., :3].std()) > 0.02
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 20  # points, lines and text, not a flat image


def test_html_opens_offline_with_plotly_js_beside_it(report):
    from plotly.offline import get_plotlyjs

    page = (report[2] / "index.html").read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html>")
    # plotly.js is one file beside the page, loaded by a relative <script src>, not inlined;
    # no script or stylesheet is loaded from the network
    assert page.count("Plotly.newPlot") >= 2
    assert re.findall(r"<script[^>]+src=[^>]*>", page, flags=re.I) == ['<script src="plotly.min.js">']
    assert (report[2] / "plotly.min.js").read_bytes() == get_plotlyjs().encode("utf-8")
    assert "function" not in page[:page.index("</head>")].replace("(function(){", "")
    assert len(page.encode()) < 1_000_000  # 40 trials; the 4.8 MB bundle is not in it
    assert not re.search(r"<link[^>]+href=[\"']?https?:", page, flags=re.I)
    assert "unit-run" in page and "random" in page
    # every Pareto trial is in the page with a command that re-runs it
    for p in report[1]["pareto"]:
        assert p["trial_id"] in page
    assert "archsearch search" in page and "--fixed" in page


def test_plotly_js_written_once_per_directory(tmp_path):
    """One plotly.min.js per report directory, rewritten only when absent or different; the
    comparison page's directory gets its own, and both pages reference it relatively."""
    from plotly.offline import get_plotlyjs

    from archsearch.report.compare import compare_runs

    bundle = get_plotlyjs().encode("utf-8")
    out = tmp_path / "report"
    write_report(realistic_trials(10), OBJECTIVES, out)
    js = out / "plotly.min.js"
    assert [p.name for p in out.iterdir() if p.suffix == ".js"] == ["plotly.min.js"]
    assert js.read_bytes() == bundle
    first = js.stat()
    write_report(realistic_trials(12), OBJECTIVES, out)  # same bytes: left untouched
    again = js.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    js.write_bytes(b"/* an older plotly.js */")  # different bytes: replaced
    write_report(realistic_trials(12), OBJECTIVES, out)
    assert js.read_bytes() == bundle
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # atomic: no leftovers

    a = write_run(tmp_path, "a", realistic_trials(6, seed=1))
    b = write_run(tmp_path, "b", realistic_trials(6, seed=2))
    cmp_dir, _ = compare_runs([a, b], out=tmp_path / "cmp")
    assert (cmp_dir / "plotly.min.js").read_bytes() == bundle
    for page in (out / "index.html", cmp_dir / "index.html"):
        html = page.read_text(encoding="utf-8")
        assert html.count('<script src="plotly.min.js"></script>') == 1
        assert html.index('src="plotly.min.js"') < html.index("Plotly.newPlot(")
        assert bundle[:2000].decode() not in html


def test_templates_autoescape_run_name(tmp_path):
    """``<script>alert(1)</script>`` in a run name comes out of the templates escaped, in the
    title, the heading and the header table of the run page and in the comparison page."""
    from archsearch.report.compare import compare_runs
    from archsearch.report.page import render

    hostile = "<script>alert(1)</script>"
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    write_report(realistic_trials(8), OBJECTIVES, tmp_path / "r",
                 run_info={"name": hostile, "searcher": 'say "hi" & \'bye\''})
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    assert f"<title>archsearch report: {escaped}</title>" in page
    assert f"<h1>archsearch report: {escaped}</h1>" in page
    assert f"<th>Run</th><td>{escaped}</td>" in page
    assert "<th>Searcher</th><td>say &#34;hi&#34; &amp; &#39;bye&#39;</td>" in page
    assert hostile not in page
    # the shell template on its own: autoescape is on for .html.j2 files
    shell = render("base.html.j2", title=hostile, figures=[], hover=[])
    assert f"<title>{escaped}</title>" in shell and "<script" not in shell
    # comparison: run names are escaped in the heading and the summary table
    import yaml

    from archsearch.report.synthetic import write_run_dir
    from conftest import TINY_SPACE

    space = yaml.safe_dump({**TINY_SPACE, "objectives": OBJECTIVES, "constraints": {}})
    a = write_run_dir(tmp_path / "a", realistic_trials(6, seed=1), space_yaml=space,
                      name=hostile, wall_seconds=1.0)
    b = write_run(tmp_path, "b", realistic_trials(6, seed=2))
    out, summary = compare_runs([a, b], out=tmp_path / "cmp")
    assert summary["runs"][0]["name"] == hostile
    cmp_page = (out / "index.html").read_text(encoding="utf-8")
    assert f"<h1>archsearch comparison: {escaped} vs b</h1>" in cmp_page
    assert f"</span> {escaped}</td>" in cmp_page
    assert hostile not in cmp_page


def test_html_escapes_script_everywhere(tmp_path):
    trials = realistic_trials(12)
    trials[0]["config"]["dynamic"] = XSS                   # config value (on the plots' hover)
    trials[1]["config"]["activation" + XSS] = "gelu"       # config key
    trials[2]["trial_id"] = "trial" + XSS                  # trial id
    trials[3].update(status="ERROR", metrics={}, error="RuntimeError: " + XSS)  # error text
    summary = write_report(trials, OBJECTIVES, tmp_path,
                           run_info={"name": "run" + XSS, "searcher": XSS,
                                     "space_file": "spaces/" + XSS + ".yaml"})
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<script>alert" not in page.lower()
    assert "</script><script>" not in page.lower().replace(" ", "")
    # the values are shown, escaped, not dropped
    assert "&lt;script&gt;alert(1)" in page
    assert summary["n_failed"] >= 1


def test_stopped_trial_can_be_on_the_front(tmp_path):
    trials = [make_trial(0, 0.80, 4e6), make_trial(1, 0.70, 1e6, status="STOPPED", epochs=1),
              make_trial(2, 0.75, 5e6)]
    summary = write_report(trials, OBJECTIVES, tmp_path)
    assert [p["trial_id"] for p in summary["pareto"]] == ["trial_00000", "trial_00001"]
    assert "STOPPED" in (tmp_path / "index.html").read_text(encoding="utf-8")


def test_zero_successful_trials(tmp_path):
    trials = [make_trial(0, 0.8, 1e6, status="ERROR", error="boom"),
              make_trial(1, math.nan, 2e6)]
    summary = write_report(trials, OBJECTIVES, tmp_path, run_info={"name": "all-failed"})
    assert summary["hypervolume"] == 0.0
    assert summary["pareto"] == []
    assert summary["n_trials"] == 2 and summary["n_failed"] == 2
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "no successful trials" in page.lower()
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_objective_front_is_best_trial(tmp_path):
    trials = realistic_trials(20)
    summary = write_report(trials, [{"metric": "accuracy", "mode": "max", "ref": 0.5}], tmp_path)
    accs = [t["metrics"]["accuracy"] for t in trials
            if t["status"] != "ERROR" and math.isfinite(t["metrics"]["accuracy"])]
    assert len(summary["pareto"]) == 1
    assert summary["pareto"][0]["metrics"]["accuracy"] == max(accs)
    assert summary["reference_point"] == [0.5]
    assert summary["hypervolume"] == pytest.approx(max(accs) - 0.5)


def test_three_objectives(tmp_path):
    trials = realistic_trials(30)
    objectives = OBJECTIVES + [{"metric": "latency_ms", "mode": "min"}]
    summary = write_report(trials, objectives, tmp_path)
    ok = [t for t in trials if t["status"] != "ERROR" and math.isfinite(t["metrics"]["accuracy"])]
    Y = np.array([[t["metrics"][o["metric"]] for o in objectives] for t in ok])
    modes = [o["mode"] for o in objectives]
    ref = summary["reference_point"]
    signs = np.array([1.0, -1.0, -1.0])
    assert summary["hypervolume"] == pytest.approx(botorch_hv(Y * signs, list(np.array(ref) * signs)))
    assert summary["hypervolume"] == pytest.approx(hypervolume(Y, modes, ref))
    assert (tmp_path / "pareto.png").stat().st_size > 1000


def test_user_reference_point_is_used(tmp_path):
    trials = realistic_trials(20)
    objectives = [{"metric": "accuracy", "mode": "max", "ref": 0.6},
                  {"metric": "flops_per_sample", "mode": "min", "ref": 1e8}]
    summary = write_report(trials, objectives, tmp_path)
    assert summary["reference_point"] == [0.6, 1e8]
    assert summary["objectives"] == OBJECTIVES  # "ref" is not echoed: shape stays exact


@pytest.mark.parametrize("bad", [
    {"status": "BOGUS"},
    {"trial_id": None},
])
def test_contract_violations_raise(tmp_path, bad):
    trials = realistic_trials(3)
    trials[1].update(bad)
    with pytest.raises(ValueError):
        write_report(trials, OBJECTIVES, tmp_path)


def test_bad_objective_mode_raises(tmp_path):
    with pytest.raises(ValueError):
        write_report(realistic_trials(3), [{"metric": "accuracy", "mode": "maximise"}], tmp_path)


# ------------------------------------------------------------------------------------------
# dynamic trials (anytime curves, tying map), unfinished trials, the page's scripts
# ------------------------------------------------------------------------------------------


def dynamic_trials() -> list[dict]:
    """A static trial and a length-drop trial whose anytime curve has three points: #0 is
    cheaper than everything, #1 dominates the static trial, #2 is dominated by #1."""
    static = make_trial(0, 0.80, 4e6)
    dyn = make_trial(1, 0.82, 8e6, dynamic="length_drop")
    dyn["metrics"]["anytime_curve"] = [
        {"flops_per_sample": 1e6, "accuracy": 0.78, "latency_ms": 0.1, "length_config": [20, 10]},
        {"flops_per_sample": 3e6, "accuracy": 0.81, "latency_ms": 0.2, "length_config": [40, 30]},
        {"flops_per_sample": 5e6, "accuracy": 0.79, "latency_ms": 0.3, "length_config": [44, 40]},
    ]
    dyn["metrics"]["tying_map"] = [0, 0, 2]
    return [static, dyn]


def test_anytime_curve_points_enter_the_front(tmp_path):
    objectives = [{"metric": "accuracy", "mode": "max", "ref": 0.7},
                  {"metric": "flops_per_sample", "mode": "min", "ref": 1e7}]
    summary = write_report(dynamic_trials(), objectives, tmp_path, run_info={"name": "dyn"})
    assert {p["trial_id"] for p in summary["pareto"]} == {"trial_00001", "trial_00001#0",
                                                          "trial_00001#1"}
    sub = next(p for p in summary["pareto"] if p["trial_id"] == "trial_00001#0")
    # same config plus the point's own settings; the point's own metrics
    assert sub["config"]["dynamic"] == "length_drop" and sub["config"]["length_config"] == [20, 10]
    assert sub["metrics"]["flops_per_sample"] == 1e6 and sub["metrics"]["accuracy"] == 0.78
    assert summary["n_trials"] == 2 and summary["n_failed"] == 0
    # front (1e6, .78), (3e6, .81), (8e6, .82) over ref (1e7, .7), by hand:
    # 2e6*0.08 + 5e6*0.11 + 2e6*0.12 = 9.5e5 (the trials alone would give 6.4e5)
    assert summary["hypervolume"] == pytest.approx(9.5e5)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "trial_00001#0" in page and "anytime curve: trial_00001" in page
    assert "length_config" in page
    assert "tying_map" in page and "[0, 0, 2]" in page  # final tying map next to the config
    with (tmp_path / "trials.csv").open(newline="") as fh:
        ids = [r["trial_id"] for r in csv.DictReader(fh)]
    assert ids == ["trial_00000", "trial_00001", "trial_00001#0", "trial_00001#1", "trial_00001#2"]


def test_a_subtrials_repro_config_is_its_trials_and_a_nan_metric_is_not_a_setting():
    """A point setting that shares a name with a trial config key (a gamma sweep of a model
    trained with ``gamma``) is the sub-trial's config, but re-training needs the trial's own
    value; a known metric holding NaN is left out, not shown as an inference-time setting."""
    from archsearch.report.data import build_report_data

    trials = dynamic_trials()
    trials[1]["config"]["gamma"] = 0.5
    trials[1]["metrics"]["anytime_curve"] = [
        {"flops_per_sample": 1e6, "accuracy": 0.78, "latency_ms": math.nan, "gamma": 0.3}]
    sub = next(r for r in build_report_data(trials, OBJECTIVES).subtrials)
    assert sub.config["gamma"] == 0.3 and sub.repro_config["gamma"] == 0.5
    assert sub.repro_config == trials[1]["config"]
    assert sub.settings == {"gamma": 0.3} and "latency_ms" not in sub.metrics


def test_anytime_points_inherit_model_metrics_and_bad_points_are_dropped(tmp_path):
    trials = dynamic_trials()
    trials[1]["metrics"]["anytime_curve"].append({"flops_per_sample": 2e6, "latency_ms": 0.1})
    # params_trainable is not in the points: taken from the trial, so the constraint applies
    limit = trials[1]["metrics"]["params_trainable"] - 1
    summary = write_report(trials, OBJECTIVES, tmp_path,
                           constraints={"params_trainable": {"max": limit}})
    assert {p["trial_id"] for p in summary["pareto"]} == {"trial_00000"}
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "1 point(s) without objective or constraint values left out" in page


def gating_trials() -> list[dict]:
    """Static layer cuts (one without a gating key: the default, static) around two dynamic
    trials, and a failed static trial. The static front is s0, s1, s3 (s2 is dominated by s1;
    s3 is on it though the dht trial dominates it)."""
    return [
        make_trial(0, 0.70, 1e6),  # no gating key
        make_trial(1, 0.74, 2e6, gating="static", n_layers=2),
        make_trial(2, 0.73, 3e6, gating="static", n_layers=3),
        make_trial(3, 0.76, 3e6, gating="static", n_layers=3),
        make_trial(4, 0.78, 2.5e6, gating="dht", flops_budget=0.5),
        make_trial(5, 0.82, 3.5e6, gating="depth_predictor", flops_budget=0.6),
        make_trial(6, math.nan, 1e6, status="ERROR", error="RuntimeError: x", gating="static"),
    ]


def test_static_front_is_drawn_under_a_run_mixing_gatings(tmp_path):
    from archsearch.report.data import build_report_data
    from archsearch.report.figures import scatter_figure, scatter_note
    from archsearch.report.pngs import pareto_png
    from archsearch.report.style import STATIC_FRONT_NAME

    data = build_report_data(gating_trials(), OBJECTIVES)
    assert data.mixes_gating
    fig = scatter_figure(data)
    static = [t for t in fig["data"] if t["name"] == STATIC_FRONT_NAME]
    assert STATIC_FRONT_NAME == "static front (gating: static)" and len(static) == 1
    trace = static[0]
    assert fig["data"].index(trace) == 0  # beneath every point trace
    assert trace["mode"] == "lines" and trace["line"]["shape"] == "hv"  # flops minimised
    assert trace["x"] == [1e6, 2e6, 3e6] and trace["y"] == [0.70, 0.74, 0.76]
    assert "dashed orange line" in scatter_note(data)
    # every point's hover names its gating (the default one too)
    hovers = {h.split("</b>")[0].removeprefix("<b>"): h
              for t in fig["data"] for h in t.get("hovertext") or []}
    assert "<b>gating</b> = static" in hovers["trial_00000"]
    assert "<b>gating</b> = dht" in hovers["trial_00004"]
    assert "<b>gating</b> = depth_predictor" in hovers["trial_00005"]
    assert pareto_png(data).startswith(b"\x89PNG")
    # the page carries it through the templates
    write_report(gating_trials(), OBJECTIVES, tmp_path)
    assert STATIC_FRONT_NAME in (tmp_path / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("gating", [None, "static", "dht"])
def test_no_static_front_when_all_trials_share_a_gating(gating):
    from archsearch.report.data import build_report_data
    from archsearch.report.figures import scatter_figure, scatter_note
    from archsearch.report.style import STATIC_FRONT_NAME

    trials = gating_trials()
    for t in trials:
        t["config"].pop("gating", None)
        if gating is not None:
            t["config"]["gating"] = gating
    # a failed trial of another gating does not make a mix
    trials[6]["config"]["gating"] = "depth_predictor" if gating != "depth_predictor" else "dht"
    data = build_report_data(trials, OBJECTIVES)
    assert not data.mixes_gating
    fig = scatter_figure(data)
    assert all(t["name"] != STATIC_FRONT_NAME for t in fig["data"])
    assert "dashed orange line" not in scatter_note(data)
    assert not any("<b>gating</b>" in h for t in fig["data"] for h in t.get("hovertext") or [])


def test_running_trial_is_counted_as_failed(tmp_path):
    trials = realistic_trials(6)
    trials[2]["status"] = "RUNNING"
    summary = write_report(trials, OBJECTIVES, tmp_path)
    assert "trial_00002" not in {p["trial_id"] for p in summary["pareto"]}
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "unfinished" in page
    expected = sum(t["status"] in ("ERROR", "RUNNING")
                   or not math.isfinite(t["metrics"].get("accuracy", math.nan)) for t in trials)
    assert summary["n_failed"] == expected


def test_three_objectives_page_has_a_3d_view(tmp_path):
    objectives = OBJECTIVES + [{"metric": "latency_ms", "mode": "min"}]
    write_report(realistic_trials(15), objectives, tmp_path)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert '"type":"scatter3d"' in page


def test_figure_json_cannot_end_its_script_element(tmp_path):
    """With hostile strings in hover texts the page still has exactly the script elements
    we wrote: plotly.js, the hover table and one per figure."""
    from html.parser import HTMLParser

    trials = realistic_trials(10)
    trials[0]["config"]["dynamic"] = XSS + "<!--"
    trials[1]["trial_id"] = "x" + XSS
    write_report(trials, OBJECTIVES, tmp_path, run_info={"name": XSS})
    page = (tmp_path / "index.html").read_text(encoding="utf-8")

    class Scripts(HTMLParser):
        n = 0

        def handle_starttag(self, tag, attrs):
            self.n += tag == "script"

    parser = Scripts()
    parser.feed(page)
    assert parser.n == 2 + page.count("Plotly.newPlot(")
    assert "<script>alert" not in page.lower()


# ------------------------------------------------------------------------------------------
# compare
# ------------------------------------------------------------------------------------------


def write_run(root, name: str, trials: list[dict], objectives=OBJECTIVES):
    """A run directory as the runner leaves it (run.json, space.yaml, trials/)."""
    import yaml

    from archsearch.report.synthetic import write_run_dir
    from conftest import TINY_SPACE

    spec = {**TINY_SPACE, "objectives": objectives, "constraints": {}}
    return write_run_dir(root / name, trials, space_yaml=yaml.safe_dump(spec), name=name,
                         wall_seconds=60.0)


def test_compare_two_runs(tmp_path):
    from archsearch.report.compare import compare_runs

    dyn = dynamic_trials()[1]
    dyn["trial_id"] = "dynamic_00001"
    a = write_run(tmp_path, "random", realistic_trials(20, seed=1))
    b = write_run(tmp_path, "tpe", realistic_trials(25, seed=2) + [dyn])
    out, summary = compare_runs([a, b], out=tmp_path / "cmp")
    for f in ("index.html", "compare.png", "compare.json"):
        assert (out / f).is_file(), f
    assert json.loads((out / "compare.json").read_text()) == summary
    runs = summary["runs"]
    assert [r["name"] for r in runs] == ["random", "tpe"]
    assert [r["n_trials"] for r in runs] == [20, 26]
    # one reference point for both: the usual rule over the union of their feasible points
    ys = []
    for r, trials in zip(runs, (realistic_trials(20, seed=1),
                                realistic_trials(25, seed=2) + [dyn])):
        single = write_report(trials, OBJECTIVES, tmp_path / ("single-" + r["name"]))
        assert r["n_failed"] == single["n_failed"]
        ok = [t for t in trials if t["status"] != "ERROR"
              and math.isfinite(t["metrics"]["accuracy"])]
        Y = [[t["metrics"]["accuracy"], t["metrics"]["flops_per_sample"]] for t in ok]
        Y += [[p["accuracy"], p["flops_per_sample"]]
              for t in ok for p in t["metrics"].get("anytime_curve", [])]
        ys.append(np.array(Y))
        assert r["best"]["accuracy"] == pytest.approx(np.max(ys[-1][:, 0]))
    ref = reference_point(np.vstack(ys), ["max", "min"])
    assert summary["reference_point"] == pytest.approx(ref)
    for r, Y in zip(runs, ys):
        assert r["hypervolume"] == pytest.approx(hypervolume(Y, ["max", "min"], ref))
    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.count("Plotly.newPlot(") >= 2 and "random" in page and "tpe" in page
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_rejects_mismatched_objectives(tmp_path):
    import subprocess
    import sys

    from archsearch.errors import UserError
    from archsearch.report.compare import compare_runs

    a = write_run(tmp_path, "a", realistic_trials(5))
    b = write_run(tmp_path, "b", realistic_trials(5),
                  objectives=[{"metric": "accuracy", "mode": "max"},
                              {"metric": "latency_ms", "mode": "min"}])
    with pytest.raises(UserError) as err:
        compare_runs([a, b], out=tmp_path / "cmp")
    assert str(b) in str(err.value) and "latency_ms" in str(err.value)
    # the CLI prints it as one line, exit code 2
    proc = subprocess.run([sys.executable, "-m", "archsearch.cli", "compare", str(a), str(b),
                           "--out", str(tmp_path / "cmp")], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert str(b) in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "cmp" / "index.html").exists()


# ------------------------------------------------------------------------------------------
# report_run: a run directory -> reports/<run name>/
# ------------------------------------------------------------------------------------------


def test_report_run_writes_the_report_of_a_run_directory(tmp_path, monkeypatch):
    from archsearch.errors import UserError
    from archsearch.report import report_run

    trials = realistic_trials(12)
    run = write_run(tmp_path / "runs", "my-run", trials)
    monkeypatch.chdir(tmp_path)
    out, summary = report_run(run, reports="reports")
    assert out.resolve() == tmp_path / "reports" / "my-run"
    for f in ("index.html", "pareto.png", "hypervolume.png", "trials.csv", "pareto.json"):
        assert (out / f).is_file(), f
    assert json.loads((out / "pareto.json").read_text()) == summary
    # the same numbers as the records handed to write_report directly
    assert summary == write_report(trials, OBJECTIVES, tmp_path / "direct")
    page = (out / "index.html").read_text(encoding="utf-8")
    # the header shows the run spec, with paths relative to the working directory
    assert "<th>Run</th><td>my-run</td>" in page
    assert "<th>Run directory</th><td>runs/my-run</td>" in page
    assert "<th>Search space</th><td>runs/my-run/space.yaml</td>" in page
    assert "<th>cpus_per_trial</th><td>1.0</td>" in page
    assert "<th>Wall time</th><td>1 min 00 s (60.0 s)</td>" in page
    assert "<th>argv</th>" not in page and "<th>fixed</th>" not in page
    # out_dir instead of reports/<name>
    other, _ = report_run(run, out_dir=tmp_path / "elsewhere")
    assert other == tmp_path / "elsewhere" and (other / "index.html").is_file()
    with pytest.raises(UserError, match="not a run directory"):
        report_run(tmp_path / "runs", reports="reports")


def test_report_command_exits_1_without_a_result_and_writes_only_under_reports(tmp_path):
    """``archsearch report`` (in-process, as the fuzz tests run the CLI): the directory's own
    name decides where the report goes (not run.json's ``name``, which could be ``../x`` in a
    run from elsewhere); a run without one result is written and exits 1, as ``search`` does;
    an ``--out`` that is a file is one line, exit 2; so is a malformed record, naming it."""
    import yaml

    from archsearch.report.synthetic import write_run_dir
    from conftest import TINY_SPACE, load_benchmark

    def report(*argv):
        code, _, err, _, trace = load_benchmark("product.fuzz").run_cli_inprocess(["report", *argv], tmp_path)
        assert not trace, trace
        return code, err.strip()

    space = yaml.safe_dump({**TINY_SPACE, "objectives": OBJECTIVES, "constraints": {}})
    failed = [{"trial_id": f"t{i}", "status": "ERROR", "config": {"lr": 1e-3}, "metrics": {},
               "history": [], "error": "FloatingPointError: training loss is nan"} for i in range(2)]
    run = write_run_dir(tmp_path / "runs" / "moved", failed, space_yaml=space, name="../../escape")
    code, err = report(str(run), "--reports", str(tmp_path / "reports"))
    assert code == 1 and err.startswith("error: all 2 trials failed (first error: FloatingPointError"), err
    assert (tmp_path / "reports" / "moved" / "index.html").is_file()
    assert not (tmp_path.parent / "escape").exists() and not (tmp_path / "escape").exists()

    (tmp_path / "a-file").write_text("x")
    code, err = report(str(run), "--out", str(tmp_path / "a-file"))
    assert (code, err) == (2, f"error: {tmp_path / 'a-file'}: --out: cannot write the report (File exists)")

    (run / "trials" / "t0.json").write_text('{"trial_id": "t0", "status": "ERROR", "started": null, '
                                           '"config": [1]}')
    code, err = report(str(run))
    assert (code, err) == (2, f"error: {run / 'trials' / 't0.json'}: config: expected dict, got list")


def test_report_package_is_cheap_and_reads_runs_without_archsearch_tune():
    import subprocess
    import sys

    code = ("import sys, archsearch.report as r; "
            "print(sorted(m for m in ('numpy', 'plotly', 'matplotlib', 'torch', 'pydantic') "
            "if m in sys.modules)); "
            "import archsearch.report.compare, archsearch.report.files, archsearch.report.inputs; "
            "print(sorted(m for m in sys.modules if m.startswith(('archsearch.tune', 'ray', "
            "'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout


def test_unknown_objective_metric_raises(tmp_path):
    with pytest.raises(ValueError, match=r"objectives\[1\]\.metric: .*unknown metric 'flops'"):
        write_report(realistic_trials(3), [OBJECTIVES[0], {"metric": "flops", "mode": "min"}],
                     tmp_path)


def test_an_integer_too_large_for_a_float_is_a_failed_value_not_a_crash(tmp_path):
    """A record holding a 401-digit integer (JSON allows it) makes that trial failed; the
    report is still written (it raised OverflowError)."""
    trials = realistic_trials(3)
    trials[0]["metrics"]["flops_per_sample"] = 10 ** 400
    summary = write_report(trials, OBJECTIVES, tmp_path)
    assert summary["n_failed"] == 1 and (tmp_path / "index.html").is_file()


def test_single_objective_png_draws_the_same_points_as_the_page():
    """One objective: the PNG draws the anytime curves' sub-trials too (at their trial's
    number), so its best point is pareto.json's (before: trials only, and another "best")."""
    from archsearch.report.data import build_report_data
    from archsearch.report.pngs import _png_single_objective, new_figure
    from archsearch.report.synthetic import synthetic_trials

    data = build_report_data(synthetic_trials(30, seed=1, dynamic=True),
                             [{"metric": "flops_per_sample", "mode": "min"}])
    assert data.subtrials and any(r.pareto for r in data.subtrials)
    ax = new_figure(6, 4).subplots()
    _png_single_objective(ax, data)
    labels = {c.get_label(): c for c in ax.collections}
    feasible = sum(r.feasible and not r.pareto for r in data.rows)
    assert f"feasible ({feasible})" in labels, list(labels)
    best = [r for r in data.rows if r.pareto]
    assert labels["best trial"].get_offsets()[:, 1].tolist() == [data.Y[r.index, 0] for r in best]
    line = next(ln for ln in ax.lines if ln.get_label() == "best trial so far")
    assert line.get_ydata()[-1] == min(data.Y[r.index, 0] for r in data.rows if r.feasible)


def test_the_printed_summary_shows_config_values_and_paths_as_they_are(tmp_path, capsys):
    """rich markup in a config value or the report path is printed literally (before: a
    MarkupError traceback after the files were written, or the text swallowed)."""
    from archsearch.cli import _print_summary

    summary = {"objectives": [{"metric": "accuracy", "mode": "max"}], "n_trials": 1, "n_failed": 0,
               "pareto": [{"trial_id": "t1", "metrics": {"accuracy": 0.8}, "config": {"act": "[/bold]"}}],
               "hypervolume": 0.1, "reference_point": [0.7]}
    _print_summary(summary, tmp_path / "x[/b]" / "[draft]", None, None)
    out = capsys.readouterr().out
    assert "act=[/bold]" in out and str(tmp_path / "x[/b]" / "[draft]" / "index.html") in out.replace("\n", "")


@pytest.mark.parametrize("m", [2, 3])
def test_compare_png_joins_a_front_only_with_two_objectives(m):
    """With three objectives the first pair's projection of a front zigzags through points
    dominated in that plane: no attainment line (as pareto.png and the page); with two, one per
    run. The front's points are drawn either way."""
    from archsearch.report.data import build_report_data
    from archsearch.report.pngs import draw_runs_scatter, new_figure
    from archsearch.report.synthetic import synthetic_trials

    objs = [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"},
            {"metric": "latency_ms", "mode": "min"}][:m]
    datas = [build_report_data(synthetic_trials(20, seed=s), objs) for s in (0, 1)]
    ax = new_figure(6, 4).subplots()
    draw_runs_scatter(ax, datas)
    assert len(ax.lines) == (2 if m == 2 else 0)
    assert len(ax.collections) == 4  # each run: its feasible points, its front
