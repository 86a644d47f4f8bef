"""No number typed by hand: every measured value in the prose of README.md and docs/*.md is a
placeholder that benchmarks/summarize.py fills from the result files, and a number written next
to a result key must be that key's value (standard library only, fast)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
summarize = load_benchmark("summarize")
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def _results():
    return dict(summarize.load_results())


def test_check_passes_on_the_repository():
    """README.md and docs/*.md are what the generator writes: every placeholder renders to its
    result's value, none is unknown, and the scan finds no hand-typed number beside a key."""
    generated, problems = summarize.pages(ROOT)
    assert not problems, "\n".join(problems)
    stale = [p.relative_to(ROOT).as_posix() for p, (cur, new) in generated.items() if cur != new]
    assert not stale, f"run `python benchmarks/summarize.py`: {stale} differ"


@pytest.mark.parametrize("page", PAGES)
def test_every_placeholder_renders_to_its_json_value(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    results = _results()
    for m in summarize.PLACED.finditer(text):
        path, _, spec = m[1].partition(":")
        assert m[2] == summarize.show(summarize.value_of(path, results), spec), f"{page}: {m[0]}"
    assert not [m[0] for m in summarize.BARE.finditer(summarize.PLACED.sub("", text))
                if any(a <= m.start() < b for a, b in summarize._prose_spans(summarize.PLACED.sub("", text)))], \
        f"{page}: a placeholder is not rendered yet"


@pytest.mark.parametrize("page", PAGES)
def test_no_hand_typed_number_next_to_a_result_key(page):
    keys = summarize.result_keys(_results())
    assert "dht_gain_over_static_pts_at_0.5" in keys and "rt.dht_gain_over_static_pts_at_0.5_ci" in keys
    problems = summarize.scan((ROOT / page).read_text(encoding="utf-8"), keys, page)
    assert not problems, "\n".join(problems)


def test_the_placeholders_carry_the_fixed_numbers():
    """The stale prose of issue 61 follows its result now (e.g. the rt gain's interval)."""
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    ci = json.loads((summarize.result_paths()["dht"]).read_text())["summary"]["rt"]["dht_gain_over_static_pts_at_0.5_ci"]
    assert f"<!--{{{{dht.rt.dht_gain_over_static_pts_at_0.5_ci:.2f}}}}-->[{ci[0]:.2f}, {ci[1]:.2f}]<!--/-->" in usage
    assert "0.8 to\n2.8" not in usage and "(0.05 to 1.0: a gain)" not in usage


def _repo(tmp_path, page_text):
    (tmp_path / "benchmarks" / "depth" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "depth" / "results" / "dht.json").write_text(json.dumps({"summary": {"rt": {
        "dht_gain_over_static_pts_at_0.5": 1.7775, "dht_gain_over_static_pts_at_0.5_ci": [0.574, 2.9735]}}}))
    (tmp_path / "README.md").write_text(f"# x\n\n{page_text}\n\n{summarize.BEGIN}\n{summarize.END}\n")
    return tmp_path


def test_a_wrong_number_next_to_a_key_fails(tmp_path, capsys):
    root = _repo(tmp_path, "DHT gains `dht_gain_over_static_pts_at_0.5` 2.5 points at 0.5x.")
    generated, problems = summarize.pages(root)
    assert len(problems) == 1 and "`dht_gain_over_static_pts_at_0.5` is followed by 2.5" in problems[0]
    summarize.main(["--root", str(root)])
    assert summarize.main(["--check", "--root", str(root)]) == 1
    assert "followed by 2.5" in capsys.readouterr().err
    # the right number, to the digits typed, passes; so does the interval's, and a placeholder
    for i, ok in enumerate(("`dht_gain_over_static_pts_at_0.5` 1.8 points", "`rt.dht_gain_over_static_pts_at_0.5_ci`: 0.57 to 2.97",
               "`dht_gain_over_static_pts_at_0.5` {{dht.rt.dht_gain_over_static_pts_at_0.5}} points")):
        _, problems = summarize.pages(_repo(tmp_path / f"ok{i}", ok))
        assert not problems, (ok, problems)


def test_placeholders_render_and_a_stale_or_unknown_one_fails(tmp_path, capsys):
    root = _repo(tmp_path, "Interval {{dht.rt.dht_gain_over_static_pts_at_0.5_ci:.2f}}, gain "
                           "{{dht.rt.dht_gain_over_static_pts_at_0.5}}; `{{not.rendered}}` in code.")
    assert summarize.main(["--check", "--root", str(root)]) == 1  # not rendered yet
    assert summarize.main(["--root", str(root)]) == 0
    text = (root / "README.md").read_text()
    assert ("Interval <!--{{dht.rt.dht_gain_over_static_pts_at_0.5_ci:.2f}}-->[0.57, 2.97]<!--/-->, gain "
            "<!--{{dht.rt.dht_gain_over_static_pts_at_0.5}}-->1.778<!--/-->; `{{not.rendered}}` in code.") in text
    assert summarize.main(["--check", "--root", str(root)]) == 0
    (root / "README.md").write_text(text.replace("[0.57, 2.97]", "[0.8, 2.8]"))  # a stale number
    assert summarize.main(["--check", "--root", str(root)]) == 1
    assert "-Interval <!--{{dht.rt.dht_gain_over_static_pts_at_0.5_ci:.2f}}-->[0.8, 2.8]" in capsys.readouterr().out
    (root / "README.md").write_text(text.replace("at_0.5}}", "at_0.7}}"))  # an unknown key
    assert summarize.main(["--check", "--root", str(root)]) == 1
    assert "dht.json has no 'rt.dht_gain_over_static_pts_at_0.7'" in capsys.readouterr().err


@pytest.mark.parametrize("how", [["benchmarks/summarize.py", "--check"], ["-m", "benchmarks.summarize", "--check"]])
def test_runs_as_a_script_and_as_a_module(how):
    if how[0] == "-m" and not (ROOT / "benchmarks" / "__init__.py").is_file():
        pytest.skip("benchmarks/ is not a package yet")
    done = subprocess.run([sys.executable, *how], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
