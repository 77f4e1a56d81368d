"""The JAX side of each model family (:mod:`..models.families`): how its Keras model is built, and its weights
named, stored and loaded; the one place that picks between them.

``bert``: :class:`.model.PretrainingBert`, its weights named and stored as Google's checkpoints name and store
them (Google names, Dense kernels ``[in, out]``). ``modernbert``: :class:`.modernbert.PretrainingModernBert`, its
weights named and stored as transformers' ``ModernBertForMaskedLM`` state dict has them (Linear kernels ``[out,
in]``), so a ModernBERT checkpoint's ``params/`` are a transformers folder's weights as they are. The trainer, the
inference model and the checkpoints ask a :class:`JaxFamily` for the model, the names and the layout, and load
weights through :meth:`JaxFamily.assign`, the one loop that checks their shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import UserInputError
from ..models import families
from ..models.run_weights import jax_checkpoint_folder, read_weights
from ..models.weight_names import read_checkpoint_weights, read_modernbert_folder
from . import modernbert
from .model import build_model, from_google, google_variables, to_google


def _no_check(weights, values, variables, source) -> None:
    """Most families' loaded weights need no check beyond their shapes."""


@dataclass(frozen=True)
class JaxFamily:
    """How one family's Keras model is built, and its weights named, stored and read from a released checkpoint."""

    family: families.ModelFamily
    build: Callable  # (config, max_seq_length, max_predictions_per_seq, with_nsp, dtype) -> Keras model
    variables: Callable  # model -> {stored name: keras.Variable}
    to_stored: Callable  # (name, the variable's value) -> the array as stored
    from_stored: Callable  # (name, a stored array) -> the variable's value
    read_init: Callable  # init_checkpoint path -> {stored name: array}
    check_loaded: Callable = _no_check  # (weights given, values to assign, variables, source): a family's own rule

    def stored_weights(self, model, skip=()) -> dict[str, np.ndarray]:
        """Every weight of a built model by stored name and layout (float32), but those in ``skip``."""
        return {name: np.ascontiguousarray(self.to_stored(name, np.asarray(variable.value, np.float32)))
                for name, variable in self.variables(model).items() if name not in skip}

    def assign(self, variables: dict, weights: dict[str, np.ndarray], source: str,
               strict: bool = False) -> tuple[list, list]:
        """Load ``weights`` (by stored name and layout) into ``variables`` (by stored name); returns (loaded,
        missing) names. Nothing is assigned unless every given weight fits; ``strict``: none may be missing."""
        loaded = [name for name in variables if name in weights]
        missing = [name for name in variables if name not in weights]
        if not loaded:
            raise UserInputError(f"{source} holds no {self.family.title} weights that this model uses.")
        if strict and missing:
            raise UserInputError(f"{source} lacks {len(missing)} of the model's weights: {', '.join(missing[:3])}")
        values = {}
        for name in loaded:
            values[name] = np.asarray(self.from_stored(name, np.asarray(weights[name], np.float32)), np.float32)
            if tuple(values[name].shape) != tuple(variables[name].shape):
                stored = tuple(self.to_stored(name, np.empty(variables[name].shape, np.float32)).shape)
                raise UserInputError(f"{source}: {name} has shape {tuple(np.shape(weights[name]))} but the model "
                                     f"needs {stored}; build the model from the checkpoint's config.")
        self.check_loaded(weights, values, variables, source)
        for name, value in values.items():
            variables[name].assign(value)
        return loaded, missing


def _read_modernbert_init(path: str) -> dict[str, np.ndarray]:
    """A ModernBERT's weights by transformers' names: a transformers folder, or a ModernBERT run's checkpoint."""
    folder = jax_checkpoint_folder(path)
    if folder is not None:
        return read_weights(folder)
    return read_modernbert_folder(path)[1]


def _build_modernbert(config, max_seq_length, max_predictions_per_seq, with_nsp=False, dtype=None):
    return modernbert.build_modernbert(config, max_seq_length, max_predictions_per_seq, dtype=dtype)


JAX_FAMILIES = {
    families.BERT.name: JaxFamily(families.BERT, build_model, google_variables, to_google, from_google,
                                  read_checkpoint_weights),
    families.MODERNBERT.name: JaxFamily(families.MODERNBERT, _build_modernbert, modernbert.hf_variables,
                                        modernbert.to_hf, modernbert.to_hf, _read_modernbert_init,
                                        modernbert.check_tied_decoder),
}


def jax_family(config) -> JaxFamily:
    """The JAX side of a model config's family."""
    return JAX_FAMILIES[families.family_of(config).name]


def stored_weights(model, skip=()) -> dict[str, np.ndarray]:
    """A built model's weights by its family's stored names and layout."""
    return jax_family(model.config).stored_weights(model, skip)


def assign_stored_weights(model, weights: dict[str, np.ndarray], source: str) -> tuple[list, list]:
    """Load weights by stored name into a built model; returns (loaded, missing) names."""
    family = jax_family(model.config)
    return family.assign(family.variables(model), weights, source)
