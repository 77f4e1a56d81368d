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
import os

from .. import storage
from ..errors import UserInputError
from ..models.families import BERT, FAMILIES
from .run_folder import CONFIG, IDENTITY, RunFolder, describe_run, identity_differences, same_run

log = logging.getLogger(__name__)


class UnreadableIdentity(UserInputError):
    """A durable copy's run.json that is there but cannot be read: refused at a start, said by a failing pass."""


def recorded_identity(url: str, run: RunFolder | None = None) -> dict | None:
    """The run.json of the run whose checkpoints the copy at ``url`` holds, or None when it names none; one that
    cannot be read (cut short, edited) is refused in a line, with the fix (``run``: the run folder that has its own)."""
    path = storage.join(url, IDENTITY)
    if not storage.exists(path):
        return None
    try:
        record = json.loads(storage.read_text(path))
    except ValueError:  # not JSON, or not text
        record = None
    if isinstance(record, dict) and isinstance(record.get("settings"), dict):
        return record
    own = f"copy {run.identity_file} over it" if run is not None and run.identity_file.is_file() else \
        f"copy that run folder's own {IDENTITY} over it"
    raise UnreadableIdentity(f"The durable copy's {IDENTITY} at {path} is unreadable (not the record a run writes "
                             "there: cut short or edited), so whose checkpoints the copy holds is unknown; nothing "
                             f"there was fetched, written or pruned. If the copy is this run's, {own}; otherwise give "
                             "this run a --mirror_dir of its own.")


def claim(mirror, identity: dict) -> None:
    """At a start, before anything is fetched from ``mirror`` (a :class:`.mirror.CheckpointMirror`): refuse a copy
    holding another run's checkpoints, and another run's own folder. A folder no run has started in continues the
    run the copy holds when its settings are that run's (a fresh runtime resuming it), and no other; a copy from
    before run ids (no run.json) is compared by the settings and model shape it keeps."""
    try:
        theirs = recorded_identity(mirror.url, mirror.run)
        unknown = theirs is None and bool(mirror.complete_steps())
        their_dir = _their_output_dir(mirror.url)
    except UnreadableIdentity:
        raise
    except Exception as exc:  # unreachable now: each pass checks again before it writes or prunes
        log.warning("Cannot read the durable copy at %s to check whose checkpoints it holds: %s", mirror.url, exc)
        return
    if their_dir and _same_place(their_dir, mirror.url):
        raise UserInputError(
            f"--mirror_dir {mirror.url} is the output_dir of a run (its {CONFIG} names that folder as its own), not "
            "a durable copy: a run never writes into another run's folder, nothing was fetched or changed there. Give "
            "this run a --mirror_dir of its own (a new folder), or, to continue that run, train with --output_dir "
            f"{mirror.url}.")
    ours = mirror.run.read_identity()
    if theirs is None and not unknown:
        return
    if theirs is not None and ours is not None and same_run(ours, theirs):
        return
    older = _identity_before_run_ids(mirror.url, identity) if theirs is None else None
    compared = theirs if theirs is not None else older
    differences = identity_differences(compared, identity) if compared is not None else [f"no {IDENTITY} there"]
    if ours is None and not differences:
        if theirs is None:
            log.info("Continuing the run of the durable copy at %s (from before run ids: its %s and model shape are "
                     "this run's settings); its %s now names this run.", mirror.url, CONFIG, IDENTITY)
            return
        mirror.run.adopt_identity(theirs)
        log.info("Continuing %s from its durable copy at %s.", describe_run(theirs), mirror.url)
        return
    raise UserInputError(_another_run(mirror, theirs, ours, differences))


def _their_output_dir(url: str) -> str | None:
    try:
        return json.loads(storage.read_text(storage.join(url, CONFIG)))["storage"]["output_dir"] or None
    except Exception:  # noqa: BLE001 - no readable config.json there: nothing to tell by it
        return None


def _same_place(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _identity_before_run_ids(url: str, identity: dict) -> dict | None:
    """The run.json a copy written before run ids would have had, from its config.json and model shape (the data's
    facts, which it never recorded, taken as this run's); None where those cannot be read."""
    try:
        sections = json.loads(storage.read_text(storage.join(url, CONFIG)))
        family = FAMILIES.get(sections.get("model", {}).get("model_family") or BERT.name, BERT)
        model = json.loads(storage.read_text(storage.join(url, family.shape_file)))
    except Exception:  # noqa: BLE001 - an unreadable copy is refused as one naming no run
        return None
    flat = {k: v for section in sections.values() if isinstance(section, dict) for k, v in section.items()}
    settings = {k: flat[k] for k in identity["settings"] if k in flat}
    return {"settings": settings, "model": model, "data": identity["data"]}


def _another_run(mirror, theirs: dict | None, ours: dict | None, differences: list[str]) -> str:
    their_dir = _their_output_dir(mirror.url) or "its own output_dir"
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
    ours, theirs = run.read_identity(), recorded_identity(url, run)
    if ours is None:
        return
    if theirs is None:
        storage.write_text(storage.join(url, IDENTITY), run.identity_file.read_text())
    elif not same_run(ours, theirs):
        raise RuntimeError(f"it holds the checkpoints of another run ({describe_run(theirs)}, not this "
                           f"{describe_run(ours)}): nothing of it is copied over or pruned")


def check_fetch_target(url: str, run: RunFolder) -> None:
    """Refuse to fetch the run at ``url`` into a folder holding another run: the two would be mixed."""
    ours, theirs = run.read_identity(), recorded_identity(url, run)
    if ours is not None and (theirs is None or not same_run(ours, theirs)):
        raise UserInputError(f"{run.path} holds another run than the one at {url} ({describe_run(ours)}): fetching "
                             "would mix the two. Fetch into an empty folder.")
