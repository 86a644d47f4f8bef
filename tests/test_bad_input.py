"""Bad input beyond the space file, through the real CLI in a subprocess: bad dataset files,
bad ``init_from`` checkpoints, a closed ``--address`` port, and a search whose every trial fails.

The standard: one stderr line ``error: FILE: FIELD: message``, exit code 2, no traceback, and
nothing already recorded is lost (the pre-launch errors come before a run directory is made:
an existing run of the same ``--name`` stays byte-identical). A search in which every trial
failed exits with code 1 and one line saying so and where its run and report are.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import TINY_SPACE, free_port, run_cli, tiny_space_file

RUN_NAME = "keep"


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` (relative path -> bytes)."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def kept_run(tmp_path):
    """An existing run ``runs/keep`` (synthetic records) that a failing ``--name keep`` search
    must leave byte-identical; yields (storage dir, snapshot of the run)."""
    import yaml

    from archsearch.report.synthetic import synthetic_trials, write_run_dir

    storage = tmp_path / "runs"
    run = write_run_dir(storage / RUN_NAME, synthetic_trials(3, epochs=1),
                        space_yaml=yaml.safe_dump(TINY_SPACE), name=RUN_NAME)
    return storage, snapshot(run)


def search_fails(space: Path, kept_run, *extra, file: str, field: str, says: str) -> str:
    """Run ``archsearch search SPACE --name keep``; assert the one-line exit-2 error naming
    ``file`` and ``field`` and containing ``says``, and that the kept run is untouched and no
    other run directory appeared. Returns the error line."""
    storage, before = kept_run
    proc = run_cli("search", space, "--searcher", "random", "--name", RUN_NAME,
                   "--storage", storage, "--reports", storage.parent / "reports",
                   "--no-progress", "--no-ray-dashboard", *extra, cwd=storage.parent, timeout=180)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"error: {file}: {field}: "), line
    assert says in line, line
    assert os.listdir(storage) == [RUN_NAME]
    assert snapshot(storage / RUN_NAME) == before
    assert not (storage.parent / "reports").exists()
    return line


# ------------------------------------------------------------------------------------------
# 1. dataset files
# ------------------------------------------------------------------------------------------


def _rows(n: int, label=lambda i: i % 2) -> str:
    return "".join(f"sentence number {i},{label(i)}\n" for i in range(n))


#: name -> (file content, field, what the error says)
BAD_CSV = {
    "empty": (b"", "dataset", "file is empty"),
    "header_only": (b"text,label\n", "dataset", "header line but no rows"),
    "no_label_column": (("text,lab\n" + _rows(20)).encode(), "label_column",
                        "column 'label' not found; available columns: text, lab"),
    "one_class": (("text,label\n" + _rows(20, label=lambda i: "pos")).encode(), "label_column",
                  "only one class ('pos')"),
    "latin1": (b"text,label\n" + "caf\u00e9 au lait,1\n".encode("latin-1") + _rows(20).encode(),
               "dataset", "not UTF-8: byte 0xe9 at line 2, column 4"),
    # rule: a classification text over 100,000 characters in one row is refused, never cut
    "10mb_row": (("text,label\n" + _rows(20) + "x" * 10_000_000 + ",1\n").encode(), "text_column",
                 ("column 'text', row 21 after the header: 10,000,000 characters, over the limit "
                  "of 100,000")),
}


@pytest.mark.parametrize("case", list(BAD_CSV))
def test_bad_dataset_csv_is_one_line_before_ray(case, tmp_path, cache_dir, kept_run):
    content, field, says = BAD_CSV[case]
    csv = (tmp_path / f"{case}.csv").resolve()
    csv.write_bytes(content)
    space = tiny_space_file(tmp_path, dataset={
        "name": str(csv), "text_column": "text", "label_column": "label",
        "vocab_size": 1000, "max_len": 32})
    search_fails(space, kept_run, file=str(csv), field=field, says=says)


# ------------------------------------------------------------------------------------------
# 2. init_from checkpoints
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny random-weight checkpoints saved with ``save_pretrained`` (no network): ``bert``,
    ``gpt2`` (not BERT-style) and ``truncated`` (a BERT whose weight file is cut in half)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("checkpoints")
    gpt2 = AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=128,
                                n_positions=64, bos_token_id=0, eos_token_id=0)
    AutoModel.from_config(gpt2).save_pretrained(root / "gpt2")
    bert = AutoConfig.for_model("bert", num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                                intermediate_size=32, vocab_size=128, max_position_embeddings=64)
    AutoModel.from_config(bert).save_pretrained(root / "bert")
    shutil.copytree(root / "bert", root / "truncated")
    weights = next((root / "truncated").glob("model.safetensors"))
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    return root


def _init_space(tmp_path: Path, *, fixed=None, init_choices=None, tokenizer=None) -> Path:
    params = dict(TINY_SPACE["params"])
    if init_choices is not None:
        params["init_from"] = {"type": "categorical", "choices": init_choices}
    dataset = {**TINY_SPACE["dataset"], **({"tokenizer": tokenizer} if tokenizer else {})}
    return tiny_space_file(tmp_path, params=params, fixed=fixed or {}, dataset=dataset)


def test_init_from_missing_path(tmp_path, cache_dir, kept_run):
    missing = tmp_path / "no-such-checkpoint"
    space = _init_space(tmp_path, fixed={"init_from": str(missing)})
    search_fails(space, kept_run, file=str(space), field="fixed.init_from",
                 says=f"no checkpoint at {missing}")


def test_init_from_non_bert_checkpoint(tmp_path, cache_dir, kept_run, checkpoints):
    space = _init_space(tmp_path, fixed={"init_from": str(checkpoints / "gpt2")})
    search_fails(space, kept_run, file=str(space), field="fixed.init_from",
                 says="model_type 'gpt2' is not BERT-style")


def test_init_from_truncated_checkpoint_among_param_choices(tmp_path, cache_dir, kept_run, checkpoints):
    # every value the space can produce is checked, not only the first trial's
    space = _init_space(tmp_path, init_choices=[str(checkpoints / "bert"), str(checkpoints / "truncated")],
                        tokenizer=str(checkpoints / "bert"))
    search_fails(space, kept_run, file=str(space), field="params.init_from",
                 says=f"{checkpoints / 'truncated' / 'model.safetensors'} is truncated or corrupt")


def test_init_from_with_a_trained_tokenizer(tmp_path, cache_dir, kept_run, checkpoints):
    space = _init_space(tmp_path, fixed={"init_from": str(checkpoints / "bert")})
    search_fails(space, kept_run, file=str(space), field="dataset.tokenizer",
                 says="init_from needs the checkpoint's own tokenizer")


# ------------------------------------------------------------------------------------------
# 3. --address with nothing listening
# ------------------------------------------------------------------------------------------


def test_address_closed_port(tmp_path, cache_dir, kept_run):
    address = f"127.0.0.1:{free_port()}"
    search_fails(tiny_space_file(tmp_path), kept_run, "--address", address,
                 file=address, field="--address", says="no Ray cluster answers there")


# ------------------------------------------------------------------------------------------
# 4. every trial failed
# ------------------------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_search_where_every_trial_fails_exits_1_with_one_line(tmp_path, cache_dir):
    """lr 1e6 turns the loss NaN within a few steps: both trials fail; the run directory and
    the report are written, and the CLI says so in one line with exit code 1."""
    space = tiny_space_file(
        tmp_path,
        dataset={**TINY_SPACE["dataset"], "max_train_samples": 256},
        params={"n_layers": {"type": "int", "low": 1, "high": 1},
                "d_model": {"type": "categorical", "choices": [16]},
                "n_heads": {"type": "categorical", "choices": [2]},
                "lr": {"type": "categorical", "choices": [1.0e6]}},
        budget={**TINY_SPACE["budget"], "trials": 2, "epochs": 1, "max_failures": 0})
    runs, reports = tmp_path / "runs", tmp_path / "reports"
    proc = run_cli("search", space, "--searcher", "random", "--name", "all-fail",
                   "--storage", runs, "--reports", reports, "--no-progress",
                   "--no-ray-dashboard", cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    line = errors[0]
    assert line.startswith("error: all 2 trials failed"), line
    assert f"run: {runs / 'all-fail'}" in line and f"report: {reports / 'all-fail' / 'index.html'}" in line
    assert "Traceback" not in line
    # nothing lost: the run and its report exist and record both failures
    records = [json.loads(p.read_text()) for p in (runs / "all-fail" / "trials").glob("*.json")]
    assert len(records) == 2 and all(r["status"] == "ERROR" for r in records)
    assert (runs / "all-fail" / "run.json").is_file()
    assert (reports / "all-fail" / "index.html").is_file()
    assert json.loads((reports / "all-fail" / "pareto.json").read_text())["n_failed"] == 2


def test_a_search_stopped_before_any_trial_finished_says_resume_not_failed(tmp_path, capsys):
    """Ctrl-C before any trial finished: the one line says the trials are unfinished and how
    to continue them (exit 1: nothing succeeded), not that they all failed."""
    import typer

    from archsearch.cli import _exit_if_nothing_succeeded
    from archsearch.runs import RunDir
    from archsearch.tune.runner import RunResult

    run = RunDir.create(tmp_path / "runs", "stopped")
    run.write_trial({"trial_id": "a", "status": "RUNNING", "started": 1.0, "metrics": {}, "history": []})
    run.write_trial({"trial_id": "b", "status": "ERROR", "started": 2.0, "metrics": {}, "history": [],
                     "error": "FloatingPointError: training loss is nan"})
    res = RunResult(run.path, tmp_path / "reports", {"n_trials": 2, "n_failed": 2}, 1.0)
    with pytest.raises(typer.Exit) as e:
        _exit_if_nothing_succeeded(res)
    assert e.value.exit_code == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: no trial succeeded: 1 of 2 stopped unfinished (continue them: "
                           f"archsearch resume {run.path})"), line


@pytest.mark.parametrize("args, says", [
    (("check", "space.yaml", "--trials", "0"), "Invalid value for '--trials'"),
    (("check", "space.yaml", "--bogus"), "No such option: --bogus"),
    (("check",), "Missing argument"),
    (("nosuchcmd",), "No such command 'nosuchcmd'"),
    # data prepare's options: the limits of a space's dataset section, named as options
    (("data", "prepare", "x.csv", "--max-len", "100000000"), "error: --max-len: Input should be less than or equal to 8192"),
    (("data", "prepare", "x.csv", "--task", "foo"), "error: --task: expected classification or lm, got 'foo'"),
])
def test_command_line_usage_errors_are_one_line_exit_2(tmp_path, args, says):
    """A bad option, value, command or missing argument: one ``error:`` line and exit 2, never
    a traceback (typer's own copy of click raised past the handler that expected click's)."""
    proc = run_cli(*args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr


# ------------------------------------------------------------------------------------------
# 5. found by a review: each passed `check` or ended in a traceback
# ------------------------------------------------------------------------------------------


def test_distill_teacher_without_init_from(tmp_path, cache_dir, kept_run):
    """Checked before launch (before: every trial failed with "needs init_from")."""
    space = tiny_space_file(tmp_path, fixed={"gating": "dht", "distill_teacher": str(tmp_path / "t.pt")})
    search_fails(space, kept_run, file=str(space), field="fixed.distill_teacher",
                 says="needs init_from (the teacher's architecture): the space gives none")


@pytest.mark.slow
def test_distill_teacher_missing_or_not_a_torch_file(tmp_path, cache_dir, kept_run, checkpoints):
    bert = str(checkpoints / "bert")
    garbage = tmp_path / "teacher.pt"
    garbage.write_bytes(b"not a checkpoint")
    for teacher, says in ((tmp_path / "none.pt", f"no such file: {tmp_path / 'none.pt'}"),
                          (garbage, f"{garbage} is not a torch.save file")):
        params = {"lr": TINY_SPACE["params"]["lr"],  # the architecture is the checkpoint's
                  "distill_teacher": {"type": "categorical", "choices": ["", str(teacher)]}}
        space = tiny_space_file(tmp_path, params=params, fixed={"init_from": bert, "gating": "dht"},
                                dataset={**TINY_SPACE["dataset"], "tokenizer": bert})
        search_fails(space, kept_run, file=str(space), field="params.distill_teacher", says=says)


def test_a_distill_teacher_in_either_torch_save_format_passes(tmp_path, checkpoints):
    """The zip format and the legacy pickle stream (``_use_new_zipfile_serialization=False``,
    which ``torch.load(weights_only=True)`` reads) both pass the pre-launch check."""
    import torch

    from archsearch.space import load_space
    from archsearch.tune.preflight import check_distill_teacher

    bert = str(checkpoints / "bert")
    for i, zipped in enumerate((True, False)):
        teacher = tmp_path / f"teacher{i}.pt"
        torch.save({"w": torch.zeros(2)}, teacher, _use_new_zipfile_serialization=zipped)
        space = load_space(tiny_space_file(tmp_path, params={"lr": TINY_SPACE["params"]["lr"]},
                                           fixed={"init_from": bert, "gating": "dht",
                                                  "distill_teacher": str(teacher)}))
        check_distill_teacher(space)


def test_a_relative_distill_teacher_is_made_absolute(tmp_path, monkeypatch):
    """Trials run in their own directories: a relative teacher path means "from where the
    command ran", as a relative init_from does."""
    from archsearch.space import load_space
    from archsearch.tune.preflight import absolute_local_paths

    (tmp_path / "teacher.pt").write_bytes(b"")
    space = load_space(tiny_space_file(tmp_path, fixed={"gating": "dht", "distill_teacher": "teacher.pt",
                                                         "init_from": "no-such-dir"}))
    monkeypatch.chdir(tmp_path)
    fixed = absolute_local_paths(space).fixed
    assert fixed["distill_teacher"] == str(tmp_path / "teacher.pt")
    assert fixed["init_from"] == "no-such-dir"  # not a local path: a Hub id, left alone


def _one_line(proc, code: int = 2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.slow
def test_dashboard_port_in_use_or_a_database_that_is_not_optuna(tmp_path, kept_run):
    """One line, exit 2 (before: a 58-line OSError traceback, or 118 lines from SQLAlchemy)."""
    import socket

    storage, before = kept_run
    run = storage / RUN_NAME
    (run / "optuna.db").write_bytes(b"")  # an empty file: not a database of studies
    line = _one_line(run_cli("dashboard", run, "--port", str(free_port()), cwd=tmp_path, timeout=60))
    assert line == f"error: {run / 'optuna.db'}: not an Optuna study database (no such table: studies)"
    (run / "optuna.db").write_bytes(b"garbage" * 100)
    line = _one_line(run_cli("dashboard", run, "--port", str(free_port()), cwd=tmp_path, timeout=60))
    assert line.endswith("not an Optuna study database (file is not a database)"), line
    assert (run / "optuna.db").read_bytes() == b"garbage" * 100  # read only

    import optuna

    (run / "optuna.db").unlink()
    optuna.create_study(storage=f"sqlite:///{run / 'optuna.db'}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_line(run_cli("dashboard", run, "--port", str(port), cwd=tmp_path, timeout=60))
    assert line == f"error: --port: cannot serve on 127.0.0.1:{port}: Address already in use", line
    odd = tmp_path / "a%41b#c?d"  # a valid database under a path with URI characters: not refused
    odd.mkdir()
    (odd / "optuna.db").write_bytes((run / "optuna.db").read_bytes())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_line(run_cli("dashboard", odd, "--port", str(port), cwd=tmp_path, timeout=60))
    assert line.endswith("Address already in use"), line
    line = _one_line(run_cli("dashboard", run, "--port", "99999", cwd=tmp_path, timeout=60))
    assert line == "error: --port: 99999 is not a port (0 .. 65535)", line


def test_compare_of_runs_without_one_successful_trial_exits_1(tmp_path):
    """As report: the comparison is written, and the exit code says there was nothing to
    compare (before: exit 0)."""
    import yaml

    from archsearch.report.synthetic import synthetic_trials, write_run_dir

    runs = []
    for name in ("a", "b"):
        trials = [{**t, "status": "ERROR", "error": "boom"} for t in synthetic_trials(3, epochs=1)]
        runs.append(write_run_dir(tmp_path / "runs" / name, trials, space_yaml=yaml.safe_dump(TINY_SPACE),
                                  name=name))
    proc = run_cli("compare", *runs, "--reports", tmp_path / "reports", cwd=tmp_path, timeout=120)
    assert _one_line(proc, 1) == "error: no run has a successful trial: nothing to compare"
    assert "a: 3 trials, 3 failed" in proc.stdout and (tmp_path / "reports").is_dir()


@pytest.mark.parametrize("address, says", [
    ("http://[::1", "expected http://HOST:PORT"),
    ("http://head:99999", "expected http://HOST:PORT"),
])
def test_submit_address_that_is_no_url(address, says):
    from archsearch.errors import UserError
    from archsearch.tune.submit import dashboard_url

    with pytest.raises(UserError, match=re.escape(f"{address}: --address: {says}")):
        dashboard_url(address)


def test_search_address_with_a_port_out_of_range():
    from archsearch.errors import UserError
    from archsearch.tune.ray_session import check_address

    with pytest.raises(UserError, match="expected auto, HOST:PORT or ray://HOST:PORT"):
        check_address("localhost:99999")  # before: OverflowError from socket


def test_data_prepare_names_the_option_not_the_space_field(tmp_path):
    """``data prepare`` has options, not a space file: a missing column is ``--label-column``
    (before: ``label_column``, the space's field name)."""
    (tmp_path / "x.csv").write_text("text,label\n" + _rows(20))
    line = _one_line(run_cli("data", "prepare", "x.csv", "--label-column", "nope", cwd=tmp_path, timeout=120))
    assert line == "error: x.csv: --label-column: column 'nope' not found; available columns: text, label", line


# ------------------------------------------------------------------------------------------
# --history (issue 65): a searcher that takes none, a run with nothing to learn from
# ------------------------------------------------------------------------------------------


def test_history_with_a_searcher_that_takes_none_is_refused_before_launch(tmp_path, kept_run):
    storage, _ = kept_run
    proc = run_cli("search", tiny_space_file(tmp_path), "--searcher", "random", "--name", "other",
                   "--storage", storage, "--history", storage / RUN_NAME, "--no-progress",
                   "--no-ray-dashboard", cwd=tmp_path, timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: --history: --history needs a searcher that learns across "
                                   "searches (gp, ahto or qnehvi), not 'random'")
    assert os.listdir(storage) == [RUN_NAME]


def test_history_run_with_no_finished_trial_is_refused_naming_it(tmp_path, kept_run):
    import yaml

    from archsearch.report.synthetic import synthetic_trials, write_run_dir

    storage, _ = kept_run
    failed = [{**t, "status": "ERROR", "error": "boom"} for t in synthetic_trials(2, epochs=1)]
    bad = write_run_dir(tmp_path / "old" / "failed", failed, space_yaml=yaml.safe_dump(TINY_SPACE), name="failed")
    proc = run_cli("search", tiny_space_file(tmp_path), "--searcher", "ahto", "--name", "other",
                   "--storage", storage, "--history", bad, "--no-progress", "--no-ray-dashboard",
                   cwd=tmp_path, timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {bad}: --history: no finished trial to learn from"
    assert os.listdir(storage) == [RUN_NAME]
    # and a run that has finished trials gives the searcher its rows
    from archsearch.tune.searchers import history_rows

    rows = history_rows([storage / RUN_NAME])
    assert len(rows) == 1 and rows[0] and all(set(r) == {"config", "metrics"} for r in rows[0])
