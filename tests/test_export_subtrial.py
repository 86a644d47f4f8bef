"""A sub-trial ``ID#k`` (point ``k`` of a trial's anytime curve) exports at its own operating
point (issue 62): a real tiny LengthDrop trial (trained, its evolutionary search run, its
checkpoint written where a search writes it; no Ray), exported as ``ID#k``, records the point in
``archsearch.json`` and loads running the point's length configuration: on the validation split
the point's recorded accuracy and FLOPs per sample. ``--pareto`` writes each sub-trial on the
front to ``OUT/ID-k``; a point the trial does not have is one line, exit code 2."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_cli, tiny_space

TID = "ld001_00000"  # the LengthDrop trial
BROKEN = "st002_00001"  # a trial that failed: no curve, no weights


@pytest.fixture(scope="module")
def ld_run(tmp_path_factory, cache_dir):
    """``(run_dir, record)``: a run of one finished LengthDrop trial with its anytime curve and
    its checkpoint under ``tune/``, and one failed trial."""
    from archsearch.data import prepare_for_space
    from archsearch.runs import ERROR, RunDir, RunSpec, new_trial_record
    from archsearch.tune.runner import trial_settings
    from archsearch.tune.trainable import TrialLoop

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tmp = tmp_path_factory.mktemp("subtrial-run")
        space = tiny_space(tmp, dataset={"name": "rotten_tomatoes_sentences", "vocab_size": 1000,
                                         "max_len": 32, "max_train_samples": 512})
        run = RunDir.create(tmp / "runs", "ld")
        run.write_spec(RunSpec(name="ld", searcher="random", seed=int(space.seed), trials=2,
                               cpus_per_trial=1, gpus_per_trial=0))
        run.write_space(space)
        cfg = {"n_layers": 2, "d_model": 32, "n_heads": 2, "lr": 3e-3, "gating": "length_drop",
               "length_drop_p": 0.4, "evolution_iterations": 1, "evolution_mutations": 4,
               "evolution_crossovers": 4, "evolution_val_samples": 256}
        loop = TrialLoop(cfg, prepare_for_space(space), {**trial_settings(space, 1), "device": "cpu", "epochs": 1})
        metrics = loop.run_epoch()  # train, evaluate, finalize: the anytime curve
        ckpt = run.tune_dir / f"train_trial_{TID}_0" / "checkpoint_000000"
        ckpt.mkdir(parents=True)
        loop.save(str(ckpt))
        rec = {**new_trial_record(TID, cfg), "status": "TERMINATED", "metrics": metrics, "history": [metrics]}
        run.write_trial(rec)
        run.write_trial({**new_trial_record(BROKEN, {**cfg, "gating": "static"}), "status": ERROR,
                         "error": "diverged", "started": rec["started"] + 1})
    finally:
        torch.set_num_threads(old)
    curve = metrics["anytime_curve"]
    assert len(curve) >= 2 and curve[0]["flops_per_sample"] < metrics["flops_per_sample"], curve
    return run.path, rec


def cheapest(rec) -> int:
    curve = rec["metrics"]["anytime_curve"]
    return min(range(len(curve)), key=lambda k: curve[k]["flops_per_sample"])


def validation(model, run_dir):
    """``(accuracy, mean FLOPs per row)`` of ``model`` on the run's validation split, in the
    batches the trial was evaluated in."""
    from archsearch.data import prepare_for_space
    from archsearch.models.config import EVAL_BATCH_SIZE
    from archsearch.runs import RunDir

    val = prepare_for_space(RunDir(run_dir).load_space())["validation"]
    out = model.predict_ids(val.input_ids, val.attention_mask, batch_size=EVAL_BATCH_SIZE)
    return float((out.logits.argmax(-1) == val.labels).double().mean()), float(out.flops.mean())


def test_a_subtrial_exports_and_predicts_at_its_own_operating_point(ld_run, tmp_path):
    import archsearch
    from archsearch.export import export_trial, select_trials

    run_dir, rec = ld_run
    k = cheapest(rec)
    point = rec["metrics"]["anytime_curve"][k]
    sub = f"{TID}#{k}"
    assert select_trials(run_dir, trial=sub) == [sub]
    export_trial(run_dir, sub, tmp_path / "sub")
    meta = json.loads((tmp_path / "sub" / "archsearch.json").read_text())
    assert meta["trial_id"] == sub and meta["subtrial"] == k
    assert meta["operating_point"] == {"length_config": point["length_config"]}
    assert meta["gating_state"]["length_config"] == point["length_config"]
    assert meta["metrics"]["accuracy"] == point["accuracy"]
    assert meta["metrics"]["flops_per_sample"] == point["flops_per_sample"]
    assert meta["metrics"]["params_total"] == rec["metrics"]["params_total"]  # the trained model's

    model = archsearch.load(tmp_path / "sub")
    assert model.gating.length_config == tuple(point["length_config"])
    accuracy, flops = validation(model, run_dir)
    assert accuracy == pytest.approx(point["accuracy"], abs=1e-12)
    assert flops == pytest.approx(point["flops_per_sample"], rel=1e-9)
    preds = model.predict(["a gorgeous, witty, seductive movie", "the plot is a mess"])
    assert len(preds) == 2 and all(0 < p.flops < rec["metrics"]["flops_per_sample"] for p in preds)

    # the trial itself still exports at its own operating point (the full length)
    export_trial(run_dir, TID, tmp_path / "trial")
    whole = archsearch.load(tmp_path / "trial")
    meta = json.loads((tmp_path / "trial" / "archsearch.json").read_text())
    assert "subtrial" not in meta and "operating_point" not in meta and whole.gating.length_config is None
    accuracy, flops = validation(whole, run_dir)
    assert accuracy == pytest.approx(rec["metrics"]["accuracy"], abs=1e-12)
    assert flops == pytest.approx(rec["metrics"]["flops_per_sample"], rel=1e-9)


def test_pareto_exports_each_subtrial_on_the_front_to_its_own_directory(ld_run, tmp_path):
    from archsearch.export import export_dirname, select_trials
    from archsearch.report.data import build_report_data
    from archsearch.report.inputs import load_run

    run_dir, rec = ld_run
    run = load_run(run_dir)
    data = build_report_data(run.trials, run.objectives, run.constraints, run.run_info)
    front = [r.trial_id for r in data.rows if r.pareto]
    ids = select_trials(run_dir, pareto=True)
    assert ids == list(dict.fromkeys(front)) and f"{TID}#{cheapest(rec)}" in ids
    out = tmp_path / "front"
    proc = run_cli("export", run_dir, "--pareto", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.iterdir()} == {export_dirname(t) for t in ids}
    for t in ids:
        meta = json.loads((out / export_dirname(t) / "archsearch.json").read_text())
        assert meta["trial_id"] == t
        if "#" in t:
            k = int(t.split("#")[1])
            assert export_dirname(t) == f"{TID}-{k}" and meta["subtrial"] == k
            assert meta["operating_point"]["length_config"] == rec["metrics"]["anytime_curve"][k]["length_config"]


def test_the_reports_export_command_of_a_subtrial_exports_it(ld_run, tmp_path):
    """The report's Pareto row of sub-trial ``ID#k`` shows ``--trial 'ID#k' --out models/ID-k``;
    run as written, it writes that sub-trial."""
    import shlex
    import subprocess

    from archsearch.report.html import export_command
    from conftest import cli_command

    run_dir, rec = ld_run
    k = cheapest(rec)
    command = export_command(f"{TID}#{k}", {"run_dir": str(run_dir)})
    assert command.endswith(f"--trial '{TID}#{k}' --out models/{TID}-{k}"), command
    argv = shlex.split(command)
    proc = subprocess.run(cli_command(*argv[1:]), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "models" / f"{TID}-{k}" / "archsearch.json").read_text())
    assert meta["trial_id"] == f"{TID}#{k}" and meta["subtrial"] == k


def test_a_point_the_trial_does_not_have_is_one_line_exit_2(ld_run, tmp_path):
    from archsearch.errors import UserError
    from archsearch.export import select_trials

    run_dir, rec = ld_run
    n = len(rec["metrics"]["anytime_curve"])
    for trial, says in ((f"{TID}#{n}", f"--trial: no sub-trial '{TID}#{n}': trial {TID}'s anytime curve has {n}"),
                        (f"{BROKEN}#0", f"trial {BROKEN} has no anytime curve")):
        proc = run_cli("export", run_dir, "--trial", trial, "--out", tmp_path / "x")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (trial, proc.returncode, proc.stderr)
    assert not (tmp_path / "x").exists()
    for trial, says in ((f"{TID}#-1", "no sub-trial"), (f"{TID}#x", "is not a trial id ID or a sub-trial id ID#k")):
        with pytest.raises(UserError, match=says) as e:
            select_trials(run_dir, trial=trial)
        assert e.value.field == "--trial"


def test_only_a_gating_with_operating_points_takes_one():
    from archsearch.dynamic import gating_class
    from archsearch.models.transformer import Transformer, TransformerConfig

    model = Transformer(TransformerConfig(vocab_size=50, max_len=16, n_layers=2, d_model=16, n_heads=2, d_ffn=32))
    static = gating_class("static")(model, {"gating": "static"}, {"seed": 0})
    with pytest.raises(ValueError, match="gating 'static' has no operating points"):
        static.set_operating_point({"length_config": [8, 4]})
    ld = gating_class("length_drop")(model, {"gating": "length_drop"}, {"seed": 0})
    ld.set_operating_point({"length_config": [12, 6]})
    assert ld.length_config == (12, 6)
    for bad in ({"length_config": [12, 13]}, {"length_config": [12, 6], "lambda": 1}, {}, {"length_config": 3}):
        with pytest.raises(ValueError):
            ld.set_operating_point(bad)
