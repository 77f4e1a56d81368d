"""A training process's progress as a notebook cell shows it: a bar for the steps, and the run's own line in full.

The run's log line (:func:`tpu_pretrain.core.loop.progress_line`) already says everything a person needs, as the
run measured it: ``step 1200/100000: loss ..., lr ..., steps/s, sequences/s, MFU ..., ETA ...; durable step
1000``. The bar starts at the first step the process reports, so a resumed run's bar does not leap from 0, and
has no rate or ETA of its own: tqdm would count the resumed steps as done in an instant (``482103.91 step/s``).
The line is shown whole, never cut: in a notebook it is updated in place under the bar (a display handle); in
a terminal, printed as it comes. The process's other lines (:class:`StreamedLines`) go into one block of text in a
notebook, not an output each: a saved notebook (Kaggle's versions, papermill, GitHub) shows separate outputs spaced
apart, so a log printed line by line read double-spaced. ``tpu-pretrain train`` in a terminal shows the same bar and
line itself (:class:`tpu_pretrain.formatting.TerminalProgress`), the log lines scrolling above them.
"""

from __future__ import annotations

import re

from ..formatting import BAR_FORMAT

STEP_LINE = re.compile(r"^step (\d+)/(\d+)\b:?\s*")


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (Colab, Kaggle, Jupyter), where output can be updated in place."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class TrainingProgress:
    """Feed it a process's output lines: the progress lines move the bar and replace the shown line."""

    def __init__(self, desc: str = "training"):
        self.desc = desc
        self.bar = None
        self.handle = None  # the notebook's display of the newest progress line
        self.line = ""

    def feed(self, line: str) -> bool:
        """Show ``line`` if it is a progress line (True); False for any other line, which the caller prints."""
        match = STEP_LINE.match(line)
        if not match:
            return False
        step, total = int(match.group(1)), int(match.group(2))
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=step, desc=self.desc, bar_format=BAR_FORMAT)
        else:
            self.bar.total = total
            self.bar.update(step - self.bar.n)
        self.line = line.strip()
        self._show()
        return True

    def _show(self) -> None:
        if not in_notebook():
            print(self.line, flush=True)
            return
        from IPython.display import Pretty, display

        if self.handle is None:
            self.handle = display(Pretty(self.line), display_id=True)
        else:
            self.handle.update(Pretty(self.line))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class StreamedLines:
    """A process's lines: in a notebook, one block of text updated in place (a new block once ``progress`` has shown
    something after it, or past ``BLOCK_LINES``, so the order stays as it came); elsewhere printed as they come."""

    BLOCK_LINES = 200

    def __init__(self, progress: TrainingProgress | None = None):
        self.progress = progress
        self.handle = None
        self.lines: list[str] = []
        self.shown_after = None  # the progress line's display when this block began

    def add(self, line: str) -> None:
        if not in_notebook():
            print(line, flush=True)
            return
        from IPython.display import Pretty, display

        progress = self.progress.handle if self.progress is not None else None
        if self.handle is None or progress is not self.shown_after or len(self.lines) >= self.BLOCK_LINES:
            self.lines, self.shown_after = [line], progress
            self.handle = display(Pretty(line), display_id=True)
        else:
            self.lines.append(line)
            self.handle.update(Pretty("\n".join(self.lines)))
