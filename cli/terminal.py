"""The console every command prints with: rich's, but a reader that closed the pipe (``| head``) is
an ordinary ``BrokenPipeError``, which the app ends quietly with exit 0 (``cli/app.py``); rich's
own answer is exit 1, which our exit codes keep for internal errors."""
from __future__ import annotations

from rich.console import Console as RichConsole


class Console(RichConsole):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError
