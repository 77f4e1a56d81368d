"""ModernBERT as a transformers folder, both ways: ``config.json`` + ``model.safetensors`` written so that
``AutoModelForMaskedLM.from_pretrained`` loads ``ModernBertForMaskedLM`` with no missing or unexpected weights, and a
transformers ModernBERT folder read back (config and weights by transformers' names) for continued pretraining.

NumPy alone at import time: the weights of a built JAX model are asked of :mod:`..jax_backend.modernbert` only when
a model (not a dict of weights) is given.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..core.modernbert_config import ModernBertConfig
from ..core.weight_names import read_hf_folder, read_safetensors, write_safetensors
from ..errors import UserInputError
from ..storage.local import new_temp_folder
from .writers import EXPORT_RECORD, check_export_destination

EMBEDDINGS = "model.embeddings.tok_embeddings.weight"
DECODER = "decoder.weight"
SHARD_INDEX = "model.safetensors.index.json"


def export_weights(model_or_weights, config: ModernBertConfig) -> dict[str, np.ndarray]:
    """The weights to write, by transformers' names and layout: a tied ``decoder.weight`` left out (transformers
    ties it again on loading, as after its own ``save_pretrained``), refused if it is not the embeddings."""
    if isinstance(model_or_weights, dict):
        weights = {name: np.asarray(value, np.float32) for name, value in model_or_weights.items()}
    else:
        from ..jax_backend.modernbert import hf_weights

        weights = hf_weights(model_or_weights)
    if config.tie_word_embeddings and DECODER in weights:
        decoder = weights.pop(DECODER)
        if EMBEDDINGS in weights and not np.array_equal(decoder, weights[EMBEDDINGS]):
            raise UserInputError(f"{DECODER} differs from {EMBEDDINGS} but the config ties them "
                                 "(tie_word_embeddings): export with tie_word_embeddings false.")
    if EMBEDDINGS not in weights:
        raise UserInputError(f"no {EMBEDDINGS} among the weights to export: these are not ModernBERT's.")
    return weights


def write_modernbert_folder(model_or_weights, config: ModernBertConfig, folder: str | os.PathLike,
                            tokenizer_files=()) -> Path:
    """``config.json`` (:meth:`ModernBertConfig.to_hf_dict`) + ``model.safetensors`` (float32) + copies of
    ``tokenizer_files`` (``tokenizer.json``, ``tokenizer_config.json``... under their own names) in ``folder``.

    ``model_or_weights``: a built :class:`..jax_backend.modernbert.PretrainingModernBert` or a dict of arrays by
    transformers' names and layout. Written into a temporary sibling and swapped in; only a new or empty folder
    or an earlier export's is replaced (as :mod:`.writers` does).
    """
    weights = export_weights(model_or_weights, config)
    sources = [Path(f) for f in tokenizer_files]
    for path in sources:
        if not path.is_file():
            raise UserInputError(f"tokenizer file {path} does not exist.")
    out = check_export_destination(folder)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temp_folder(out)
    try:
        write_safetensors(tmp / "model.safetensors", weights, {"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
        for path in sources:
            shutil.copyfile(path, tmp / path.name)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        (tmp / EXPORT_RECORD).write_text(json.dumps({"format": "hf-modernbert", "files": files}, indent=2) + "\n")
        if out.exists():
            old = new_temp_folder(out)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_weight_files(folder: Path) -> dict[str, np.ndarray]:
    """A transformers folder's weights: ``model.safetensors``, its shards (``model.safetensors.index.json``) or
    ``pytorch_model.bin`` (which needs torch), as float32 arrays by name."""
    if (folder / SHARD_INDEX).is_file():
        shards = sorted(set(json.loads((folder / SHARD_INDEX).read_text())["weight_map"].values()))
        weights = {}
        for shard in shards:
            weights.update(read_safetensors(folder / shard))
        return weights
    if not (folder / "model.safetensors").is_file() and not (folder / "pytorch_model.bin").is_file():
        raise UserInputError(f"{folder} holds no model.safetensors (nor pytorch_model.bin): no weights to read.")
    return read_hf_folder(folder)


def read_modernbert_folder(folder: str | os.PathLike) -> tuple[ModernBertConfig, dict[str, np.ndarray]]:
    """The config and weights (transformers' names and layout, float32) of a transformers ModernBERT folder:
    ``ModernBertForMaskedLM``'s, or an encoder's (``ModernBertModel``: its names get the ``model.`` prefix and
    the head is missing). Load them with :func:`..jax_backend.modernbert.assign_hf_weights`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"{folder} is not a folder: give a transformers ModernBERT folder (config.json and "
                             "model.safetensors).")
    config = ModernBertConfig.from_json_file(folder / "config.json")
    weights = read_weight_files(folder)
    if EMBEDDINGS not in weights and "embeddings.tok_embeddings.weight" in weights:
        weights = {f"model.{name}": value for name, value in weights.items()}
    if EMBEDDINGS not in weights:
        raise UserInputError(f"{folder}'s weights have no {EMBEDDINGS}: they are not a ModernBERT's.")
    return config, weights
