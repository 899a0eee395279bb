"""A one-line progress bar on stderr, for runs of a few minutes.

On a terminal the line is redrawn in place (``\\r``); anywhere else (a log file, a pipe) each
update is a line of its own, so the log still shows how far a killed run got.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, stream=None, width: int = 24, clock=time.monotonic):
        self.total, self.width, self.clock = total, width, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = clock()

    def line(self, done: int, what: str, left_s: float | None = None) -> str:
        filled = self.width * done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        left = f", ~{left_s:.0f} s left" if left_s is not None else ""
        return f"[{bar}] {done}/{self.total} {self.clock() - self.start:4.0f} s{left}  {what}"

    def update(self, done: int, what: str, left_s: float | None = None) -> None:
        text = self.line(done, what, left_s)
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
