"""The run layer without Ray: run directory and spec, resume settings, the one searcher path,
the pre-launch constraint check on the same cost function the trials report."""

import copy
import json
import re
import warnings

import pytest

from archsearch.errors import UserError
from conftest import TINY_SPACE, load_benchmark, tiny_space_file


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, cache_dir):
    """The tiny space and its prepared (real, tokenized) data."""
    from archsearch.data import prepare_for_space
    from archsearch.space import load_space

    space = load_space(tiny_space_file(tmp_path_factory.mktemp("space")))
    return space, prepare_for_space(space)


# ---------------------------------------------------------------------- RunDir and spec
def test_run_dir_refuses_an_existing_run_and_unwritable_storage(tmp_path):
    from archsearch.errors import UserError
    from archsearch.runs import RunDir

    run = RunDir.create(tmp_path / "runs", "a")
    assert run.trials_dir.is_dir() and run.name == "a"
    run.write_trial({"trial_id": "t1", "status": "RUNNING", "started": 1.0})
    with pytest.raises(UserError, match="--name"):
        RunDir.create(tmp_path / "runs", "a")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="--storage"):
        RunDir.create(blocker, "a")
    with pytest.raises(UserError, match="not a run directory"):
        RunDir.open(tmp_path / "runs" / "a")  # no run.json yet


def test_trial_records_round_trip_and_nan_becomes_null(tmp_path):
    from archsearch.runs import RunDir

    import numpy as np
    import torch

    run = RunDir(tmp_path)
    run.write_trial({"trial_id": "b", "status": "RUNNING", "started": 2.0,
                     "metrics": {"val_loss": float("nan"), "np": np.float32("nan"),
                                 "t": torch.tensor(float("inf")), "ok": np.float32(0.25)}})
    run.write_trial({"trial_id": "a", "status": "RUNNING", "started": 1.0, "metrics": {"val_loss": 0.5}})
    recs = run.read_trials()
    assert [r["trial_id"] for r in recs] == ["a", "b"]  # start order, not file order
    # NaN/inf of any number type is JSON null (``NaN`` is not JSON: jq and JavaScript refuse it)
    assert recs[1]["metrics"] == {"val_loss": None, "np": None, "t": None, "ok": 0.25}
    assert "NaN" not in run.trial_file("b").read_text() and "Infinity" not in run.trial_file("b").read_text()
    assert not list(tmp_path.rglob("*.tmp"))  # the atomic write leaves no temp file


@pytest.mark.parametrize("text,what", [
    ("[]", "a JSON list, expected an object"),
    ("null", "a JSON NoneType"),
    ('{"status": "TERMINATED"}', "trial_id: not a trial record"),
    ('{"trial_id": "x"}', "status: not a trial record"),
    ('{"trial_id": "x", "status": "DONE"}', "status: unknown status 'DONE'"),
    ('{"trial_id": "x", "status": "ERROR", "config": [1]}', "config: expected dict, got list"),
    ('{"trial_id": "x", "status": "ERROR", "started": null, "history": {}}', "history: expected list"),
    ('{"trial_id": "x", "status": "ERROR", "started": "2024"}', "started: expected int or float, got str"),
    ('{"trial_id": "a", "status": "ERROR"}', "trial_id: trial a is also recorded in a.json"),
    (b"\xff\xfe{}", "unreadable trial record (UnicodeDecodeError)"),
    ("[" * 100_000 + "]" * 100_000, "unreadable trial record (RecursionError)"),
])
def test_a_malformed_trial_record_is_one_error_naming_file_and_field(tmp_path, text, what):
    """What ``report``/``compare``/``resume`` read: anything but a trial record is a UserError
    naming the file and the field, not a KeyError/TypeError traceback."""
    from archsearch.runs import RunDir

    run = RunDir(tmp_path)
    run.write_trial({"trial_id": "a", "status": "TERMINATED", "started": 1.0, "config": {}})
    bad = run.trials_dir / "z.json"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UserError) as e:
        run.read_trials()
    assert str(e.value).startswith(f"{bad}: ") and what in str(e.value), str(e.value)
    bad.unlink()
    assert [r["trial_id"] for r in run.read_trials()] == ["a"]


@pytest.mark.parametrize("field,value,what", [
    ("started", "2024", "started: expected int or float, got str"),
    ("seed", 1.5, "seed: expected int, got float"),
    ("trials", True, "trials: expected int, got bool"),
    ("resumed", None, "resumed: expected list, got NoneType"),
    ("fixed", [1], "fixed: expected dict, got list"),
    # found by a review: each a traceback in report, compare or resume
    ("started", float("nan"), "started: expected a finite number, got nan"),
    ("started", 1e300, "started: not a time: 1e+300 (Unix seconds)"),
    ("resumed", ["yesterday"], "resumed.0: expected int or float, got str"),
    ("resumed", [-1.0], "resumed.0: not a time: -1.0"),
    ("argv", ["search", 3], "argv.1: expected str, got int"),
])
def test_a_run_spec_of_wrong_types_is_one_error_naming_the_field(tmp_path, field, value, what):
    from archsearch.runs import RunSpec

    good = {"name": "r", "searcher": "tpe", "seed": 0, "trials": 3, "cpus_per_trial": 1,
            "gpus_per_trial": 0, "started": 1.0, "address": None}
    RunSpec.from_dict(good)  # optional fields may be null or absent
    with pytest.raises(UserError, match=re.escape(f"run.json: {what}")):
        RunSpec.from_dict({**good, field: value})


@pytest.mark.parametrize("text,what", [
    (b'{"name": "caf\xe9"}', "unreadable run spec (UnicodeDecodeError)"),
    (b"[" * 100_000 + b"]" * 100_000, "unreadable run spec (RecursionError)"),
    (b'{"name": ', "corrupt run spec (line 1: Expecting value)"),
])
def test_an_unreadable_run_spec_is_one_error_naming_the_file(tmp_path, text, what):
    """Not UTF-8 or nested past Python's parser: one error naming run.json (before: a
    UnicodeDecodeError or RecursionError traceback from report, compare and resume)."""
    from archsearch.runs import RunDir

    run = RunDir(tmp_path)
    run.spec_file.write_bytes(text)
    with pytest.raises(UserError) as e:
        run.read_spec()
    assert str(e.value) == f"{run.spec_file}: {what}", str(e.value)


@pytest.mark.parametrize("name", ["a/b", "../a", ".hidden", "", "a\\b"])
def test_a_run_name_is_one_directory_name(tmp_path, name):
    from archsearch.runs import RunDir

    with pytest.raises(UserError, match="--name: .* is not a run name"):
        RunDir.create(tmp_path, name)
    assert not any(tmp_path.iterdir())


def test_a_percent_or_question_mark_in_the_run_path_keeps_its_optuna_db(tmp_path):
    """SQLAlchemy decodes ``%41`` to ``A`` and cuts the URL at ``?``: unescaped, run
    ``exp%41x`` would open ``expAx/optuna.db`` (maybe another run's)."""
    import optuna

    from archsearch.runs import RunDir

    run = RunDir.create(tmp_path, "exp%41x?q#1")
    optuna.create_study(study_name="s", storage=run.optuna_url)
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.db")] == ["exp%41x?q#1/optuna.db"]


def test_a_reports_directory_that_cannot_hold_a_report_is_refused_before_the_search(tmp_path):
    from archsearch.tune.runner import check_reports_dir

    check_reports_dir(tmp_path / "new" / "reports")
    assert not (tmp_path / "new").exists()  # nothing created
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"file: --reports: reports directory is not writable \(.*file is a file"):
        check_reports_dir(tmp_path / "file")
    with pytest.raises(UserError, match=r"file/reports: --reports: reports directory is not writable"):
        check_reports_dir(tmp_path / "file" / "reports")


def test_resume_restores_fixed_trials_and_gpus_from_the_run_spec(tiny, tmp_path):
    """Started with --fixed, --trials 5 and --gpus-per-trial 1: reopening the run for resume
    gives exactly those, whatever the YAML says (the GPU count is only recorded: nothing runs)."""
    from archsearch.tune.runner import reopen_run, start_run, trial_resources

    space, _ = tiny
    pinned = space.pinned({"d_model": 16, "n_layers": 1})
    launch = start_run(pinned, searcher="random", trials=5, gpus_per_trial=1, name="r",
                       storage=tmp_path, fixed={"d_model": 16, "n_layers": 1}, address=None)
    assert launch.space.budget.trials == 5
    launch.run.tune_state_file.parent.mkdir(parents=True)
    launch.run.tune_state_file.write_bytes(b"")  # as if Tune had started

    # its driver still holds the run: a second one is refused and changes nothing
    spec_before = launch.run.spec_file.read_text()
    with pytest.raises(UserError, match=r"in use by pid \d+ on .*driver still runs"):
        reopen_run(launch.run.path)
    assert launch.run.spec_file.read_text() == spec_before
    launch.lock.close()  # the driver died: the kernel releases its lock

    again = reopen_run(launch.run.path)
    assert trial_resources(again) == {"cpu": 1.0, "gpu": 1.0}
    assert again.spec.trials == 5 and again.space.budget.trials == 5
    assert again.spec.fixed == {"d_model": 16, "n_layers": 1}
    assert again.space.params["d_model"].choices == [16]
    assert again.space.params["n_layers"].choices == [1]
    assert again.spec.searcher == "random" and len(again.spec.resumed) == 1
    # the spec on disk says the same (a second resume reads it again)
    on_disk = json.loads(launch.run.spec_file.read_text())
    assert on_disk["gpus_per_trial"] == 1 and on_disk["trials"] == 5

    # a copy (or a move) elsewhere: the restored Tune state would write to the original
    import shutil

    again.lock.close()
    copy_dir = tmp_path / "elsewhere" / "r"
    shutil.copytree(launch.run.path, copy_dir)
    for _ in range(2):  # the refusal releases the run's lock at once: the same process can retry
        with pytest.raises(UserError, match=r"elsewhere/r: this run was created at .*/r and its Ray "
                                            r"Tune state writes there"):
            reopen_run(copy_dir)
    # the same directory through a symlink is not a move
    (tmp_path / "link").symlink_to(launch.run.path)
    reopen_run(tmp_path / "link").lock.close()


# ---------------------------------------------------------------------- one searcher path
class _TinyProblem:
    """A benchmark problem over the tiny space: constant metrics, known costs as the CLI's."""

    name = "tiny"

    def __init__(self, space, data):
        from archsearch.dynamic.known_costs import known_costs_fn

        self.space, self.cost_fn, self.ref, self.max_hv = space, known_costs_fn(data, space.fixed), [0.0, -1e12], 1.0

    def evaluate(self, config):
        return config, {"accuracy": 0.6, **self.cost_fn(config)}, False

    def objectives(self, m):
        return [m["accuracy"], -m["flops_per_sample"]]

    def feasible(self, m):
        return True


@pytest.mark.parametrize("name", ["random", "tpe", "nsga2", "qnehvi", "ahto"])
def test_benchmark_and_cli_build_the_searcher_with_the_same_call(tiny, monkeypatch, name):
    import archsearch.search as search
    from archsearch.tune.searchers import build_core

    space, data = tiny
    space = space.model_copy(update={"budget": space.budget.model_copy(update={"trials": 40})})
    calls, real_make = [], search.make

    def spy(*args, **kwargs):
        obj = real_make(*args, **kwargs)
        calls.append((args, {k: v for k, v in kwargs.items() if k != "cost_fn"},
                      type(kwargs.get("cost_fn")).__name__, obj))
        return obj

    monkeypatch.setattr(search, "make", spy)
    build_core(name, space, data, seed=3)                      # what `archsearch search` builds
    load_benchmark("searchers.searchers").run_one(_TinyProblem(space, data), name, 3, budget=1)   # what it compares
    assert len(calls) == 2
    (a_args, a_kw, a_fn, a), (b_args, b_kw, b_fn, b) = calls
    assert a_args[0] == b_args[0] == name and a_kw == b_kw and a_fn == b_fn == "function"
    assert type(a) is type(b)
    if hasattr(a, "study"):  # the Optuna baselines: the same sampler, configured alike
        sa, sb = a.study.sampler, b.study.sampler
        assert type(sa) is type(sb)
        for attr in ("_n_startup_trials", "_population_size", "_multivariate"):
            assert getattr(sa, attr, None) == getattr(sb, attr, None), attr


@pytest.mark.parametrize("name", ["tpe", "nsga2"])
def test_optuna_baselines_get_the_constraints_without_deprecation(tiny, name):
    """The space's constraint reaches the sampler through Trial.set_constraint (read by TPE
    and NSGA-II as FrozenTrial.constraints), with no FutureWarning from Optuna 5."""
    from archsearch.tune.searchers import build_core

    space, data = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        core = build_core(name, space, data, seed=0)
        tid, cfg = core.ask()
        core.tell(tid, {"accuracy": 0.7, "flops_per_sample": 1e5, "params_trainable": 5e5})
        tid2, _ = core.ask()
        core.tell(tid2, {"accuracy": 0.6, "flops_per_sample": 1e5, "params_trainable": 1e3})
    done = [t for t in core.study.trials if t.state.name == "COMPLETE"]
    assert [t.constraints for t in done] == [{"params_trainable.max": 5e5 - 4e5},
                                             {"params_trainable.max": 1e3 - 4e5}]


# ---------------------------------------------------------------------- pre-launch check
def test_prelaunch_check_uses_the_reported_cost(tmp_path, cache_dir):
    """A bound the cheapest config meets by the FLOPs its trial reports is never refused, and
    a bound it misses is. Sentences are far shorter than max_len here, so costing the config at
    max_len (the old check) would refuse the first bound."""
    from archsearch.data import prepare_for_space
    from archsearch.errors import UserError
    from archsearch.space import load_space
    from archsearch.tune.preflight import check_constraints, extreme_configs
    from archsearch.tune.runner import trial_settings
    from archsearch.tune.trainable import TrialLoop

    spec = copy.deepcopy(TINY_SPACE)
    spec["dataset"]["max_len"] = 128
    space = load_space(tiny_space_file(tmp_path, dataset=spec["dataset"]))
    data = prepare_for_space(space)
    cfg = extreme_configs(space)[0]  # the cheapest, every non-numeric choice at its first
    reported = TrialLoop(cfg, data, trial_settings(space, 1)).evaluate()["flops_per_sample"]

    def with_bound(value):
        bounds = {"flops_per_sample": space.constraints["params_trainable"].model_copy(update={"max": value})}
        return space.model_copy(update={"constraints": bounds})

    check_constraints(with_bound(reported * 1.0001), data)  # feasible by the reported metric
    with pytest.raises(UserError, match="constraints.flops_per_sample.max"):
        check_constraints(with_bound(reported * 0.99), data)


def test_command_line_budget_overrides_are_validated(tiny):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import effective_space

    space, _ = tiny
    assert effective_space(space, cpus_per_trial=0.5).budget.cpus_per_trial == 0.5
    with pytest.raises(UserError, match="--cpus-per-trial"):
        effective_space(space, cpus_per_trial=0)
    with pytest.raises(UserError, match="--gpus-per-trial"):
        effective_space(space, gpus_per_trial=-1)


def test_baseline_survives_running_out_of_feasible_draws(tiny):
    """When every resample is known-infeasible, the last draw is proposed and its trial stays
    open: telling it (even a NaN constraint metric) must not crash the search."""
    from archsearch.search.baselines import OptunaSearcher
    from archsearch.dynamic.known_costs import known_costs_fn

    space, data = tiny
    bound = space.constraints["params_trainable"].model_copy(update={"max": 1.0})
    space = space.model_copy(update={"constraints": {"params_trainable": bound}})
    s = OptunaSearcher("tpe", space, seed=0, cost_fn=known_costs_fn(data, space.fixed), max_resample=3)
    tid, cfg = s.ask()
    s.tell(tid, {"accuracy": 0.6, "flops_per_sample": 1e5, "params_trainable": float("nan")})
    last = s.study.trials[-1]
    assert len(s.study.trials) == 3 and last.state.name == "COMPLETE"
    assert last.constraints == {"params_trainable.max": float("inf")}
