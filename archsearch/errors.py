"""User-facing errors.

Every mistake a user can make (bad YAML, unknown dataset, impossible constraint...) raises
:class:`UserError`. The CLI prints it as one line, ``FILE: FIELD: message``, and exits with
code 2; it never shows a traceback for these. A search stopped for a reason that is not the
user's input raises :class:`SearchStopped`: one line too, exit code 1.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in user input, reported as one line naming the file and the field.

    Args:
        message: what is wrong and, when possible, what would be right.
        file: the file (or dataset name / path / URL) the mistake is in, if any.
        field: the dotted field inside that file (``params.n_layers.low``), if any.
    """

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.message = message
        self.file = None if file is None else str(file)
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = [p for p in (self.file, self.field) if p]
        prefix = ": ".join(parts)
        text = " ".join(self.message.split())  # force one line
        return f"{prefix}: {text}" if prefix else text


class SearchStopped(UserError):
    """A search stopped for a reason outside the user's input (its searcher's state could not be
    saved): one line, exit code 1, raised after the run directory and its report are written."""

    exit_code = 1
