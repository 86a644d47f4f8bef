"""Does this Python have what archsearch needs? The first command of an ``archsearch submit`` job.

``archsearch submit`` runs ``python archsearch/tune/envcheck.py VERSION && python -m
archsearch.cli search ...`` on the cluster (:func:`archsearch.tune.submit.job_command`). This
script, run by whatever ``python`` the cluster's nodes have on their PATH, checks before the
search starts:

* the Python version (``requires-python`` of ``pyproject.toml``);
* that every package of archsearch's dependencies can be found (``importlib.util.find_spec``:
  nothing heavy is imported, so the check takes well under a second);
* that ``import archsearch`` gives the shipped code of the submitter's version ``VERSION``: that
  version, from the job's working directory (as ``python -m`` will import it: the working
  directory first, unless ``PYTHONSAFEPATH`` is set), not an installed copy.

Otherwise it prints one line, ``error: PYTHON: PACKAGE: what is missing and how to fix it``,
and exits with code 2, which ``archsearch submit --wait`` passes on (it repeats the job's last
``error:`` line). Standard library only, and syntax old Pythons can parse, so that it runs
where nothing else can.
"""

import importlib.util
import os
import sys

#: Python version archsearch needs (``requires-python``).
MIN_PYTHON = (3, 10)

#: Every distribution of ``[project] dependencies`` in pyproject.toml -> the module it provides
#: (a test keeps the two lists equal).
REQUIRED = {
    "torch": "torch", "ray": "ray", "optuna": "optuna", "optuna-dashboard": "optuna_dashboard",
    "botorch": "botorch", "gpytorch": "gpytorch", "transformers": "transformers",
    "huggingface_hub": "huggingface_hub", "datasets": "datasets", "tokenizers": "tokenizers",
    "typer": "typer", "rich": "rich", "pydantic": "pydantic", "PyYAML": "yaml",
    "plotly": "plotly", "Jinja2": "jinja2", "matplotlib": "matplotlib", "pandas": "pandas",
    "pyarrow": "pyarrow", "onnx": "onnx", "onnxscript": "onnxscript", "onnxruntime": "onnxruntime",
}

FIX = ("run the cluster from the image in cluster/ (cluster/Dockerfile, or cluster/kuberay), "
       "or start its head and workers with `ray start` from the project's environment "
       "(source .venv/bin/activate, or pip install the project into the Python that runs Ray)")


def missing_packages():
    """The distributions of :data:`REQUIRED` whose module this Python cannot find."""
    out = []
    for dist, module in REQUIRED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def problem(expected_version=None):
    """``(field, message)`` of the first thing this Python lacks, or ``None`` when it has it all."""
    version = ".".join(map(str, sys.version_info[:3]))
    wanted = expected_version or "this version of"
    if tuple(sys.version_info[:2]) < MIN_PYTHON:
        return ("python", "Python {} is too old: archsearch {} needs Python >= {}; {}".format(
            version, wanted, ".".join(map(str, MIN_PYTHON)), FIX))
    missing = missing_packages()
    if missing:
        return (missing[0], "this Python ({}) lacks {} ({} of the {} packages archsearch {} "
                "needs), so the search cannot start; {}".format(
                    version, ", ".join(missing), len(missing), len(REQUIRED), wanted, FIX))
    try:
        import archsearch
    except Exception as e:  # the shipped package itself does not import
        return ("archsearch", "cannot import the shipped archsearch ({}: {}); {}".format(
            e.__class__.__name__, " ".join(str(e).split())[:200], FIX))
    got = getattr(archsearch, "__version__", "unknown")
    where = os.path.dirname(os.path.dirname(os.path.abspath(archsearch.__file__)))
    if expected_version and got != expected_version:
        return ("archsearch", "imports archsearch {} from {}, not the submitted {} (the job's "
                "working directory {} should come first on sys.path: is PYTHONSAFEPATH set, or "
                "an old archsearch installed over it?); {}".format(
                    got, where, expected_version, os.getcwd(), FIX))
    if expected_version and os.path.isdir(os.path.join(os.getcwd(), "archsearch")) \
            and not _same_dir(where, os.getcwd()):
        # the same version string, other code: an installed copy shadows the shipped one
        return ("archsearch", "imports archsearch {} from {}, not the submitted code in the job's "
                "working directory {} (is PYTHONSAFEPATH set, or is archsearch installed over "
                "it?); {}".format(got, where, os.getcwd(), FIX))
    return None


def _same_dir(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def main(argv=None):
    """``python archsearch/tune/envcheck.py [VERSION]``: exit 0 silently, or one line and 2."""
    argv = sys.argv[1:] if argv is None else argv
    # as `python -m archsearch.cli` will: the working directory first, not this file's folder
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH: `-m` adds nothing
        sys.path.insert(0, os.getcwd())
    found = problem(argv[0] if argv else None)
    if found is None:
        return 0
    field, message = found
    print("error: {}: {}: {}".format(sys.executable or "python", field, " ".join(message.split())),
          file=sys.stderr)
    sys.stderr.flush()
    return 2


if __name__ == "__main__":
    sys.exit(main())
