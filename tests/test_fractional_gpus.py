"""Fractional GPUs (issue 35): ``budget.gpus_per_trial: 0.25`` packs four trials on one GPU.

A real local Ray declared with one GPU (``ray.init(num_gpus=1)``: Ray schedules by declared
resources, so this runs on a machine without one; the trials then train on the CPU), a real tiny
search of four trials at ``gpus_per_trial: 0.25``, ``cpus_per_trial: 0.5``, then one at
``gpus_per_trial: 1``. Both in one subprocess (its own Ray), which writes what the trials saw
to a JSON file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, tiny_space_file

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = r"""
import json, sys
import ray
from archsearch.space import load_space
from archsearch.tune.runner import run_search
from archsearch.runs import RunDir

space_file, out, work = sys.argv[1], sys.argv[2], sys.argv[3]
ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
         logging_level="ERROR")
space = load_space(space_file)
seen = {}
for gpus in (0.25, 1.0):  # one Ray for both searches
    res = run_search(space, searcher="random", name=f"frac{gpus}", storage=work + "/runs",
                     reports=work + "/reports", progress=False, gpus_per_trial=gpus, cpus_per_trial=0.5)
    seen[str(gpus)] = [{"status": t["status"], "pid": t.get("pid"), "gpu_ids": t["metrics"].get("ray_gpu_ids"),
                        "device": t["metrics"].get("device")} for t in RunDir(res.run_dir).read_trials()]
json.dump(seen, open(out, "w"))
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict[str, list[dict]]:
    """What the trials of each search saw, by ``gpus_per_trial``."""
    tmp_path = tmp_path_factory.mktemp("frac")
    space = tiny_space_file(tmp_path, budget={"trials": 4, "max_concurrent": 4, "epochs": 1, "batch_size": 64,
                                              "scheduler": "none", "cpus_per_trial": 0.5})
    out = tmp_path / "seen.json"
    script = tmp_path / "frac.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(space), str(out), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_four_trials_share_one_gpu_at_a_quarter_each(seen):
    seen = seen["0.25"]
    assert len(seen) == 4 and all(t["status"] == "TERMINATED" for t in seen), seen
    assert all(t["gpu_ids"] == ["0"] for t in seen), seen  # each trial was given GPU 0
    # four actors alive at once: with reuse_actors, trials that ran one after another share a pid
    assert len({t["pid"] for t in seen}) == 4, seen


def test_a_whole_gpu_per_trial_runs_them_one_at_a_time(seen):
    """The check can fail: at gpus_per_trial 1 only one trial fits at a time."""
    seen = seen["1.0"]
    assert all(t["gpu_ids"] == ["0"] for t in seen), seen
    assert len({t["pid"] for t in seen}) == 1, seen
