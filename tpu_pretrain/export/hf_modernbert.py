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

from ..data.vocab import Vocab
from ..errors import UserInputError
from ..models.modernbert_config import ModernBertConfig
from ..models.weight_names import read_modernbert_folder, read_weight_files, write_safetensors
from .folder import write_export_folder, write_tokenizer_files, write_tokenizer_json_files

EMBEDDINGS = "model.embeddings.tok_embeddings.weight"
DECODER = "decoder.weight"
__all__ = ["export_weights", "read_modernbert_folder", "read_weight_files", "write_modernbert_folder"]


def export_weights(model_or_weights, config: ModernBertConfig) -> dict[str, np.ndarray]:
    """The weights to write, by transformers' names and layout: a tied ``decoder.weight`` left out (transformers
    ties it again on loading, as after its own ``save_pretrained``), refused if it is not the embeddings."""
    if isinstance(model_or_weights, dict):
        weights = {name: np.asarray(value, np.float32) for name, value in model_or_weights.items()}
    else:
        from ..jax_backend.families import stored_weights

        weights = stored_weights(model_or_weights)
    if config.tie_word_embeddings and DECODER in weights:
        decoder = weights.pop(DECODER)
        if EMBEDDINGS in weights and not np.array_equal(decoder, weights[EMBEDDINGS]):
            raise UserInputError(f"{DECODER} differs from {EMBEDDINGS} but the config ties them "
                                 "(tie_word_embeddings): export with tie_word_embeddings false.")
    if EMBEDDINGS not in weights:
        raise UserInputError(f"no {EMBEDDINGS} among the weights to export: these are not ModernBERT's.")
    return weights


def write_modernbert_folder(model_or_weights, config: ModernBertConfig, folder: str | os.PathLike,
                            tokenizer_files=(), vocab_file: str | None = None, do_lower_case: bool = True) -> Path:
    """``config.json`` (:meth:`ModernBertConfig.to_hf_dict`) + ``model.safetensors`` (float32) + copies of
    ``tokenizer_files`` (``tokenizer.json``, ``tokenizer_config.json``... under their own names) in ``folder``;
    or, given a WordPiece ``vocab_file`` (a run's), the BERT-style tokenizer files of that vocab, which
    ``AutoTokenizer`` loads with the config's special token ids (and no token types: ModernBERT has none); given a
    tokenizer.json, that file with its ``tokenizer_config.json`` (:func:`.folder.write_tokenizer_json_files`).

    ``model_or_weights``: a built :class:`..jax_backend.modernbert.PretrainingModernBert` or a dict of arrays by
    transformers' names and layout. Written into a temporary sibling and swapped in; only a new or empty folder
    or an earlier export's is replaced (:func:`.folder.write_export_folder`).
    """
    weights = export_weights(model_or_weights, config)
    sources = [Path(f) for f in tokenizer_files]
    for path in sources:
        if not path.is_file():
            raise UserInputError(f"tokenizer file {path} does not exist.")

    def write(tmp: Path) -> None:
        write_safetensors(tmp / "model.safetensors", weights, {"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
        for path in sources:
            shutil.copyfile(path, tmp / path.name)
        if vocab_file and Vocab.read(vocab_file).is_tokenizer_json:
            write_tokenizer_json_files(tmp, vocab_file, config.max_position_embeddings)
        elif vocab_file:
            write_tokenizer_files(tmp, vocab_file, do_lower_case, config.max_position_embeddings,
                                  model_input_names=["input_ids", "attention_mask"])

    return write_export_folder(folder, write, "hf-modernbert")
