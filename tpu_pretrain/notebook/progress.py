"""A training process's progress as a notebook cell shows it: a bar for the steps, and the run's own line in full.

The run's log line (:func:`tpu_pretrain.core.loop.progress_line`) already says everything a person needs, as the
run measured it: ``step 1200/100000: loss ..., lr ..., steps/s, sequences/s, MFU ..., ETA ...; durable step
1000``. The bar starts at the first step the process reports, so a resumed run's bar does not leap from 0, and
has no rate or ETA of its own: tqdm would count the resumed steps as done in an instant (``482103.91 step/s``).
The line is shown whole, never cut: in a notebook it is updated in place under the bar (a display handle); in
a terminal, printed as it comes. ``tpu-pretrain train`` in a terminal shows the same bar and line itself
(:class:`tpu_pretrain.formatting.TerminalProgress`), the log lines scrolling above them.
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

