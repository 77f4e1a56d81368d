"""How sizes and durations read in every message, status line and progress report; the training bar."""

from __future__ import annotations

import contextlib
import math
import os
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


DEFAULT_COLUMNS = 80  # a terminal that reports no width (0 columns: some containers and serial consoles)


def terminal_columns(file) -> tuple[int, bool]:
    """The columns of the terminal ``file`` writes to, and whether it reported them: else ``COLUMNS`` or 80, since
    a width of 0 taken at its word leaves no room for a bar (tqdm then draws none, or a collapsed one)."""
    try:
        columns = os.get_terminal_size(file.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    if columns > 0:
        return columns, True
    given = os.environ.get("COLUMNS", "")
    return (int(given) if given.isdigit() and int(given) > 0 else DEFAULT_COLUMNS), False


def fit_line(line: str, width: int) -> str:
    """``line`` (a progress line: ``step N/T: loss X, figure, ..., ETA h:mm:ss; saved step S``) within ``width``
    columns, what matters kept: the first figure (step and loss), the ETA and what follows the last ``; `` (the
    newest saved step). The figures between go first, from the right; the ETA next; a head still too long is cut."""
    if len(line) <= width:
        return line
    head, sep, tail = line.rpartition("; ")
    if not sep:
        head, tail = line, ""
    first, *middle = head.split(", ")
    last = [middle.pop()] if middle else []
    while True:
        shorter = ", ".join([first, *middle, *last]) + sep + tail
        if len(shorter) <= width or not (middle or last):
            break
        (middle or last).pop()
    if len(shorter) <= width:
        return shorter
    room = width - len(sep + tail) - 1
    return first[:room] + "\u2026" + sep + tail if room > 0 else line[:width]


class TerminalProgress:
    """The training bar and, under it, the run's progress line, both redrawn in place on a terminal (``file``, default
    stdout): the notebooks' view for ``tpu-pretrain train``. Log records are printed above them meanwhile
    (tqdm's logging redirect), so neither cuts into the other. A wrapped line cannot be redrawn in place, so the line
    is fitted to the terminal's width by dropping its lesser figures (:func:`fit_line`): the step, loss, ETA and saved
    step stay (the log repeats it whole every log_every_steps, and a save has its own log line). At the end the line
    goes: the last step's log line says it once. A terminal that reports no width gets 80 columns."""

    def __init__(self, total: int, initial: int, desc: str = "training", file=None, disable: bool = False):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.file, self.disable = file or sys.stdout, disable
        columns, reported = terminal_columns(self.file)
        width = dict(dynamic_ncols=True) if reported else dict(ncols=columns - 1)
        self.bar = tqdm(total=total, initial=initial, desc=desc, bar_format=BAR_FORMAT, file=self.file,
                        mininterval=0.5, disable=disable, **width)
        # the line is fitted here, to the width of the moment; tqdm's own cut (at its width) never comes into play
        self.line = tqdm(bar_format="{desc}", desc="", file=self.file, position=1, ncols=1 << 16, leave=False,
                         disable=disable)
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
            self.line.set_description_str(fit_line(line(), terminal_columns(self.file)[0] - 1), refresh=True)
            self.shown = time.monotonic()

    def close(self) -> None:
        self._logging.close()
        self.line.close()
        self.bar.close()
