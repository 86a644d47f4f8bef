"""The one command-line shape of every benchmark runner::

    python -m benchmarks.<question>.<runner> run     [--seeds 0-2,5] [options]   measure (resumable)
    python -m benchmarks.<question>.<runner> analyze [options]   rewrite the results from the run logs
    python -m benchmarks.<question>.<runner> check   [options]   regenerate in memory; exit 1 if a
                                                                 stored result differs (provenance aside)

A runner builds a :class:`Command` from ``run`` (measures, appends to its run log, then writes
its results) and ``results`` (reads the committed run logs and returns ``{path: result}``
without writing: what ``analyze`` writes and ``check`` compares). Bad input (a missing file, a
malformed protocol or seed list) ends in one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.evidence.results import compare_results, read_result, write_json
from benchmarks.evidence.seeds import parse_seeds


class Command:
    """A benchmark runner's command line.

    Args:
        description: the runner's claim in a line.
        run: ``args -> int | None``: measure; ``None`` where the runner has nothing to run
            (an offline analysis of stored data).
        results: ``args -> {path: result}`` (built with ``record_reads=not args.check``), or
            ``None`` where results are written only by ``run``.
        add_arguments: ``parser -> None``: options shared by every subcommand.
        seeds: the default ``--seeds`` (a spec such as ``"0-2"``); ``None``: no seed option.
    """

    def __init__(self, description: str, *, run: Callable[[argparse.Namespace], Any] | None = None,
                 results: Callable[[argparse.Namespace], dict[Path, dict]] | None = None,
                 add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 seeds: str | None = None):
        self.description, self.run, self.results = description, run, results
        self.add_arguments, self.seeds = add_arguments, seeds

    def parser(self) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(description=self.description)
        sub = p.add_subparsers(dest="command", required=True)
        for name, help_ in (("run", "measure (resumable), then write the results"),
                            ("analyze", "rewrite the results from the committed run logs"),
                            ("check", "regenerate in memory; exit 1 where a stored result differs")):
            if (name == "run" and self.run is None) or (name != "run" and self.results is None):
                continue
            s = sub.add_parser(name, help=help_)
            if self.seeds is not None:
                s.add_argument("--seeds", default=self.seeds, type=parse_seeds,
                               help=f"seeds, e.g. 0-2,5 (default {self.seeds})")
            if self.add_arguments:
                self.add_arguments(s)
        return p

    def main(self, argv: Sequence[str] | None = None, *, default: str | None = None) -> int:
        """Run the subcommand of ``argv`` (default ``sys.argv[1:]``); with ``default``
        (``"analyze"``), an empty ``argv`` or one that starts with an option runs that
        subcommand (a runner of stored data, whose bare command analyzes)."""
        if default is not None:
            argv = list(sys.argv[1:] if argv is None else argv)
            if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
                argv = [default, *argv]
        args = self.parser().parse_args(argv)
        args.check = args.command == "check"
        try:
            if args.command == "run":
                return int(self.run(args) or 0)
            built = self.results(args)
            if args.command == "analyze":
                for path, result in built.items():
                    write_json(path, result)
                    print(f"wrote {path}")
                return 0
            bad = 0
            for path, result in built.items():
                diff = compare_results(read_result(path), result)
                print(f"{path}: {'identical' if not diff else f'{len(diff)} differences'}")
                for line in diff[:20]:
                    print(f"  {line}")
                bad += bool(diff)
            return 1 if bad else 0
        except (ValueError, FileNotFoundError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
