"""Property-based fuzzing of the pre-launch path (issue 40), and the defects it found.

The strategies and the harness are ``benchmarks/product/fuzz.py``'s (loaded as a module): mutated
search spaces, ``--fixed`` values and data files (CSV/TSV/JSONL/JSON/Parquet/text with wrong
columns, encodings, empty fields, huge rows, mixed label types), each run through
``archsearch check`` in-process. The property: exit code 0, or exactly one stderr line
``error: ...`` with exit code 2; no traceback; under 30 s; nothing written outside the run
directory (``check`` makes none: the case's directory is unchanged, the checkout and the user's
cache gain nothing). ``archsearch check`` never starts Ray (the marker rules of conftest would
fail these unmarked tests if it did).

Tiers: the quick tests run the ``quick`` Hypothesis profile (tests/conftest.py: the tiny space
only, ~100 cases, the same every run); the ``slow`` ones the ``long`` profile over every shipped
space (>= 2,000 cases, new ones each run). A few cases also go through the real CLI in a
subprocess (a crash of the interpreter can only be seen from outside).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings

from conftest import ROOT, TINY_SPACE, load_benchmark, run_cli, tiny_space_file

fuzz = load_benchmark("product.fuzz")


def scaled(parent: settings, factor: float) -> settings:
    """``parent`` (a Hypothesis profile) with ``factor`` times its examples."""
    return settings(parent, max_examples=max(1, int(parent.max_examples * factor)))


def _cache_listing() -> dict:
    home = Path.home() / ".cache" / "archsearch"
    return {str(p): p.stat().st_mtime_ns for p in home.rglob("*")} if home.is_dir() else {}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, cache_dir):
    """The fuzz sandbox (the session's data cache, the Hub offline), and afterwards: the
    checkout and ``~/.cache/archsearch`` gained nothing."""
    d = tmp_path_factory.mktemp("fuzz")
    checkout, home_cache = fuzz.checkout_entries(), _cache_listing()
    with fuzz.sandbox_env(d, cache=cache_dir):
        yield d
    assert fuzz.checkout_entries() - checkout == set(), "a fuzz case wrote into the checkout"
    assert _cache_listing() == home_cache, "a fuzz case wrote into ~/.cache/archsearch"


def holds(outcome) -> None:
    assert not outcome.broken, (f"{outcome.verdict} ({outcome.code}, {outcome.seconds:.1f} s): "
                                f"{outcome.what}\nstderr: {outcome.stderr}\n{outcome.detail}")


# ------------------------------------------------------------------------------------------
# quick tier
# ------------------------------------------------------------------------------------------

SPECIAL_VALUES_AT_IMPORT = repr(fuzz.SPECIAL_VALUES)


@settings(max_examples=300)
@given(value=fuzz.values)
def test_drawn_values_are_fresh_objects(value):
    """A mutation puts a drawn value into a space and may add keys into it later: it must be a
    fresh object, not ``SPECIAL_VALUES``' own ``{}`` or ``[]`` (shared, it grew across examples
    into a space that contained itself: ``_paths`` recursed without end, and Hypothesis's replay
    of the failing case differed: a flaky failure)."""
    if isinstance(value, (dict, list)):
        value.clear()
    assert repr(fuzz.SPECIAL_VALUES) == SPECIAL_VALUES_AT_IMPORT


@scaled(settings(), 1.5)
@given(case=fuzz.space_cases(fuzz.base_spaces(shipped=False)))
def test_mutated_spaces(case, scratch):
    holds(fuzz.run_case(case, scratch))


@scaled(settings(), 0.5)
@given(case=fuzz.fixed_cases())
def test_fixed_json(case, scratch):
    holds(fuzz.run_case(case, scratch))


@scaled(settings(), 1.0)
@given(case=fuzz.data_cases())
def test_data_files(case, scratch):
    holds(fuzz.run_case(case, scratch))


# ------------------------------------------------------------------------------------------
# slow tier: the long profile, every shipped space
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped(scratch):
    """Every shipped space, its data prepared once (not a case)."""
    bases = fuzz.base_spaces()
    for name, spec in bases.items():
        warm = fuzz.Case("warm", name, {"space.yaml": fuzz._dump(spec).encode()}, ["check", "{dir}/space.yaml"])
        out = fuzz.run_case(warm, scratch, timeout_s=1800)
        assert out.verdict == "ok", (name, out.stderr)
    return bases


@pytest.mark.slow
@scaled(settings.get_profile("long"), 1.2)
@given(case=fuzz.space_cases(fuzz.base_spaces()))
def test_mutated_spaces_long(case, shipped, scratch):
    holds(fuzz.run_case(case, scratch))


@pytest.mark.slow
@scaled(settings.get_profile("long"), 0.3)
@given(case=fuzz.fixed_cases())
def test_fixed_json_long(case, scratch):
    holds(fuzz.run_case(case, scratch))


@pytest.mark.slow
@scaled(settings.get_profile("long"), 0.6)
@given(case=fuzz.data_cases())
def test_data_files_long(case, scratch):
    holds(fuzz.run_case(case, scratch))


# ------------------------------------------------------------------------------------------
# the harness sees what it must
# ------------------------------------------------------------------------------------------


def test_harness_catches_a_traceback_a_second_line_and_a_write(scratch, monkeypatch):
    from archsearch import cli

    def boom(*a, **k):
        raise KeyError("boom")

    case = fuzz.Case("space", "tiny", {"space.yaml": fuzz._dump(fuzz.TINY).encode()},
                     ["check", "{dir}/space.yaml"])
    assert fuzz.run_case(case, scratch).verdict == "ok"
    monkeypatch.setattr("archsearch.tune.preflight.check_search", boom)
    assert fuzz.run_case(case, scratch).verdict == "traceback"
    monkeypatch.undo()

    def two_lines(*a, **k):
        print("error: one", file=__import__("sys").stderr)
        os.write(2, b"something else, written by C code\n")
        raise SystemExit(2)

    monkeypatch.setattr(cli, "app", two_lines)
    assert fuzz.run_case(case, scratch).verdict == "lines"
    monkeypatch.undo()

    def writes(*a, **k):
        Path("stray.txt").write_text("x")  # in the case's working directory
        return 0

    monkeypatch.setattr(cli, "app", writes)
    assert fuzz.run_case(case, scratch).verdict == "wrote"


# ------------------------------------------------------------------------------------------
# defects the fuzzer found (each at its cause), and the real CLI in a subprocess
# ------------------------------------------------------------------------------------------


def _one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_jsonl_starting_with_null_is_one_line_not_a_crash(tmp_path, cache_dir):
    """pyarrow's JSON reader (under ``datasets``) killed the interpreter with SIGSEGV on a JSON
    Lines file whose first value is ``null``: exit code -11, nothing printed. Every line must
    now be an object (a ``.json`` file must start with an object or an array), checked before
    the file reaches pyarrow. A subprocess: a crash cannot be caught in-process."""
    data = tmp_path / "data.jsonl"
    data.write_text('null\n{"text": "a b", "label": 1}\n')
    space = tiny_space_file(tmp_path, dataset={"name": str(data), "vocab_size": 300, "max_len": 16})
    line = _one_line(run_cli("check", space, cwd=tmp_path, timeout=120))
    assert line.startswith(f"error: {data}: dataset: line 1 is not a JSON object: it starts with 'null'")
    doc = tmp_path / "data.json"
    doc.write_text(' \nnull')
    space = tiny_space_file(tmp_path, "doc.yaml", dataset={"name": str(doc), "vocab_size": 300, "max_len": 16})
    line = _one_line(run_cli("search", space, "--no-progress", "--storage", tmp_path / "runs",
                             cwd=tmp_path, timeout=120))
    assert line.startswith(f"error: {doc}: dataset: line 2 is not a JSON object or array")
    assert not (tmp_path / "runs").exists()


def test_a_column_both_text_and_label_is_one_line(tmp_path, cache_dir):
    """A file whose only string column is the label made ``text`` and ``label`` the same
    column: ``KeyError: Field "label" exists 2 times in schema``, a traceback."""
    from archsearch.data import load
    from archsearch.errors import UserError

    data = tmp_path / "data.csv"
    data.write_text("label\n" + "pos\nneg\n" * 10)
    with pytest.raises(UserError) as e:
        load(str(data), task="classification")
    assert e.value.field == "text_column"
    assert "column 'label' would be both the text and the label" in e.value.message


def test_an_empty_parquet_file_says_so(tmp_path):
    """An empty Parquet file read as ``ArrowInvalid: BatchSize must be greater than 0, got 0``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from archsearch.data import load
    from archsearch.errors import UserError

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "label": pa.array([], pa.int64())}), path)
    with pytest.raises(UserError) as e:
        load(str(path))
    assert e.value.one_line() == f"{path}: dataset: the file holds no rows"


@pytest.mark.parametrize("change, says", [
    # pydantic's union internals leaked into the field and the message named the wrong kind:
    # "params.lr.function-after[_check(), IntParam].low: Input should be 'int'"
    (lambda d: d["params"]["lr"].update(low="x"),
     "params.lr.low: Input should be a valid number, unable to parse string as a number"),
    (lambda d: d["params"]["n_layers"].update(low=5, high=3), "params.n_layers: low (5) > high (3)"),
    (lambda d: d["params"]["n_layers"].update(metric=1), "params.n_layers.metric: unknown key"),
    # "fixed.dropout.int: Input should be a valid integer" for a list
    (lambda d: d.update(fixed={"dropout": [0.1]}),
     "fixed.dropout: expected a number, a string or a boolean, got a list"),
    (lambda d: d["params"]["d_model"].update(choices=[16, {"a": 1}]),
     "params.d_model.choices.1: expected a number, a string or a boolean, got a mapping"),
    (lambda d: d["params"]["n_layers"].update(when={"d_model": [[16]]}),
     "params.n_layers.when.d_model: expected one of that param's choices or a list of them, got a list"),
])
def test_space_errors_name_the_field_as_written(tmp_path, change, says):
    import copy

    from archsearch.errors import UserError
    from archsearch.space import parse_space

    spec = copy.deepcopy(TINY_SPACE)
    change(spec)
    with pytest.raises(UserError) as e:
        parse_space(spec, "space.yaml")
    assert e.value.one_line() == f"space.yaml: {says}"


@pytest.mark.parametrize("content, says", [
    # "malformed YAML: malformed YAML": a control character has no problem mark
    (b"name: x\nseed: \x00\n", "line 2, column 7: malformed YAML: special characters are not allowed (character #x0000)"),
    # "cannot read: UnicodeDecodeError"
    (b"name: caf\xe9\n", "not UTF-8: byte 0xe9 at line 1, column 10; save the file as UTF-8"),
])
def test_unreadable_space_file_says_where(tmp_path, content, says):
    from archsearch.errors import UserError
    from archsearch.space import load_space

    path = tmp_path / "space.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError) as e:
        load_space(path)
    assert e.value.one_line() == f"{path}: {says}"


def test_an_absurd_architecture_is_refused_before_it_is_costed(tmp_path):
    """``n_layers`` scaled by 1e9 (1e9 .. 3e9) passed validation, and the constraint check then
    built the smallest model, layer by layer on the ``meta`` device: a hang (over 30 s, and
    without a constraint every trial would have crashed). Sizes are bounded before anything is
    built (``ARCH_LIMITS``)."""
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_launch

    from conftest import tiny_space

    space = tiny_space(tmp_path, params={**TINY_SPACE["params"],
                                         "n_layers": {"type": "int", "low": 10**9, "high": 3 * 10**9}})
    t0 = time.time()
    with pytest.raises(UserError) as e:
        check_launch(space, searcher="tpe", address=None)
    assert time.time() - t0 < 5
    assert e.value.one_line() == (f"{space.source}: params.n_layers.low: n_layers 1e+09 is over "
                                  "the limit of 1,024: a typo?")
    wide = tiny_space(tmp_path, fixed={"d_ffn_mult": 1e9})
    with pytest.raises(UserError) as e:
        check_launch(wide, searcher="tpe", address=None)
    assert e.value.field == "fixed.d_ffn_mult"


def test_dataset_argument_mistakes_name_the_space_file(tmp_path, cache_dir):
    """``error: vocab_size: vocab_size must be ...`` named neither the file nor the space's
    field (``prepare``'s own argument name leaked)."""
    from archsearch.data import prepare_for_space
    from archsearch.errors import UserError

    from conftest import tiny_space

    space = tiny_space(tmp_path, dataset={**TINY_SPACE["dataset"], "tokenizer": "bpe", "vocab_size": 64})
    with pytest.raises(UserError) as e:
        prepare_for_space(space)
    assert e.value.one_line() == (f"{space.source}: dataset.vocab_size: vocab_size must be an "
                                  "integer >= 260 for the bpe tokenizer, got 64")


def test_check_and_search_subprocess_agree(tmp_path, cache_dir):
    """The real CLI: ``check`` on a good space exits 0 with one stdout line and writes nothing;
    ``search`` refuses a fuzzer-style mistake with the same line ``check`` gives, before Ray."""
    good = tiny_space_file(tmp_path, "good.yaml")
    t0 = time.time()
    ok = run_cli("check", good, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0 and ok.stderr == "" and len(ok.stdout.splitlines()) == 1, ok.stderr
    assert time.time() - t0 < 30
    bad = tiny_space_file(tmp_path, "bad.yaml", params={**TINY_SPACE["params"],
                                                       "lr": {"type": "float", "low": "x", "high": 1}})
    by_check = _one_line(run_cli("check", bad, cwd=tmp_path, timeout=120))
    by_search = _one_line(run_cli("search", bad, "--storage", tmp_path / "runs", "--no-progress",
                                  cwd=tmp_path, timeout=120))
    assert by_check == by_search == (f"error: {bad}: params.lr.low: Input should be a valid number, "
                                     "unable to parse string as a number")
    assert sorted(os.listdir(tmp_path)) == ["bad.yaml", "good.yaml"]


def test_benchmark_result_meets_the_targets():
    """``benchmarks/product/results/fuzz.json`` (written by ``benchmarks/product/fuzz.py`` only)
    holds the summary keys exactly and meets the issue's targets, evaluated in the result too."""
    path = ROOT / "benchmarks" / "product" / "results" / "fuzz.json"
    if not path.is_file():
        pytest.skip("benchmarks/product/fuzz.py has not been run")
    result = json.loads(path.read_text())
    s = result["summary"]
    assert set(s) == {"spaces_tried", "data_files_tried", "tracebacks", "hangs",
                      "impossible_resources_exit_s"}
    assert s["spaces_tried"] >= 2000 and s["data_files_tried"] >= 500
    assert s["tracebacks"] == 0 and s["hangs"] == 0
    assert s["impossible_resources_exit_s"] <= 10
    assert set(result["targets"]) == set(fuzz.TARGETS) and all(t["met"] for t in result["targets"].values())
    prov = result["provenance"]
    assert prov["git_commit"] and prov["command"] and prov["machine"] and prov["wall_s"]
    assert prov["seeds"] is not None
