"""Whether a run keeps the documents of its packed rows apart (``document_masks``): one of the resolver's decisions
(:mod:`.resolve`), from the setting, the backend, the data and the run already started in the folder."""

from __future__ import annotations

import logging

from ..errors import UserInputError
from ..models.families import MODERNBERT, family_named
from .checkpoints import list_checkpoints
from .run_folder import SETTINGS_BEFORE_THEY_EXISTED, RunFolder

log = logging.getLogger(__name__)


def decide_document_masks(config, data, backend: str | None) -> str:
    """``on`` or ``off`` for the run: ``auto`` decided (:func:`document_masks_wanted`), a resumed run's choice kept,
    sentence-pair data with ``on`` refused with the NSP head and said once without it. The TensorFlow backend keeps
    no documents apart (``on`` is refused by its table of what it offers: :mod:`..backend`)."""
    if backend == "tensorflow":
        return "off"
    output_dir = config.storage.output_dir
    recorded = RunFolder(output_dir).recorded_settings() if output_dir and "://" not in output_dir else None
    pairs = not data.settings.get("no_nsp", config.data.no_nsp)
    trained = trained_masks(config, recorded)
    wanted = document_masks_wanted(config, recorded, pairs) if trained is None else trained == "on"
    if wanted and not config.data.no_nsp:
        raise UserInputError("document_masks on needs packed data without next-sentence pairs (create-data --recipe "
                             "modern): in NSP pairs the [SEP] separates two halves that must see each other. Set "
                             "--document_masks off.")
    if wanted and pairs:
        log.warning("document_masks on with sentence-pair data (%s was made with next-sentence pairs): each pair's "
                    "[SEP] now ends a document, so its two segments never see each other. For packed documents "
                    "make the data with `create-data --recipe modern`; to keep the pairs whole, set "
                    "--document_masks off.", data.data_dir or "the data")
    if config.train.document_masks == "auto":
        log.info("document_masks=%s: %s (set --document_masks to choose).", "on" if wanted else "off",
                 _why(config, recorded, pairs, trained))
    return "on" if wanted else "off"


def _why(config, recorded: dict | None, pairs: bool, trained: str | None) -> str:
    """Why ``auto`` decided as it did, in the words of :func:`document_masks_wanted`."""
    if trained is not None:
        return "as this run trained so far (its config.json)"
    if recorded is not None and "document_masks" not in recorded.get("train", {}):
        return "this run started before the setting existed, without them"
    if pairs or not config.data.no_nsp:
        return "sentence-pair data, whose [SEP] joins two halves that see each other"
    if family_named(config.model.model_family) is MODERNBERT or config.data.recipe == "modern":
        return "packed documents (the modern recipe, ModernBERT) attend within their own document"
    return "no packed documents to keep apart"


def document_masks_wanted(config, recorded: dict | None, pairs: bool = False) -> bool:
    """``on``/``off`` as said; ``auto``: off for a run already started without the setting (``recorded``: its
    config.json, for continuity), off for sentence-pair (NSP) data (``pairs``: the data's, whatever the recipe), else
    on for ModernBERT and for the modern recipe."""
    setting = config.train.document_masks
    if setting != "auto":
        return setting == "on"
    if recorded is not None and "document_masks" not in recorded.get("train", {}):
        return SETTINGS_BEFORE_THEY_EXISTED["document_masks"] == "on"
    if pairs or not config.data.no_nsp:
        return False
    return family_named(config.model.model_family) is MODERNBERT or config.data.recipe == "modern"


def trained_masks(config, recorded: dict | None) -> str | None:
    """``on``/``off`` as a run with checkpoints trained them (its config.json), which ``auto`` continues; None for a
    new run. Switching them on resume is refused: the steps left would train another model than the steps done."""
    before = (recorded or {}).get("train", {}).get("document_masks")
    output_dir = config.storage.output_dir
    if before not in ("on", "off") or not list_checkpoints(RunFolder(output_dir).checkpoints):
        return None
    setting = config.train.document_masks
    if setting not in ("auto", before):
        raise UserInputError(
            f"The run in {output_dir} trained with document_masks {before} (its config.json), and resuming it with "
            f"--document_masks {setting} would train its remaining steps another way. Continue it with "
            f"--document_masks {before} (or leave the setting unset), or start the run anew in a new output_dir.")
    return before
