"""Search-space validation: every user mistake is one line naming the file and the field."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from archsearch.errors import UserError
from archsearch.space import load_space

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
    x = space.encode({"n_layers": 3, "gating": "static"})
    assert space.decode(x) == {"n_layers": 3, "gating": "static"}
    cfg = space.decode(space.encode({"n_layers": 1, "gating": "dht", "dht_lambda": 0.1}))
    assert cfg["gating"] == "dht" and cfg["dht_lambda"] == pytest.approx(0.1)


def test_optuna_define_by_run_respects_conditions(tmp_path):
    import optuna

    space = load_space(write(tmp_path, BASE))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        cfg = space.suggest(trial)
        assert ("dht_lambda" in cfg) == (cfg["gating"] == "dht")
        assert 1 <= cfg["n_layers"] <= 3
        seen.add(cfg["gating"])
        study.tell(trial, 0.0)
    assert seen == {"static", "dht"}
    dists = space.to_optuna()
    assert set(dists) == {"n_layers", "gating", "dht_lambda"}


def test_ray_param_space_samples_conditions(tmp_path):
    from ray.tune.search.variant_generator import generate_variants

    space = load_space(write(tmp_path, BASE))
    cfgs = [cfg for _, cfg in generate_variants(space.to_ray())]
    for cfg in cfgs:
        assert (cfg["dht_lambda"] is not None) == (cfg["gating"] == "dht")


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
        ("- just\n- a list\n", None),
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
    proc = subprocess.run([sys.executable, "-m", "archsearch.cli", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
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
    from archsearch.tune.runner import check_run_dir

    run = check_run_dir(tmp_path / "runs", "a")
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
