"""BLiMP's figures: the model's accuracy beside random inits of its shape, the summary evaluate prints, blimp.json.

A random init is not a coin. Its preferences are systematic (one word of a pair scored higher whichever sentence
holds it), and a phenomenon's pairs share their words, so its accuracy strays from 0.5 far more than a coin's
interval on as many pairs says: two seeds of the demo's shape gave 0.478 and 0.525 on all 67,000 pairs, where a
coin's 95% interval is 0.5 +- 0.004. So the model is scored beside N random initialisations of its shape
(:func:`.rebuild.untrained_copy`, seeds 0 to N-1) on the same pairs (:mod:`.blimp` scores them); their mean,
standard deviation and range, overall, per field and per phenomenon, and whether the model's accuracy lies outside
that range (docs/blimp.md).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import UserInputError
from ..storage.local import disk_full_said, write_text_atomic
from .blimp import (
    BATCH_ROWS,
    HUB_SOURCE,
    Encoded,
    Pair,
    ScoringProgress,
    encode,
    field_of,
    right_answers,
    tally,
    ties,
    uid_of,
)
from .rebuild import TrainedModel, untrained_copy

log = logging.getLogger(__name__)


# -- the evaluation ------------------------------------------------------------------------------------------
@dataclass
class BlimpResult:
    """Accuracy per phenomenon (UID), per field and overall, which weights they describe, and the random inits of
    the same shape beside them (``random_inits``: :func:`random_init_spread`'s figures)."""

    weights: str
    step: int | None
    source: str
    pairs: int
    correct: int
    accuracy: float
    ties: int  # pairs whose two sentences tokenize alike (wrong: the model cannot prefer either)
    unk_share: float
    skipped: int
    by_phenomenon: dict = field(default_factory=dict)
    by_field: dict = field(default_factory=dict)
    random_inits: dict | None = None
    seconds: float = 0.0
    path: str | None = None

    def summary(self, phenomena: bool = True) -> str:
        """What evaluate prints: overall, beside the random inits where scored, then per field and phenomenon."""
        where = f"step {self.step}" if self.step is not None else self.weights
        lines = [f"BLiMP ({self.source}) of {where}: {self.accuracy:.4f} of {self.pairs} pairs right "
                 f"({self.ties} pairs the vocab cannot tell apart counted wrong; [UNK] {self.unk_share:.1%} of tokens"
                 + (f"; {self.skipped} pairs too long skipped" if self.skipped else "") + ")",
                 "  " + verdict(self.accuracy, self.random_inits)]
        lines += [f"  {name:<18} {v['accuracy']:.4f} ({v['pairs']} pairs)"
                  + group_range(self.random_inits, "by_field", name) for name, v in self.by_field.items()]
        if phenomena:
            lines += [f"    {uid:<58} {v['accuracy']:.4f} ({v['pairs']})"
                      + group_range(self.random_inits, "by_phenomenon", uid) for uid, v in self.by_phenomenon.items()]
        if self.path:
            lines.append(f"  written to {self.path}")
        return "\n".join(lines)


def evaluate_blimp(trained: TrainedModel, pairs: list[Pair], source: str = HUB_SOURCE,
                   output: str | os.PathLike | None = None, batch_rows: int = BATCH_ROWS, random_inits: int = 0,
                   terminal: bool | None = None) -> BlimpResult:
    """Score every pair with the trained model, and with ``random_inits`` random initialisations of its shape
    (seeds 0, 1, ...) for their spread; write ``output`` (a JSON file) when given. ``terminal``: draw a bar (default:
    when stderr is one)."""
    started = time.perf_counter()
    check_random_inits(random_inits)
    encoded = encode(trained, pairs)
    progress = ScoringProgress(encoded.rows * (1 + random_inits), "BLiMP, the model", terminal)
    log.info("BLiMP: %d pairs, %s masked copies for the model%s.", len(encoded.pairs), f"{encoded.rows:,}",
             f" and as many for each of {random_inits} random inits" if random_inits else "")
    try:
        right = right_answers(trained, encoded, batch_rows, progress)
        spread = random_init_spread(trained, encoded, random_inits, float(right.mean()), batch_rows,
                                    progress) if random_inits else None
    finally:
        progress.close()
    pairs = encoded.pairs
    result = BlimpResult(trained.weights, trained.step, str(source), len(pairs), int(right.sum()),
                         float(right.mean()), int(ties(encoded).sum()), encoded.unk_share, encoded.skipped,
                         random_inits=spread)
    result.by_phenomenon = tally(pairs, right, uid_of)
    for uid, values in result.by_phenomenon.items():
        first = next(p for p in pairs if p.uid == uid)
        values.update(field=first.field, linguistics_term=first.term)
    result.by_field = tally(pairs, right, field_of)
    result.seconds = time.perf_counter() - started
    if output is not None:
        result.path = str(output)
        with disk_full_said(output):
            write_text_atomic(output, json.dumps(asdict(result), indent=2) + "\n")
    return result


# -- random inits of the same shape ------------------------------------------------------------------------
SUGGESTED = 3  # random inits the messages suggest: a range from three seeds costs three times the model's time


def check_random_inits(count: int) -> None:
    """Refuse a count that gives no spread (one seed is one point) or none at all (negative)."""
    if count < 0 or count == 1:
        raise UserInputError(f"--blimp_random_inits {count}: give the number of random initialisations of the "
                             f"model's shape to score beside it, 2 or more for a spread (e.g. {SUGGESTED}; each costs "
                             "as much time as the model), or 0 for none.")


def random_init_spread(trained: TrainedModel, encoded: Encoded, count: int, accuracy: float,
                       batch_rows: int = BATCH_ROWS, progress: ScoringProgress | None = None) -> dict:
    """Score ``count`` random initialisations of ``trained``'s shape on the pairs it was scored on: each one's
    accuracy, their mean, std and range overall, per field and per phenomenon, and where the model's ``accuracy``
    stands."""
    check_random_inits(count)
    accuracies, groups = [], {"by_field": (field_of, defaultdict(list)), "by_phenomenon": (uid_of, defaultdict(list))}
    for seed in range(count):
        if progress is not None:
            progress.describe(f"BLiMP, random init {seed + 1} of {count}")
        right = right_answers(untrained_copy(trained, seed), encoded, batch_rows, progress)
        accuracies.append(float(right.mean()))
        for key, found in groups.values():
            for name, values in tally(encoded.pairs, right, key).items():
                found[name].append(values["accuracy"])
    spread = {"seeds": list(range(count)), **statistics(accuracies)}
    spread["model_is"] = standing(accuracy, spread)
    spread.update({group: {name: statistics(values) for name, values in found.items()}
                   for group, (_, found) in groups.items()})
    return spread


def statistics(accuracies: list[float]) -> dict:
    """Each accuracy, their mean, sample standard deviation, lowest and highest."""
    values = np.asarray(accuracies, np.float64)
    return {"accuracies": [float(v) for v in values], "mean": float(values.mean()),
            "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0, "min": float(values.min()),
            "max": float(values.max())}


def standing(accuracy: float, spread: dict) -> str:
    """``above`` or ``below`` every random init, or ``within`` their range (a tie with the best is within)."""
    return "above" if accuracy > spread["max"] else "below" if accuracy < spread["min"] else "within"


def verdict(accuracy: float, spread: dict | None) -> str:
    """One line: the random inits' spread and where the model stands against it; without them, why 0.5 alone is
    no reference and the flag that measures one."""
    if spread is None:
        return (f"no reference: an untrained model lands a few points either side of 0.5 (seeds of one shape scored "
                f"0.478 and 0.525), so 0.5 is none; --blimp_random_inits {SUGGESTED} scores random inits of this "
                "shape beside it (docs/blimp.md)")
    seeds, std = len(spread["seeds"]), spread["std"]
    away = f", {(accuracy - spread['mean']) / std:+.1f} std from their mean" if std > 0 else ""
    said = (f"random init of this shape, {seeds} seeds: mean {spread['mean']:.4f}, std {std:.4f}, range "
            f"{spread['min']:.4f}-{spread['max']:.4f}. The model's {accuracy:.4f} is ")
    if spread["model_is"] == "above":
        return said + (f"OUTSIDE that spread, above the best random init by {accuracy - spread['max']:.4f}{away}: "
                       "pretraining taught it something BLiMP measures (more seeds make the range surer)")
    if spread["model_is"] == "below":
        return said + (f"OUTSIDE that spread, below the worst random init by {spread['min'] - accuracy:.4f}{away}: "
                       "it prefers the ungrammatical sentences more than an untrained model does")
    return said + (f"INSIDE that spread{away}: no sign it learnt more of what BLiMP measures than an untrained "
                   "model of its shape scores")


def group_range(spread: dict | None, group: str, name: str) -> str:
    """A field's or phenomenon's random-init range (``group``: ``by_field`` or ``by_phenomenon``), for its line of
    the summary ('' without random inits)."""
    values = (spread or {}).get(group, {}).get(name)
    return f"  random init {values['min']:.4f}-{values['max']:.4f}" if values else ""
