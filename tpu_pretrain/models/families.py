"""The model families a run can train, one record each: the one place that names them.

A family's record says what every stage needs to know of it without building a model: the ``model_family``
setting's value, its shape's config class, how a run's settings and vocab resolve that shape (one signature for
every family: :class:`.shape_request.ShapeRequest`) and the run folder's file for it, its FLOPs formula, whether it
has a next-sentence head, which backends train it, and how its stored weights are named. A run resolves its family once
(:attr:`..core.resolve.RunPlan.family`); a backend adds its own builders by the family's name
(:mod:`..jax_backend.families`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import UserInputError
from . import bert_config, modernbert_config, shape_request


@dataclass(frozen=True)
class ModelFamily:
    name: str  # the model_family setting's value
    title: str  # in messages: BERT, ModernBERT
    config_class: type  # its shape: BertConfig, ModernBertConfig
    shape_file: str  # the run folder's file holding that shape
    has_nsp: bool  # whether it can train next-sentence prediction
    stored_names: str  # whose names and layout its weights are stored under, in checkpoints and exports
    training_flops: Callable  # (model config, max_seq_length, max_predictions_per_seq, backend) -> one sequence's FLOPs
    backends: tuple[str, ...]  # the training backends that build it (backend.py's names)
    model_type: str  # what a transformers config.json of this family says it is
    resolve_shape: Callable  # (ShapeRequest) -> its shape, with the family's own checks of the settings and vocab
    named_shape: Callable  # (model_size) -> that size's (layers, hidden, intermediate, heads); unknown: refused

    def __str__(self) -> str:
        return self.name


BERT = ModelFamily("bert", "BERT", bert_config.BertConfig, "bert_config.json", True, "Google's checkpoint names",
                   bert_config.training_flops_per_sequence, ("tensorflow", "jax"), "bert", shape_request.bert_shape,
                   bert_config.named_shape)
MODERNBERT = ModelFamily("modernbert", "ModernBERT", modernbert_config.ModernBertConfig, "modernbert_config.json",
                         False, "transformers' ModernBertForMaskedLM state-dict names",
                         modernbert_config.training_flops_per_sequence, ("jax",), "modernbert",
                         shape_request.modernbert_shape, modernbert_config.named_shape)
FAMILIES = {family.name: family for family in (BERT, MODERNBERT)}


def family_named(name: str) -> ModelFamily:
    """The family a ``model_family`` value names (empty: BERT, what runs recorded before the setting existed)."""
    if not name:
        return BERT
    if name not in FAMILIES:
        raise UserInputError(f"model_family {name!r} is not one of {', '.join(FAMILIES)}.")
    return FAMILIES[name]


def family_of(model_config) -> ModelFamily:
    """The family of a model shape, by its config class."""
    for family in FAMILIES.values():
        if isinstance(model_config, family.config_class):
            return family
    raise TypeError(f"{type(model_config).__name__} is the shape of no model family")
