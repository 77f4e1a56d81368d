"""Whose checkpoints a durable copy holds: a run never adopts, and never prunes, the checkpoints another run wrote.

Why: two runs given one ``mirror_dir`` (a new run pointed at an old run's Drive folder) would otherwise share it: the
new one would resume from the old one's newest checkpoint, under its own settings, and prune the old one's durable
checkpoints for good. A copy names its run by the run's ``run.json`` (with the run id :mod:`.run_folder` gives it),
written there before the first checkpoint; a start compares it before anything is fetched, and every pass of the
copy compares it again before it writes or prunes.
"""

from __future__ import annotations

import json
import logging

from .. import storage
from ..errors import UserInputError
from .run_folder import CONFIG, IDENTITY, RunFolder, describe_run, identity_differences, same_run

log = logging.getLogger(__name__)


def recorded_identity(url: str) -> dict | None:
    """The run.json of the run whose checkpoints the copy at ``url`` holds, or None when it names none."""
    path = storage.join(url, IDENTITY)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def claim(mirror, identity: dict) -> None:
    """At a start, before anything is fetched from ``mirror`` (a :class:`.mirror.CheckpointMirror`): refuse a copy
    holding another run's checkpoints. A folder no run has started in continues the run the copy holds when its
    settings are that run's (a fresh runtime resuming it), and no other."""
    try:
        theirs = recorded_identity(mirror.url)
        unknown = theirs is None and bool(mirror.complete_steps())
    except Exception as exc:  # unreachable now: each pass checks again before it writes or prunes
        log.warning("Cannot read the durable copy at %s to check whose checkpoints it holds: %s", mirror.url, exc)
        return
    ours = mirror.run.read_identity()
    if theirs is None and not unknown:
        return
    if theirs is not None and ours is not None and same_run(ours, theirs):
        return
    differences = identity_differences(theirs, identity) if theirs is not None else [f"no {IDENTITY} there"]
    if ours is None and not differences:
        mirror.run.adopt_identity(theirs)
        log.info("Continuing %s from its durable copy at %s.", describe_run(theirs), mirror.url)
        return
    raise UserInputError(_another_run(mirror, theirs, ours, differences))


def _another_run(mirror, theirs: dict | None, ours: dict | None, differences: list[str]) -> str:
    try:
        their_dir = json.loads(storage.read_text(storage.join(mirror.url, CONFIG)))["storage"]["output_dir"]
    except Exception:  # noqa: BLE001 - a copy without a readable config.json: say so in words
        their_dir = "its own output_dir"
    steps = mirror.complete_steps()
    which = describe_run(theirs) if theirs is not None else f"a run that left no {IDENTITY} there"
    this = describe_run(ours) if ours is not None else "a new run"
    return (f"The durable copy at {mirror.url} holds the checkpoints of another run ({which}, output_dir {their_dir}; "
            f"up to step {steps[-1] if steps else '?'}; {'; '.join(differences[:4])}), and this is {this} in "
            f"{mirror.run.path}. A run never adopts or prunes another run's checkpoints: nothing was fetched or "
            f"deleted. To continue that run, run train with --output_dir {their_dir} (its own folder, or an empty "
            f"one with its settings) and --mirror_dir {mirror.url}; to start this one, give it a --mirror_dir of its "
            "own (or none).")


def keep_claim(url: str, run: RunFolder) -> None:
    """Before a pass of the copy writes or prunes: the copy names this run (its run.json goes there first), and
    still does (another run's checkpoints are never copied over or pruned)."""
    ours, theirs = run.read_identity(), recorded_identity(url)
    if ours is None:
        return
    if theirs is None:
        storage.write_text(storage.join(url, IDENTITY), run.identity_file.read_text())
    elif not same_run(ours, theirs):
        raise RuntimeError(f"it holds the checkpoints of another run ({describe_run(theirs)}, not this "
                           f"{describe_run(ours)}): nothing of it is copied over or pruned")


def check_fetch_target(url: str, run: RunFolder) -> None:
    """Refuse to fetch the run at ``url`` into a folder holding another run: the two would be mixed."""
    ours, theirs = run.read_identity(), recorded_identity(url)
    if ours is not None and (theirs is None or not same_run(ours, theirs)):
        raise UserInputError(f"{run.path} holds another run than the one at {url} ({describe_run(ours)}): fetching "
                             "would mix the two. Fetch into an empty folder.")
