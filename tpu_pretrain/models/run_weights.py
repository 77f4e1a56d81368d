"""A checkpoint's weights by Google BERT name (a ModernBERT run's: by transformers' name), read with NumPy alone
wherever the format allows.

Evaluation, probing and export ask here for "the weights of this checkpoint", whichever backend wrote
it. The JAX backend keeps a checkpoint's state in one ``state.npz`` whose layout is defined here:
``params/<Google name>`` (the weights, stored as Google does; a ModernBERT run's under transformers' state-dict
names, stored as transformers does: :mod:`..jax_backend.families`), ``m/`` and ``v/<Google name>`` (the
optimizer's moments), ``keras/<variable path>`` (dropout's seed state), ``step``, and with float16 compute
``loss_scale/scale`` and ``loss_scale/good_steps`` (the dynamic loss scale and the finite steps since it last
changed);
:mod:`..jax_backend.state` writes and restores it. Released weights (a Hugging Face folder, a Google
checkpoint) are read through :mod:`.weight_names`. The TensorFlow backend's checkpoints are
``tf.train.Checkpoint`` object graphs whose variables are named by the bert4keras model's object paths:
only that model maps them to Google's names, so :func:`read_google_weights` returns None for them and the
caller takes the TensorFlow path (:func:`is_object_checkpoint` tells them apart without TensorFlow).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UserInputError
from .tf_bundle import find_bundle_prefix, list_tensors
from .weight_names import HF_WEIGHT_FILES, read_checkpoint_weights

STATE_FILE = "state.npz"
PARAMS = "params/"
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"  # what every tf.train.Checkpoint (object-based) holds
JAX, TENSORFLOW = "jax", "tensorflow"  # the backends, as config.json's train.backend names them


def is_jax_checkpoint(folder: str | os.PathLike) -> bool:
    return (Path(folder) / STATE_FILE).is_file()


def jax_checkpoint_folder(path: str | os.PathLike) -> Path | None:
    """The JAX checkpoint folder ``path`` names (the folder, or the ``state`` prefix inside it), or None."""
    p = Path(path)
    return next((f for f in (p, p.parent) if is_jax_checkpoint(f)), None)


def read_arrays(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of a JAX checkpoint's ``state.npz``, by its stored name."""
    with np.load(Path(folder) / STATE_FILE, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def read_weights(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """The model's weights in a JAX checkpoint folder, by Google BERT name, as float32."""
    with np.load(Path(folder) / STATE_FILE, allow_pickle=False) as data:
        return {name[len(PARAMS):]: data[name].astype(np.float32) for name in data.files if name.startswith(PARAMS)}


def is_object_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TensorFlow training checkpoint (object-based: names need the bert4keras model)."""
    if jax_checkpoint_folder(path) is not None or is_huggingface_folder(path):
        return False
    prefix = find_bundle_prefix(path)
    return prefix is not None and OBJECT_GRAPH_KEY in list_tensors(prefix)


def is_huggingface_folder(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / name).is_file() for name in HF_WEIGHT_FILES)


def checkpoint_format(path: str | os.PathLike) -> str | None:
    """Which backend's training checkpoint ``path`` is (``jax``, ``tensorflow``), or None for released weights."""
    if jax_checkpoint_folder(path) is not None:
        return JAX
    return TENSORFLOW if is_object_checkpoint(path) else None


def read_google_weights(path: str | os.PathLike) -> dict[str, np.ndarray] | None:
    """Every weight at ``path`` by Google name: a JAX checkpoint, a Hugging Face folder or a Google checkpoint.

    None for a TensorFlow training checkpoint, whose names only the TensorFlow model can map.
    """
    folder = jax_checkpoint_folder(path)
    if folder is not None:
        return read_weights(folder)
    if is_huggingface_folder(path):
        return read_checkpoint_weights(str(path))
    prefix = find_bundle_prefix(path)
    if prefix is None:
        raise UserInputError(f"{path} holds no weights: give a run's checkpoint folder, a Google checkpoint "
                             "(bert_model.ckpt with its .index and .data files) or a Hugging Face folder.")
    return None if OBJECT_GRAPH_KEY in list_tensors(prefix) else read_checkpoint_weights(prefix)


def has_nsp_weights(names) -> bool:
    """Whether weights (by Google name) hold the pooler or the NSP head: a model built from them gets the branch."""
    return any(name.startswith(("bert/pooler/", "cls/seq_relationship/")) for name in names)
