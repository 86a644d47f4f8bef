"""Search-space validation: every user mistake is one line naming the file and the field."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from archsearch.errors import UserError
from archsearch.space import load_space
from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]

BASE = """\
name: t
objectives:
  - {metric: accuracy, mode: max}
params:
  n_layers: {type: int, low: 1, high: 3}
  gating: {type: categorical, choices: [static, dht]}
  dht_lambda: {type: float, low: 0.01, high: 1.0, log: true, when: {gating: dht}}
"""


CROSS = """\
name: t
objectives:
  - {metric: accuracy, mode: max}
params:
  n_layers: {type: int, low: 1, high: 3}
fixed: {gating: depth_predictor, depth_all_exits: false, depth_supervision: 0.5}
"""


def test_settings_that_go_together_are_not_judged_when_one_is_searched(tmp_path):
    """With one of the strategy's settings searched, some trials may get a combination that
    works: the space is not refused (each trial's own check still applies)."""
    text = CROSS.replace("fixed: {gating: depth_predictor, depth_all_exits: false, ",
                         "  depth_all_exits: {type: categorical, choices: [true, false]}\nfixed: {gating: depth_predictor, ")
    assert load_space(write(tmp_path, text)).params["depth_all_exits"].choices == [True, False]


def write(tmp_path, text, name="space.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")))
def test_shipped_spaces_are_valid(path):
    space = load_space(path)
    assert space.objectives and space.params


def test_conditional_param_only_when_condition_holds(tmp_path):
    space = load_space(write(tmp_path, BASE))
    assert space.active("dht_lambda", {"gating": "dht"})
    assert not space.active("dht_lambda", {"gating": "static"})
    assert not space.active("dht_lambda", {})
    x = space.encode({"n_layers": 3, "gating": "static"})
    assert space.decode(x) == {"n_layers": 3, "gating": "static"}
    cfg = space.decode(space.encode({"n_layers": 1, "gating": "dht", "dht_lambda": 0.1}))
    assert cfg == {"n_layers": 1, "gating": "dht", "dht_lambda": pytest.approx(0.1)}
    # unit cube: n_layers 1..3 linear, gating one-hot, dht_lambda on a log scale (0.1 is the
    # geometric middle of [0.01, 1], so it maps to 0.5, not to (0.1 - 0.01) / 0.99)
    dims = space.dims()
    assert dims == [("n_layers", None), ("gating", "static"), ("gating", "dht"), ("dht_lambda", None)]
    assert space.encode({"n_layers": 2, "gating": "dht", "dht_lambda": 0.1}) == pytest.approx(
        [0.5, 0.0, 1.0, 0.5])
    assert space.encode({"n_layers": 3, "gating": "dht", "dht_lambda": 1.0}) == pytest.approx(
        [1.0, 0.0, 1.0, 1.0])


def check_samples(cfgs: list[dict]) -> None:
    """What any sampler of ``BASE`` must give over a few hundred draws: values within the
    bounds (``high`` included), the conditional param exactly when its condition holds, and
    ``dht_lambda`` log-uniform: half of it below 0.1, the geometric middle of [0.01, 1]
    (a uniform sampler puts 9 % there)."""
    assert len(cfgs) >= 200
    layers = [c["n_layers"] for c in cfgs]
    assert all(isinstance(n, int) for n in layers)
    assert set(layers) == {1, 2, 3}, sorted(set(layers))
    assert all(layers.count(n) > 0.2 * len(cfgs) for n in (1, 2, 3))
    gatings = [c["gating"] for c in cfgs]
    assert set(gatings) == {"static", "dht"}
    assert 0.35 < gatings.count("dht") / len(cfgs) < 0.65
    for c in cfgs:
        if c["gating"] == "dht":
            assert 0.01 <= c["dht_lambda"] <= 1.0, c
        else:
            assert c.get("dht_lambda") is None, c
    lams = [c["dht_lambda"] for c in cfgs if c["gating"] == "dht"]
    below = sum(lam < 0.1 for lam in lams) / len(lams)
    assert 0.35 < below < 0.65, f"{below:.0%} of dht_lambda below 0.1: not log-uniform"
    mean_log = sum(math.log10(lam) for lam in lams) / len(lams)
    assert -1.2 < mean_log < -0.8, mean_log  # log-uniform on [-2, 0]: mean -1


def test_optuna_define_by_run_respects_conditions(tmp_path):
    import optuna

    space = load_space(write(tmp_path, BASE))

    def draw(seed, n=300):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        cfgs = []
        for _ in range(n):
            trial = study.ask()
            cfg = space.suggest(trial)
            assert cfg == trial.params  # only the active params are suggested
            cfgs.append(cfg)
            study.tell(trial, 0.0)
        return cfgs

    cfgs = draw(seed=0)
    check_samples(cfgs)
    assert draw(seed=0, n=20) == cfgs[:20]  # seeded: reproducible
    assert draw(seed=1, n=20) != cfgs[:20]
    dists = space.to_optuna()
    assert set(dists) == {"n_layers", "gating", "dht_lambda"}
    assert dists["dht_lambda"].log and (dists["dht_lambda"].low, dists["dht_lambda"].high) == (0.01, 1.0)
    assert (dists["n_layers"].low, dists["n_layers"].high) == (1, 3)


def test_ray_param_space_samples_conditions(tmp_path):
    import numpy as np
    from ray.tune.search.variant_generator import generate_variants

    space = load_space(write(tmp_path, BASE))
    param_space = space.to_ray()

    def draw(seed, n=300):
        # Ray samples plain domains from random_state, a sample_from (the conditional
        # dht_lambda) from numpy's global generator: seed both, restore the global one.
        saved = np.random.get_state()
        np.random.seed(seed)
        try:
            rng = np.random.RandomState(seed)
            return [cfg for _ in range(n) for _, cfg in generate_variants(param_space, random_state=rng)]
        finally:
            np.random.set_state(saved)

    cfgs = draw(seed=0)
    assert len(cfgs) == 300  # one variant per call: no grid search in the space
    check_samples(cfgs)
    assert draw(seed=0, n=20) == cfgs[:20]
    assert draw(seed=1, n=20) != cfgs[:20]


@pytest.mark.parametrize(
    "text, field",
    [
        ("name: t\nobjectives: [ {metric: accuracy, mode: max}\n", "line"),  # malformed YAML
        (BASE.replace("type: int", "type: integer"), "params.n_layers.type"),
        (BASE.replace("low: 1, high: 3", "low: 5, high: 3"), "params.n_layers"),
        (BASE.replace("metric: accuracy", "metric: acuracy"), "objectives.0.metric"),
        (BASE + "dataset: {name: rotten, vocab_sise: 10}\n", "dataset.vocab_sise"),
        (BASE + "budget: {trials: many}\n", "budget.trials"),
        (BASE + "colour: blue\n", "colour"),
        (BASE.replace("n_layers:", "n_layerz:"), "params.n_layerz"),
        (BASE.replace("when: {gating: dht}", "when: {gating: fast}"), "params.dht_lambda.when.gating"),
        (BASE + "constraints: {params_trainable: {max: 1, min: 5}}\n", "constraints.params_trainable"),
        (BASE + "fixed: {dht_routing: twice}\n", "fixed.dht_routing"),
        (BASE + "fixed: {exit_loss: max}\n", "fixed.exit_loss"),
        (BASE + "task: lm\nfixed: {dht_routing: cascade}\n", "fixed.dht_routing"),
        (BASE + "  dht_reward: {type: categorical, choices: [prob, acc]}\n", "params.dht_reward.choices"),
        (BASE + "  exit_loss: {type: float, low: 0, high: 1}\n", "params.exit_loss"),
        ("- just\n- a list\n", None),
        (BASE.replace("low: 1, high: 3", "low: 1, high: 8, log: true, step: 2"), "params.n_layers"),
        # model and optimiser values: refused when loaded, not when a trial builds its model
        (BASE + "fixed: {lr: fast}\n", "fixed.lr: 'fast': Input should be a valid number"),
        (BASE.replace("low: 1, high: 3", "low: 0, high: 3"), "params.n_layers.low: 0"),
        (BASE + "fixed: {dropout: 1.5}\n", "fixed.dropout: 1.5: Input should be less than 1"),
        (BASE + "fixed: {n_layers: 1.5}\n", "fixed.n_layers: 1.5: Value error, must be a whole number"),
        (BASE + "constraints: {accuracy: {min: 1.5}}\n", "accuracy: no trial can meet min 1.5"),
        (BASE + "constraints: {latency_ms: {max: -1}}\n", "latency_ms: no trial can meet max -1"),
        (BASE + "constraints: {flops_per_sample: {max: .nan}}\n", "constraints.flops_per_sample.max"),
        (BASE + "budget: {time_budget_s: .inf}\n", "budget.time_budget_s"),
        (BASE.replace("when: {gating: dht}", "when: {gating: []}"), "params.dht_lambda.when.gating: an empty list"),
        (BASE + "fixed: {batch_size: 0}\n", "fixed.batch_size: 0"),
        (BASE + "  d_model: {type: categorical, choices: [30, 64]}\n  n_heads: {type: categorical, choices: [4]}\n",
         "params.d_model: d_model 30 is not divisible by n_heads 4"),
        # a key twice: YAML keeps the last silently (the first params block vanished)
        (BASE + "params:\n  lr: {type: float, low: 0.001, high: 0.01}\n", "line 8, column 1: malformed YAML: duplicate key 'params'"),
        (BASE.replace("  gating:", "  n_layers: {type: int, low: 2, high: 4}\n  gating:"), "line 6, column 3: malformed YAML: duplicate key 'n_layers'"),
        # found by a review: each loaded, then failed after launch or after the trials trained
        (BASE.replace("metric: accuracy, mode: max", "metric: perplexity, mode: min"),
         "objectives.0.metric: 'perplexity' is reported by task 'lm' only; this space's task is 'classification'"),
        (BASE + "task: lm\n", "objectives.0.metric: 'accuracy' is reported by task 'classification' only"),
        (BASE + "constraints: {perplexity: {max: 50}}\n", "constraints.perplexity: 'perplexity' is reported by task 'lm'"),
        (BASE + "seed: -5\n", "seed: Input should be greater than or equal to 0"),
        (BASE + "seed: 1180591620717411303424\n", "seed: Input should be less than or equal to 4294967295"),
        (BASE.replace("metric: accuracy, mode: max", "metric: accuracy, mode: max, ref: .nan"),
         "objectives.0.ref: Input should be a finite number"),
        (BASE + "  dropout: {type: float, low: 0, high: 0.3, step: .inf}\n", "params.dropout.step: Input should be a finite number"),
        (BASE + "fixed: {lr: .nan}\n", "fixed.lr: Input should be a finite number"),
        (BASE + "  d_model: {type: categorical, choices: [64, .inf]}\n", "params.d_model.choices.1: Input should be a finite number"),
        # settings that must go together, all fixed: what every trial gets (before: each key
        # was checked alone, and every trial failed)
        (CROSS, "fixed.depth_supervision: gating depth_predictor: depth_supervision: 0.5 > 0 needs depth_all_exits"),
    ],
)
def test_bad_spaces_raise_one_line_naming_file_and_field(tmp_path, text, field):
    p = write(tmp_path, text)
    with pytest.raises(UserError) as ei:
        load_space(p)
    line = ei.value.one_line()
    assert "\n" not in line
    assert line.startswith(str(p))
    if field:
        assert field in line, line


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="file not found"):
        load_space(tmp_path / "nope.yaml")


def test_yaml_is_loaded_safely(tmp_path):
    p = write(tmp_path, "!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(UserError, match="malformed YAML"):
        load_space(p)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["search", "MISSING.yaml"], "MISSING.yaml: file not found"),
        (["search", "BAD.yaml"], "params.n_layers.type"),
        (["search", "GOOD.yaml", "--searcher", "bogus"], "--searcher"),
        (["data", "prepare", "no_such_dataset"], "no_such_dataset"),
        (["report", "NOT_A_RUN"], "not a run directory"),
        (["resume", "NOT_A_RUN"], "not a run directory"),
        (["search", "GOOD.yaml", "--address", "127.0.0.1:1"], "127.0.0.1:1: --address: no Ray cluster"),
        (["search", "GOOD.yaml", "--address", "nonsense"], "--address"),
    ],
)
def test_cli_bad_input_exit_2_one_line_no_traceback(tmp_path, args, needle):
    write(tmp_path, BASE.replace("type: int", "type: integer"), "BAD.yaml")
    write(tmp_path, BASE, "GOOD.yaml")
    (tmp_path / "NOT_A_RUN").mkdir()
    proc = run_cli(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_help_is_fast_and_imports_no_heavy_library():
    code = ("import sys, archsearch.cli as c; sys.argv=['archsearch','--help']\n"
            "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
            "heavy=[m for m in ('torch','ray','botorch','optuna') if m in sys.modules]\n"
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "search" in proc.stdout


def test_impossible_constraint_is_refused_before_launch(tmp_path, cache_dir):
    from archsearch.tune.runner import run_search

    text = BASE.replace("params:\n", "constraints:\n  params_trainable: {max: 1000}\n"
                        "dataset: {vocab_size: 500, max_len: 16, max_train_samples: 64}\nparams:\n")
    space = load_space(write(tmp_path, text))
    with pytest.raises(UserError) as ei:
        run_search(space, storage=tmp_path / "runs", progress=False)
    assert "constraints.params_trainable.max" in ei.value.one_line()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_existing_run_name_and_unwritable_storage(tmp_path):
    from archsearch.runs import RunDir

    def check_run_dir(storage, name):
        return RunDir.create(storage, name).path

    run = check_run_dir(tmp_path / "runs", "a")
    assert run == tmp_path / "runs" / "a" and run.is_dir()
    (run / "run.json").write_text("{}")
    with pytest.raises(UserError, match="--name"):
        check_run_dir(tmp_path / "runs", "a")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # running as root: permissions are not enforced
            blocker = tmp_path / "file"
            blocker.write_text("x")
            with pytest.raises(UserError, match="--storage"):
                check_run_dir(blocker, "a")
        else:
            with pytest.raises(UserError, match="--storage"):
                check_run_dir(ro, "a")
    finally:
        ro.chmod(0o700)


def test_pinned_space_proposes_exactly_the_config(tmp_path):
    import optuna

    space = load_space(write(tmp_path, BASE)).pinned({"n_layers": 2, "gating": "dht", "dht_lambda": 0.5})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    assert space.suggest(study.ask()) == {"n_layers": 2, "gating": "dht", "dht_lambda": 0.5}
    with pytest.raises(UserError, match="--fixed"):
        space.pinned({"n_layers": 9})
    with pytest.raises(UserError, match="--fixed"):
        space.pinned({"colour": 1})
    # found by a review: a fraction for an int param and a d_model its heads do not divide
    # passed `check`, then trained 1 layer while the records said 1.5
    whole = load_space(write(tmp_path, BASE))
    with pytest.raises(UserError, match="--fixed: n_layers=1.5: n_layers is an int param"):
        whole.pinned({"n_layers": 1.5})
    assert whole.pinned({"n_layers": 2.0}).params["n_layers"].choices == [2.0]
    heads = load_space(write(tmp_path, BASE + "  d_model: {type: int, low: 32, high: 64, step: 32}\n"
                                              "  n_heads: {type: categorical, choices: [4]}\n", "heads.yaml"))
    with pytest.raises(UserError) as e:
        heads.pinned({"d_model": 34})
    assert str(e.value) == (f"{heads.source}: --fixed: d_model=34: params.d_model: d_model 34 is not divisible "
                            "by n_heads 4 (the space can pick both): every d_model must be a multiple of "
                            "every n_heads"), str(e.value)
    assert heads.pinned({"d_model": 64}).source == heads.source


def test_max_train_samples_is_a_fixed_random_subset_not_an_ordered_prefix(tmp_path):
    """The bundled rotten_tomatoes_sentences training split is ordered (its first 1,600 rows are
    97% positive): the cut must keep both classes near their share, the same rows every time."""
    from archsearch.data import prepare_for_space

    p = write(tmp_path, BASE + "dataset: {name: rotten_tomatoes_sentences, vocab_size: 500, max_len: 16, "
                               "max_train_samples: 1600}\n")
    a, b = prepare_for_space(load_space(p)), prepare_for_space(load_space(p))
    y = a.train.labels.float()
    assert len(y) == 1600 and 0.4 < float(y.mean()) < 0.6
    assert a.train.input_ids.equal(b.train.input_ids)


@pytest.mark.parametrize("path", sorted(str(p) for p in (Path(__file__).parent.parent / "search_spaces").glob("*.yaml")))
def test_a_pinned_trial_of_every_shipped_space_is_a_space_file_of_its_own(tmp_path, path):
    """``--fixed`` with a trial's whole config (what the report's repro command passes): the
    pinned space proposes exactly it, and its ``space.yaml`` (what report and resume read
    back) loads. (Before: pinning ``gating: static`` in dht.yaml kept ``dht_lambda`` and its
    ``when``, and the space was refused: "a setting of gating: dht, which this space never
    picks"; first when report or resume read it, then at check.)"""
    import optuna
    import yaml

    space = load_space(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(8):
        config = space.suggest(study.ask())
        pinned = space.pinned(config)
        assert pinned.suggest(optuna.create_study().ask()) == config
        written = tmp_path / "space.yaml"
        written.write_text(yaml.safe_dump(pinned.model_dump(mode="json"), sort_keys=False))
        assert load_space(written).suggest(optuna.create_study().ask()) == config
