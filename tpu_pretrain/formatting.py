"""How sizes and durations read in every message, status line and progress report; the training bar."""

from __future__ import annotations

import contextlib
import math
import sys
import time

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps"  # the notebooks' and the terminal's


def human_bytes(n: float) -> str:
    """``1.5 GiB``-style sizes (binary units, as disks and quotas report them)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def hms(seconds: float) -> str:
    """``H:MM:SS`` for a duration; ``?`` when it is unknown (an ETA before the first measured step)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class TerminalProgress:
    """The training bar and, under it, the run's progress line, both redrawn in place on a terminal (``file``, default
    stdout): the notebooks' view for ``tpu-pretrain train``. Log records are printed above them meanwhile
    (tqdm's logging redirect), so neither cuts into the other; the line is cut at the terminal's width, since a
    wrapped line cannot be redrawn in place (the log repeats it whole every log_every_steps)."""

    def __init__(self, total: int, initial: int, desc: str = "training", file=None, disable: bool = False):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        file, self.disable = file or sys.stdout, disable
        self.bar = tqdm(total=total, initial=initial, desc=desc, bar_format=BAR_FORMAT, file=file,
                        dynamic_ncols=True, mininterval=0.5, disable=disable)
        self.line = tqdm(bar_format="{desc}", desc="", file=file, position=1, dynamic_ncols=True, disable=disable)
        self.shown = 0.0
        self._logging = contextlib.ExitStack()
        if not disable:
            self._logging.enter_context(logging_redirect_tqdm())

    def show(self, step: int, line) -> None:
        """Move the bar to ``step``; redraw the line (``line()``) under it, at most twice a second and at the end."""
        if self.disable:
            return
        self.bar.update(step - self.bar.n)
        if time.monotonic() - self.shown >= 0.5 or step >= self.bar.total:
            self.line.set_description_str(line(), refresh=True)
            self.shown = time.monotonic()

    def close(self) -> None:
        self._logging.close()
        self.line.close()
        self.bar.close()
