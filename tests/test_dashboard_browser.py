"""optuna-dashboard on a finished run, in a real browser.

``archsearch dashboard runs/NAME --port PORT`` (on 127.0.0.1) serves the study of a real tiny
search (conftest's ``tiny_run``: random searcher, 3 trials, objectives ``accuracy`` and
``flops_per_sample``, constraint ``params_trainable.max``); headless Chromium (selenium, as in
tests/test_report_browser.py) opens the study list, follows the run's study and finds:

* the objectives by their metric names (``study.set_metric_names``), not ``Objective 0``;
* the Pareto-front plot drawn, its front exactly Optuna's (``study.best_trials``, which
  takes the constraints into account), every COMPLETE trial on the plot;
* the constraints reaching the dashboard (its API serves each trial's values).

A screenshot goes to the test's tmp dir and to ``/tmp/archsearch-dashboard.png`` (the path is
printed). Set-up: ``.ci/run`` installs the Debian packages ``chromium`` and
``chromium-driver``; without them (or selenium) the test is skipped, saying what is missing,
before the search is run. The dashboard process is always terminated.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import cli_command, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: Flags that work on these machines (no sandbox as root, no GPU, no background traffic).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000"]
SCREENSHOT = Path("/tmp/archsearch-dashboard.png")
PARETO_DIV = "graph-pareto-front"  # optuna-dashboard's id of the Pareto-front plot


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
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]


def _get_json(url: str, timeout: float = 5):
    return json.loads(urllib.request.urlopen(url, timeout=timeout).read())


@pytest.fixture(scope="module")
def dashboard(tiny_run, tmp_path_factory):
    """``archsearch dashboard`` on the finished tiny run, at a free port on 127.0.0.1:
    ``{"url", "study_id", "log"}``. Terminated (killed if need be) at the end."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("dashboard") / "dashboard.log"
    log = open(log_path, "w")  # a file, not a pipe: an undrained pipe blocks the server
    proc = subprocess.Popen(cli_command("dashboard", tiny_run.run_dir, "--port", port),
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        studies, deadline = None, time.time() + 60
        while time.time() < deadline and studies is None:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                studies = _get_json(f"{url}/api/studies", timeout=2)["study_summaries"]
            except OSError:
                time.sleep(0.3)
        assert studies is not None, ("optuna-dashboard did not answer within 60 s",
                                     log_path.read_text()[-3000:])
        assert [s["study_name"] for s in studies] == [tiny_run.run_dir.name]
        yield {"url": url, "study_id": studies[0]["study_id"], "log": log_path}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium (selenium + chromedriver), fresh profile."""
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


def _wait(driver, script: str, what: str, timeout: float = 60, *args):
    """Poll ``script`` (JavaScript returning a value) until it returns something truthy."""
    deadline, value = time.time() + timeout, None
    while time.time() < deadline:
        value = driver.execute_script(script, *args)
        if value:
            return value
        time.sleep(0.25)
    logs = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    pytest.fail(f"{what} within {timeout:.0f} s (url {driver.current_url}; console errors {logs})")


#: The Pareto-front plot once plotly drew it: its traces' hover labels and points.
PARETO_TRACES = """
    const gd = document.getElementById(arguments[0]);
    if (!gd || !gd.data || !gd.querySelector('.main-svg')) return null;
    if (!gd.data.some(t => t.x && t.x.length)) return null;
    return gd.data.map(t => ({label: String(t.hovertemplate || ''), x: t.x || [], y: t.y || []}));"""


def test_dashboard_shows_metric_names_and_pareto_front(tiny_run, dashboard, browser, tmp_path):
    import optuna
    from PIL import Image

    from archsearch.runs import RunDir

    study = optuna.load_study(study_name=tiny_run.run_dir.name,
                              storage=optuna.storages.RDBStorage(RunDir(tiny_run.run_dir).optuna_url))
    names = study.metric_names
    assert names == ["accuracy", "flops_per_sample"]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 3

    # the dashboard's API: the metric names, and each trial's constraint values
    url, sid = dashboard["url"], dashboard["study_id"]
    detail = _get_json(f"{url}/api/studies/{sid}?after=0")
    assert detail["objective_names"] == names  # read from Optuna's study:metric_names
    served = {t["number"]: t["constraints"] for t in detail["trials"]}
    assert served == {t.number: [t.constraints["params_trainable.max"]] for t in complete}, served

    # the study list, then the run's study, as a user would click through
    browser.get(f"{url}/dashboard")
    link = _wait(browser, """
        return Array.from(document.querySelectorAll('a')).find(
            a => a.getAttribute('href') && a.getAttribute('href').endsWith('/studies/' + arguments[0]))
            || null;""", "no link to the study on the study list", 60, sid)
    assert tiny_run.run_dir.name in browser.execute_script("return document.body.innerText")
    link.click()
    traces = _wait(browser, PARETO_TRACES, "the Pareto-front plot was not drawn", 60, PARETO_DIV)
    assert browser.current_url.rstrip("/").endswith(f"/dashboard/studies/{sid}"), browser.current_url

    # metric names: in the Pareto card's objective selectors and on the page, no "Objective 0"
    text = browser.execute_script("return document.body.innerText")
    assert "Pareto Front" in text
    for name in names:
        assert name in text, (name, text[:2000])
    assert "Objective 0" not in text and "Objective 1" not in text
    card = browser.execute_script("""
        const gd = document.getElementById(arguments[0]);
        let el = gd;
        while (el && !(el.innerText || '').includes('Objective X')) el = el.parentElement;
        return el ? el.innerText : null;""", PARETO_DIV)
    assert card is not None and "Objective X" in card and "Objective Y" in card, card
    assert names[0] in card and names[1] in card, card

    # the plot: x = accuracy, y = flops_per_sample; the front is Optuna's, all trials drawn
    # (traces by hover label: "Best Trial" is the front, "Trial"/"Feasible Trial" the
    # dominated, "Infeasible Trial" and "Unselected Trial" the rest)
    def points(kind: str) -> list:
        return sorted(p for t in traces if kind in t["label"] for p in zip(t["x"], t["y"]))

    want_front = sorted((t.values[0], t.values[1]) for t in study.best_trials)
    assert want_front and points("<extra>Best Trial<") == want_front, (traces, want_front)
    assert points("Infeasible") == points("Unselected") == []
    assert points("Trial<") == sorted((t.values[0], t.values[1]) for t in complete), traces

    # screenshot with the Pareto front in view
    browser.execute_script("document.getElementById(arguments[0]).scrollIntoView({block: 'center'})",
                           PARETO_DIV)
    time.sleep(0.5)
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    shutil.copyfile(shot, SCREENSHOT)
    img = Image.open(shot).convert("RGB")
    assert img.size[0] >= 1000 and img.size[1] >= 600, img.size
    assert len(img.getcolors(1 << 24) or []) > 50, "a blank screenshot"
    print(f"\nscreenshot of optuna-dashboard on the run: {shot} (copied to {SCREENSHOT})")
    severe = [e["message"] for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe
