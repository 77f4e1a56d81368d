"""How sizes and durations read in every message, status line and progress report."""

from __future__ import annotations

import math


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
