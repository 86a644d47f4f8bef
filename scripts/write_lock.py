"""Write constraints.txt, the lock a fresh clone installs: ``pip freeze`` of a venv that passed.

Called by ``bash scripts/run.sh lock`` after the quick tier passed in a throwaway venv holding
the newest releases that ``pyproject.toml`` allows. The lock holds every installed distribution
at its exact version except archsearch itself (editable) and torch, whose build ``TORCH_SPEC``
picks (the CPU wheel by default). ``scripts/run.sh`` installs with ``pip install -c
constraints.txt``; ``pyproject.toml`` keeps its lower bounds for other environments.

Usage: python scripts/write_lock.py --venv-python VENV/bin/python --out constraints.txt
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
from pathlib import Path

#: left to ``TORCH_SPEC`` in scripts/run.sh (a CPU or CUDA build of the same release)
UNLOCKED = ("torch",)


def freeze(python: str) -> list[str]:
    """``NAME==VERSION`` lines of the venv of ``python``, without editable installs.

    Raises:
        SystemExit: pip failed, or a line is not an exact pin (a direct URL or a path).
    """
    out = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: pip freeze failed: {out.stderr.strip()}")
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    bad = [ln for ln in lines if "==" not in ln or "@" in ln]
    if bad:
        sys.exit(f"error: not an exact release, cannot be locked: {bad[0]}")
    return sorted((ln for ln in lines if ln.split("==")[0].lower() not in UNLOCKED),
                  key=str.lower)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv-python", required=True, help="the python of the venv to lock")
    ap.add_argument("--out", default="constraints.txt")
    args = ap.parse_args()
    pins = freeze(args.venv_python)
    py = subprocess.run([args.venv_python, "-c", "import platform; print(platform.python_version())"],
                        capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    header = [
        "# The lock: exact versions the test suite passed with. Written by `bash scripts/run.sh lock`",
        "# (scripts/write_lock.py), never by hand; scripts/run.sh installs with `pip install -c constraints.txt`.",
        f"# Locked on {datetime.date.today().isoformat()} at commit {commit}, Python {py}, "
        f"{platform.system()} {platform.machine()}.",
        "# torch is not here: TORCH_SPEC in scripts/run.sh picks its build (default torch==2.13.0, CPU).",
    ]
    Path(args.out).write_text("\n".join(header + pins) + "\n")
    print(f"wrote {args.out}: {len(pins)} pins")


if __name__ == "__main__":
    main()
