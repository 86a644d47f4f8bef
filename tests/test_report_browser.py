"""The report in a real browser: headless Chromium opens ``index.html`` of a REAL tiny search.

A real run (Ray Tune, real Rotten Tomatoes sentences, real training; every trial uses the
length_drop gating, so each brings a real anytime curve) is searched once for this module.
Chromium (Debian packages ``chromium`` and ``chromium-driver``, driven by selenium) then opens
the run's report, the comparison page and a page with hostile strings, and we check what a
user would see: no console errors, every plot drawn, nothing fetched from the network, no
script injected, and a screenshot that is not blank.

Set-up: ``.ci/run`` installs the two Debian packages. Tests never install anything: without
``chromium`` and ``chromedriver`` (or selenium) the module is skipped, saying what is missing,
before the search is run.
"""

from __future__ import annotations

import json
import importlib.util
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_SPACE, tiny_space

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: Flags that work on these machines (no sandbox as root, no GPU, no background traffic).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000"]
XSS = "</script><script>alert(1)</script>"
IMG_XSS = "<img src=x onerror=alert(2)>"



def _missing() -> str | None:
    """What this machine lacks to drive Chromium, or ``None``."""
    missing = [f"{what} ({path})" for what, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
               if not Path(path).is_file()]
    if importlib.util.find_spec("selenium") is None:
        missing.append("the selenium package (pip install -e '.[test]')")
    if not missing:
        return None
    return ("not installed: " + ", ".join(missing)
            + "; `apt-get install chromium chromium-driver` provides the browser (.ci/run does)")


MISSING = _missing()

pytestmark = [pytest.mark.ray, pytest.mark.slow,
              pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (selenium + chromedriver), fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="archsearch-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, ray_session, cache_dir):
    """A real tiny search (conftest's TINY_SPACE: 3 trials x 2 epochs on 1,024 real
    sentences) with the length_drop gating, whose (small) evolutionary search reports an
    anytime curve for every trial. The gating is fixed, not searched: a searched one left
    the anytime-curve check to chance (no length_drop trial among 3 one time in 8)."""
    from archsearch.tune.runner import run_search

    tmp = tmp_path_factory.mktemp("browser-run")
    fixed = {"gating": "length_drop", "evolution_iterations": 1, "evolution_mutations": 3,
             "evolution_crossovers": 3, "evolution_val_samples": 128, "length_drop_p": 0.3}
    space = tiny_space(tmp, fixed=fixed)
    return run_search(space, searcher="random", name="browser-run", storage=tmp / "runs",
                      reports=tmp / "reports", progress=False)


def _open(driver, path: Path) -> list[dict]:
    """Load a local page, wait until its plots are drawn; return its console messages."""
    driver.get_log("browser")  # drop messages of earlier pages
    driver.get(path.resolve().as_uri())
    n_plots = driver.execute_script("return document.querySelectorAll('div.plot').length")
    deadline = time.time() + 60
    while time.time() < deadline:
        drawn = driver.execute_script(
            "return document.querySelectorAll('div.plot.js-plotly-plot .main-svg').length > 0 &&"
            " Array.from(document.querySelectorAll('div.plot')).every("
            "  d => d.classList.contains('js-plotly-plot') && d.querySelector('.main-svg'))")
        if drawn:
            break
        time.sleep(0.25)
    assert n_plots >= 1, "the page has no plot"
    assert drawn, "not every plot was drawn within 60 s"
    return driver.get_log("browser")


def _errors(logs: list[dict]) -> list[str]:
    return [e["message"] for e in logs if e.get("level") == "SEVERE"]


def _check_no_alert(driver) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        return
    pytest.fail(f"a script injected into the page ran: alert({text!r})")


def _assert_not_blank(png: Path) -> None:
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[0] >= 600 and img.shape[1] >= 1000, img.shape
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 100, f"only {len(colours)} distinct colours: blank page?"
    non_white = float(np.mean(np.any(img < 235, axis=2)))
    assert non_white > 0.03, f"only {non_white:.1%} of the pixels are not white"


def test_real_run_report_in_chromium(browser, real_run):
    """The real run's page: no console errors, all plots drawn, nothing fetched, the Pareto
    table and the anytime curve present, and a screenshot that is not blank."""
    page = real_run.report_dir / "index.html"
    logs = _open(browser, page)
    assert not _errors(logs), _errors(logs)
    _check_no_alert(browser)
    # offline: no resource requested from anywhere (the PNGs are data: URIs)
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(n => !n.startsWith('data:'))")
    assert fetched == [], fetched
    n_plotly = browser.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    assert n_plotly >= 3  # Pareto scatter, hypervolume, learning curves
    text = browser.execute_script("return document.body.innerText")
    summary = json.loads((real_run.report_dir / "pareto.json").read_text())
    for p in summary["pareto"]:
        assert p["trial_id"] in text
    assert "archsearch search" in text and "--fixed" in text
    # every (length_drop) trial's anytime curve is drawn as a line in the Pareto scatter
    from archsearch.runs import read_trials

    trials = read_trials(real_run.run_dir)
    assert len(trials) == 3 and all(t["metrics"].get("anytime_curve") for t in trials), trials
    names = browser.execute_script(
        "return document.getElementById('fig-pareto').data.map(t => t.name)")
    assert any(n and n.startswith("anytime curve") for n in names), names
    shot = real_run.report_dir / "screenshot.png"
    assert browser.save_screenshot(str(shot))
    _assert_not_blank(shot)
    print(f"\nscreenshot of the real run's report: {shot}")


def test_hostile_strings_stay_text_in_chromium(browser, real_run, tmp_path):
    """Run name, config values, trial ids and errors holding ``</script>`` / ``<img onerror>``
    render as text (page and plotly hover label) and never run."""
    from archsearch.report import write_report
    from archsearch.runs import read_trials

    trials = read_trials(real_run.run_dir)
    trials[0]["config"]["lr"] = XSS
    trials[0]["trial_id"] = "t" + IMG_XSS
    trials[-1].update(status="ERROR", error="RuntimeError: " + XSS + IMG_XSS)
    write_report(trials, TINY_SPACE["objectives"], tmp_path,
                 constraints=TINY_SPACE["constraints"],
                 run_info={"name": "run " + XSS, "searcher": IMG_XSS})
    logs = _open(browser, tmp_path / "index.html")
    _check_no_alert(browser)
    assert not _errors(logs), _errors(logs)
    text = browser.execute_script("return document.body.innerText")
    assert XSS in text and IMG_XSS in text  # shown literally
    assert browser.execute_script("return document.querySelectorAll('img[src=x]').length") == 0
    # hover the first trial point: plotly shows the escaped strings as plain text
    hover = browser.execute_script("""
        const gd = document.getElementById('fig-pareto');
        const k = gd.data.findIndex(t => t.hovertext && t.hovertext.length &&
                                          t.hovertext.some(h => h && h.includes('alert(1)')));
        if (k < 0) return null;
        const i = gd.data[k].hovertext.findIndex(h => h && h.includes('alert(1)'));
        Plotly.Fx.hover(gd, [{curveNumber: k, pointNumber: i}]);
        const el = gd.querySelector('.hoverlayer .hovertext');
        return el ? el.textContent : '';""")
    # the hostile trial succeeded, so it is drawn (infeasible or not) with its hover text
    assert hover is not None, "no point's hover text holds the hostile config value"
    assert "alert(1)" in hover and "</script>" in hover
    _check_no_alert(browser)
    assert not _errors(browser.get_log("browser"))


def test_compare_page_in_chromium(browser, real_run, tmp_path):
    """``archsearch compare`` of the real run and a recorded run of the same space."""
    from archsearch.report.compare import compare_runs
    from archsearch.report.synthetic import synthetic_trials, write_run_dir

    other = write_run_dir(tmp_path / "runs" / "other", synthetic_trials(30, seed=4),
                          space_yaml=(real_run.run_dir / "space.yaml").read_text(),
                          name="other", wall_seconds=90.0)
    out, summary = compare_runs([real_run.run_dir, other], out=tmp_path / "cmp")
    assert [r["name"] for r in summary["runs"]] == ["browser-run", "other"]
    logs = _open(browser, out / "index.html")
    assert not _errors(logs), _errors(logs)
    traces = browser.execute_script(
        "return document.getElementById('fig-hypervolume').data.length")
    assert traces == 2  # one hypervolume curve per run, on one plot
    shot = out / "screenshot.png"
    assert browser.save_screenshot(str(shot))
    _assert_not_blank(shot)
