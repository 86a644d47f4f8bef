"""The report in a real browser: headless Chromium opens ``index.html`` of a REAL tiny search.

A real run (Ray Tune, real Rotten Tomatoes sentences, real training; every trial uses the
length_drop gating, so each brings a real anytime curve) is searched once for this module.
Chromium (Debian packages ``chromium`` and ``chromium-driver``, driven by selenium) then opens
the run's report, the comparison page and a page with hostile strings, and we check what a
user would see: no console errors, every plot drawn, nothing fetched but ``plotly.min.js``
beside the page (no network), no script injected, and a screenshot that is not blank.

Hostile strings from each source a report shows, through the real writers
(:func:`archsearch.report.synthetic.write_run_dir` -> ``run.json``/``space.yaml``/``trials/``
-> :func:`archsearch.report.report_run` and :func:`archsearch.report.compare.compare_runs`):
the run name (also the run directory's name, as ``archsearch search --name`` makes it), a
categorical param value in a trial's config, dataset text (the space's ``dataset`` fields,
which the page does not show today, and the data loader's own error naming that dataset,
recorded by the recorder's ``error_line`` as a failed trial's error), and an error message.
Every page loads with ``window.alert``/``confirm``/``prompt`` replaced before any page script
runs (CDP ``Page.addScriptToEvaluateOnNewDocument``), so a payload that ran is recorded, not
missed; a control test first proves each payload does run when a page holds it unescaped.
The raw HTML is checked without a browser too (:func:`assert_escaped_html`).

Set-up: ``.ci/run`` installs the two Debian packages. Tests never install anything: without
``chromium`` and ``chromedriver`` (or selenium) the browser tests are skipped, saying what is
missing, before the search is run; the raw-HTML check runs anyway. Tests that search get the
``ray`` marker from ``conftest`` (they use ``ray_session``); the browser tests are ``slow``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import tempfile
import time
import traceback
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

#: Payloads that run script when a page holds them unescaped, by the context they break out
#: of (the control test checks each one in its context): text, a "-quoted and a '-quoted
#: attribute, a <script> element (an end tag with a newline before its ">"), and the RCDATA
#: elements <textarea> and <title>. Each leaves its name in ``window.__pwned`` or ``alert``.
PAYLOADS = {
    "text": "<script>window.__pwned='text'</script>",
    "dq_attr": "\"><img src=x onerror=\"window.__pwned='dq_attr'\">",
    "sq_attr": "'><svg onload='window.__pwned=\"sq_attr\"'>",
    "script": "</script\n><script>window.__pwned='script'</script\n>",
    "rcdata": "</textarea></title><img src=x onerror=\"alert('rcdata')\">",
}
#: All of them, one a line, plus "<!--<script>" (inside a <script> element it would make the
#: next "</script>" not end it) and a bare ampersand.
HOSTILE = "\n".join(PAYLOADS.values()) + "\n<!--<script> & end"
#: Run names are directory names (``runs/NAME``): no "/", so only the payloads without one,
#: a newline and tags that would swallow the page (``<script>``, ``<textarea>``).
NAME = "run <script> " + " ".join(p for p in PAYLOADS.values() if "/" not in p) + "\n<textarea>"
OTHER_NAME = NAME.replace("run", "rival", 1)
#: A dataset named by a local file whose path holds the one-line payloads.
DATASET = "data/" + " ".join(p for p in PAYLOADS.values() if "\n" not in p) + ".csv"
#: Replaces alert/confirm/prompt before any script of a page runs: what a payload would have
#: shown is kept in window.__alerts.
ALERT_HOOK = ("window.__alerts = [];"
              "window.alert = window.confirm = window.prompt = function (m) {"
              " window.__alerts.push(String(m)); return null; };")


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

needs_browser = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def browser_test(fn):
    """A test that drives Chromium: ``slow``, skipped (before its fixtures run) when the
    browser is missing."""
    return pytest.mark.slow(needs_browser(fn))


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
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": ALERT_HOOK})
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
    """Load a local page, wait until it is the loaded document and its plots are drawn;
    return its console messages. Polls rather than trusting ``driver.get`` to return on the
    new, complete document (once, under load, the first look found no plot at all)."""
    driver.get_log("browser")  # drop messages of earlier pages
    driver.execute_script("window.__previous_page = true")
    driver.get(path.resolve().as_uri())
    deadline, state = time.time() + 60, None
    while time.time() < deadline:
        state = driver.execute_script(
            "const plots = Array.from(document.querySelectorAll('div.plot'));"
            "return {new_page: window.__previous_page === undefined,"
            " ready: document.readyState, n_plots: plots.length,"
            " drawn: plots.length > 0 && plots.every("
            "  d => d.classList.contains('js-plotly-plot') && d.querySelector('.main-svg'))}")
        if state["new_page"] and state["ready"] == "complete" and state["drawn"]:
            break
        time.sleep(0.25)
    logs = driver.get_log("browser")
    assert state["new_page"] and state["ready"] == "complete", (state, _errors(logs))
    assert state["n_plots"] >= 1, ("the page has no plot", state, _errors(logs))
    assert state["drawn"], ("not every plot was drawn within 60 s", state, _errors(logs))
    return logs


def _errors(logs: list[dict]) -> list[str]:
    return [e["message"] for e in logs if e.get("level") == "SEVERE"]


def _check_no_alert(driver) -> None:
    """No injected script ran: no alert open, none recorded by :data:`ALERT_HOOK` (which must
    be in place), and ``window.__pwned`` unset."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        pass
    else:
        pytest.fail(f"a script injected into the page ran: alert({text!r})")
    alerts, pwned = driver.execute_script(
        "return [window.__alerts === undefined ? null : window.__alerts,"
        " window.__pwned === undefined ? null : String(window.__pwned)]")
    assert alerts is not None, "the alert hook is not installed: an alert could go unseen"
    assert alerts == [], f"a script injected into the page ran: alert({alerts!r})"
    assert pwned is None, f"a script injected into the page ran: window.__pwned = {pwned!r}"


def _assert_not_blank(png: Path) -> None:
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[0] >= 600 and img.shape[1] >= 1000, img.shape
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 100, f"only {len(colours)} distinct colours: blank page?"
    non_white = float(np.mean(np.any(img < 235, axis=2)))
    assert non_white > 0.03, f"only {non_white:.1%} of the pixels are not white"


@browser_test
def test_real_run_report_in_chromium(browser, real_run):
    """The real run's page: no console errors, all plots drawn, nothing fetched but
    plotly.js from the file beside it, the Pareto table and the anytime curve present, and a
    screenshot that is not blank."""
    page = real_run.report_dir / "index.html"
    logs = _open(browser, page)
    assert not _errors(logs), _errors(logs)
    _check_no_alert(browser)
    # offline: the one resource requested is plotly.min.js beside the page (the PNGs are
    # data: URIs); Plotly is that file's
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(n => !n.startsWith('data:'))")
    assert set(fetched) <= {(real_run.report_dir / "plotly.min.js").resolve().as_uri()}, fetched
    version = re.search(r"plotly\.js v(\S+)",
                        (real_run.report_dir / "plotly.min.js").read_text()[:400]).group(1)
    assert browser.execute_script("return window.Plotly && Plotly.version") == version
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


@browser_test
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
    assert_escaped_html(tmp_path / "index.html", [XSS, IMG_XSS],
                        shown=["run " + XSS, IMG_XSS])
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


@browser_test
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


# ------------------------------------------------------------------------------------------
# hostile strings from every source, through the real writers
# ------------------------------------------------------------------------------------------

#: Tags the report pages are made of; anything else in a page was injected.
PAGE_TAGS = {"html", "head", "meta", "title", "style", "script", "body", "h1", "h2", "p", "div",
             "nav", "a", "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "b", "br",
             "span", "i", "details", "summary", "img"}
#: The tags plotly reads in hover texts, hover templates, legend names and titles (user text
#: in them is escaped).
PLOTLY_TAGS = re.compile(r"</?(b|br|i|extra)>")
_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
_START_TAG = re.compile(r"<([a-zA-Z][\w-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*)>")


def _strings(obj):
    """Every string in a JSON value (keys too)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _script_json(body: str, start: int):
    return json.JSONDecoder().raw_decode(body, start)[0]


def assert_escaped_html(path: Path, hostile, shown=()) -> None:
    """The raw HTML of a report page (``path``) holds the ``hostile`` strings only escaped (no
    browser).

    * no line of a hostile string that holds markup (``<``, 10+ characters) is in the page
      verbatim, nor the whole string;
    * the page is made of our own tags only (:data:`PAGE_TAGS`), none with an ``on...=``
      event attribute, every ``<img>`` a ``data:image/png``, the ``<title>`` plain text;
    * plotly.js is the file ``plotly.min.js`` beside the page (the installed bundle's bytes),
      loaded by the page's one ``<script src="plotly.min.js">`` and not inlined;
    * the other ``<script>`` elements are ours: the hover table and one per plot, each
      ended by its own end tag; their JSON (:func:`archsearch.report.page.script_json`) holds
      no ``</``, ``<!--`` or ``<script``, and its strings (hover texts, trace names, titles)
      carry no tag but plotly's ``<b>``/``<br>``/``<i>``/``<extra>``: user text in them is
      escaped;
    * each of the ``shown`` strings is in the page escaped (the writers' ``esc``; the checks
      above do not rely on it).
    """
    from archsearch.report.page import plotly_js
    from archsearch.report.values import esc

    page = path.read_text(encoding="utf-8")
    bundle = plotly_js()
    assert (path.parent / "plotly.min.js").read_bytes() == bundle.encode("utf-8")
    assert bundle[:5000] not in page, "plotly.js is inlined"
    assert re.findall(r"<script[^>]*src[^>]*>", page, re.IGNORECASE) \
        == ['<script src="plotly.min.js">'], "a <script src> other than plotly.min.js"
    for s in hostile:
        for line in [s, *s.splitlines()]:
            if "<" in line and len(line) >= 10:
                assert line not in page, f"unescaped in the page: {line!r}"
    for s in shown:
        assert esc(s) in page, f"not on the page (escaped): {s!r}"

    scripts = _SCRIPT.findall(page)
    n_plots = page.count('<div id="fig-')
    assert n_plots >= 1
    assert len(re.findall(r"<script", page, re.IGNORECASE)) == len(re.findall(r"</script", page, re.IGNORECASE)) \
        == len(scripts) + 1 == n_plots + 2, "a <script> element more or less than the page's own"
    for body in scripts:
        assert not re.search(r"</|<!--|<script", body, re.IGNORECASE), body[:300]
        if body.startswith("window.ASH_HOVER="):
            values = [_script_json(body, len("window.ASH_HOVER="))]
        else:
            assert body.startswith("(function(){var d="), body[:100]
            values = [_script_json(body, len("(function(){var d="))]
            k = body.index("Plotly.newPlot(")
            _div_id, end = json.JSONDecoder().raw_decode(body, k + len("Plotly.newPlot("))
            assert body[end:end + 3] == ",d,"
            values.append(_script_json(body, end + 3))  # the layout
        for text in (t for v in values for t in _strings(v)):
            assert "<" not in PLOTLY_TAGS.sub("", text), f"markup in figure text: {text[:200]!r}"

    outside = _SCRIPT.sub("<script></script>", page)
    for m in _START_TAG.finditer(outside):
        tag, attrs = m.group(1).lower(), m.group(2)
        assert tag in PAGE_TAGS, f"injected element: {m.group(0)[:200]!r}"
        assert not re.search(r"\bon\w+\s*=", attrs, re.IGNORECASE), f"event attribute: {m.group(0)[:200]!r}"
        if tag == "img":
            assert re.match(r'\s+class="png" alt="[^"<]*" src="data:image/png;base64,', attrs), \
                m.group(0)[:200]
    assert outside.count("<title>") == outside.count("</title>") == 1, "more than one <title>"
    title = re.search(r"<title>(.*?)</title>", outside, re.DOTALL)
    assert title and title.group(1).startswith("archsearch ") and "<" not in title.group(1), title


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory):
    """Two run directories with hostile strings from every source, written as the runner
    writes them (:func:`~archsearch.report.synthetic.write_run_dir`), and their pages from
    ``archsearch report`` (:func:`~archsearch.report.report_run`, into its default
    ``reports/NAME/``) and ``archsearch compare``. No Ray, nothing trained.

    * run name: :data:`NAME` / :data:`OTHER_NAME` in ``run.json`` and as the run directory's
      name (so the run directory and space file paths on the page hold it too);
    * param value: the categorical param ``init_from`` is :data:`HOSTILE` in the space and in
      the config of trial 0, the best trial on both objectives (its config is in the Pareto
      table, its repro command and the plots' hover text);
    * dataset text: the space's ``dataset.name`` is :data:`DATASET` and its ``text_column``
      is :data:`HOSTILE`; the page does not show the dataset spec, so the dataset text that
      reaches it is the data loader's own error for that dataset name
      (:func:`archsearch.data.names.resolve`), reduced to one line by the recorder's
      :func:`archsearch.tune.callbacks.error_line`, as trial 2's error;
    * error message: trial 1 failed with ``RuntimeError:`` :data:`HOSTILE` (several lines).
    """
    import yaml

    from archsearch.data.names import resolve
    from archsearch.errors import UserError
    from archsearch.report import report_run
    from archsearch.report.compare import compare_runs
    from archsearch.report.synthetic import synthetic_trials, write_run_dir
    from archsearch.tune.callbacks import error_line

    tmp = tmp_path_factory.mktemp("hostile")
    space = copy.deepcopy(TINY_SPACE)
    space["dataset"] = {**space["dataset"], "name": DATASET, "text_column": HOSTILE}
    space["params"]["init_from"] = {"type": "categorical", "choices": ["checkpoints/base", HOSTILE]}
    with pytest.raises(UserError) as info:
        resolve(DATASET)
    data_error = error_line("".join(traceback.format_exception(info.value)))
    assert data_error.startswith("archsearch.errors.UserError: " + DATASET), data_error

    def records(seed: int) -> list[dict]:
        trials = synthetic_trials(8, seed=seed, p_error=0.0, p_nan=0.0)
        for t in trials:
            t["config"] = {k: t["config"][k] for k in ("n_layers", "d_model", "n_heads", "lr")}
            t["config"]["init_from"] = "checkpoints/base"
        trials[0]["config"]["init_from"] = HOSTILE
        trials[0]["metrics"].update(accuracy=0.97, flops_per_sample=1e4, params_trainable=1000)
        trials[1].update(status="ERROR", error="RuntimeError: " + HOSTILE)
        trials[2].update(status="ERROR", error=data_error)
        return trials

    space_yaml = yaml.safe_dump(space)
    storage = tmp / "runs"
    run = write_run_dir(storage / NAME, records(1), space_yaml=space_yaml, name=NAME,
                        wall_seconds=61.0)
    other = write_run_dir(storage / OTHER_NAME, records(2), space_yaml=space_yaml,
                          name=OTHER_NAME, wall_seconds=75.0)
    report, summary = report_run(run, reports=tmp / "reports")
    assert report == tmp / "reports" / NAME
    assert summary["pareto"][0]["config"]["init_from"] == HOSTILE  # the records came through
    out, _ = compare_runs([run, other], out=tmp / "compare")
    return {"report": report / "index.html", "compare": out / "index.html",
            "data_error": data_error}


def test_hostile_strings_escaped_in_raw_html(hostile_runs):
    """Run name, param value, dataset text and error message are in both pages only escaped
    (no browser needed)."""
    data_error = hostile_runs["data_error"]
    assert_escaped_html(hostile_runs["report"],
                        [NAME, HOSTILE, DATASET, data_error],
                        shown=[NAME, HOSTILE, data_error])
    assert_escaped_html(hostile_runs["compare"], [NAME, OTHER_NAME, HOSTILE, DATASET],
                        shown=[NAME, OTHER_NAME])


def _visible_text(driver) -> str:
    """The page's rendered text with every ``<details>`` opened."""
    return driver.execute_script(
        "document.querySelectorAll('details').forEach(d => { d.open = true; });"
        "return document.body.innerText")


def _assert_shown(text: str, strings) -> None:
    """Every line of each string is in ``text`` (outside ``<pre>`` a newline renders as a
    space, so lines are checked one by one)."""
    for s in strings:
        for line in s.splitlines():
            assert line.strip() in text, f"not shown as text: {line!r}"


def _check_no_injected_elements(driver) -> None:
    """Only our own elements: no stray ``<img>``/``<iframe>``/``<textarea>``, no event
    attribute, and exactly our ``<script>`` elements (plotly.min.js, hover table, one per
    plot)."""
    injected, n_scripts, n_plots = driver.execute_script(
        "const bad = document.querySelectorAll('img:not(.png), iframe, textarea, object, embed,"
        " script[src]:not([src=\"plotly.min.js\"]), [onerror], [onload], [onclick], [onmouseover]');"
        "return [Array.from(bad).map(e => e.outerHTML.slice(0, 200)), document.scripts.length,"
        " document.querySelectorAll('div.plot').length]")
    assert injected == [], injected
    assert n_scripts == n_plots + 2, (n_scripts, n_plots)


#: Where the hostile param value is in a (escaped) hover text; the run name is in every
#: hover text of the comparison.
PARAM_NEEDLE = "init_from = &lt;script&gt;window.__pwned"


def _hover(driver, div_id: str, needle: str) -> str | None:
    """Hover the first point of ``div_id`` whose hover text holds ``needle``; the hover
    label's text (``None``: no such point)."""
    return driver.execute_script("""
        const gd = document.getElementById(arguments[0]), needle = arguments[1];
        const has = h => typeof h === 'string' && h.includes(needle);
        const k = gd.data.findIndex(t => Array.isArray(t.hovertext) && t.hovertext.some(has));
        if (k < 0) return null;
        Plotly.Fx.hover(gd, [{curveNumber: k, pointNumber: gd.data[k].hovertext.findIndex(has)}]);
        const layer = gd.querySelector('.hoverlayer');
        if (layer.querySelector('img, script, foreignObject, [onload], [onerror]'))
            return 'INJECTED: ' + layer.innerHTML;
        return layer.textContent;""", div_id, needle)


@browser_test
def test_payloads_run_when_unescaped(browser, tmp_path):
    """Control: each payload does run script in the context it is made for, and the checks
    see it (so a clean report below is escaping, not a dud payload or a blind check)."""
    contexts = [("text", "<body><p>{}</p>"), ("dq_attr", "<body><a title=\"{}\">a</a>"),
                ("sq_attr", "<body><a title='{}'>a</a>"),
                ("script", "<body><script>var s = \"{}\";</script>"),
                ("rcdata", "<body><textarea>{}</textarea>"), ("rcdata", "<title>{}</title><body>")]
    for k, (name, context) in enumerate(contexts):
        page = tmp_path / f"control{k}.html"
        page.write_text("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
                        + context.replace("{}", PAYLOADS[name]) + "</body></html>")
        browser.get(page.as_uri())
        deadline, ran = time.time() + 10, None
        while time.time() < deadline:
            ran = browser.execute_script("return [window.__pwned || null, window.__alerts]")
            if ran[0] or ran[1]:
                break
            time.sleep(0.1)
        assert ran is not None and name in [ran[0], *ran[1]], (name, context, ran)
        with pytest.raises(AssertionError, match="injected into the page ran"):
            _check_no_alert(browser)


@browser_test
def test_hostile_strings_in_report_stay_text_in_chromium(browser, hostile_runs):
    """``archsearch report`` of the hostile run: no script ran, no element was injected, no
    console error, and run name, param value, dataset error and error message are shown as
    text (page, title and plotly hover label)."""
    logs = _open(browser, hostile_runs["report"])
    _check_no_alert(browser)
    assert not _errors(logs), _errors(logs)
    _check_no_injected_elements(browser)
    assert "<script>" in browser.title and "<textarea>" in browser.title, browser.title
    text = _visible_text(browser)
    assert text.count("<script>") >= 4
    _assert_shown(text, [NAME, HOSTILE, hostile_runs["data_error"]])
    hover = _hover(browser, "fig-pareto", PARAM_NEEDLE)
    assert hover is not None, "no point's hover text holds the hostile param value"
    assert PAYLOADS["text"] in hover and PAYLOADS["dq_attr"] in hover, hover
    _check_no_alert(browser)
    assert not _errors(browser.get_log("browser"))


@browser_test
def test_hostile_strings_in_compare_page_stay_text_in_chromium(browser, hostile_runs):
    """``archsearch compare`` of the two hostile runs: no script ran, the run names are text
    in the summary table and the legend, the param value in the hover label."""
    logs = _open(browser, hostile_runs["compare"])
    _check_no_alert(browser)
    assert not _errors(logs), _errors(logs)
    _check_no_injected_elements(browser)
    assert "<script>" in browser.title, browser.title
    _assert_shown(_visible_text(browser), [NAME, OTHER_NAME])
    legend = browser.execute_script(
        "return document.querySelector('#fig-hypervolume .legend').textContent")
    assert PAYLOADS["dq_attr"] in legend and PAYLOADS["sq_attr"] in legend, legend
    hover = _hover(browser, "fig-scatter", PARAM_NEEDLE)
    assert hover is not None and PAYLOADS["text"] in hover, hover
    _check_no_alert(browser)
    assert not _errors(browser.get_log("browser"))
