"""The shape of a BERT (Google's ``bert_config.json``), and how a run picks it.

Pure Python (no TensorFlow): the run folder, the exports and any backend read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import UserInputError
from ..storage.local import write_text_atomic

# Google's BERT miniatures (github.com/google-research/bert) plus base and large: (layers, hidden).
NAMED_SIZES: dict[str, tuple[int, int]] = {
    f"L{layers}-H{hidden}": (layers, hidden)
    for layers in (2, 4, 6, 8, 10, 12)
    for hidden in (128, 256, 512, 768)
}
NAMED_SIZES["L24-H1024"] = (24, 1024)
SIZE_ALIASES = {"tiny": "L2-H128", "mini": "L4-H256", "small": "L4-H512", "medium": "L8-H512",
                "base": "L12-H768", "large": "L24-H1024"}
# The feed-forward activations a BERT is built with from a size, by Hugging Face's names: ``gelu`` the exact (erf)
# GELU, ``gelu_new`` its tanh approximation (Google's BERT repository's, GPT-2's). Either backend builds both.
BERT_ACTIVATIONS = ("gelu", "gelu_new")
# transformers' three names for the tanh GELU, one function (a config file or checkpoint may name any of them)
TANH_GELU_NAMES = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")


def read_config_json(path: str | os.PathLike, what: str) -> dict:
    """A model config file's JSON object, or a :class:`UserInputError` naming ``what`` and the file."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{what} {path} does not exist.")
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{what} {path} is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise UserInputError(f"{what} {path} is not a JSON object.")
    return values


@dataclass
class BertConfig:
    """The fields of Google's ``bert_config.json`` (also read from a Hugging Face ``config.json``)."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    @classmethod
    def from_dict(cls, values: dict) -> BertConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> BertConfig:
        values = read_config_json(path, "bert_config_file")
        if "vocab_size" not in values:
            raise UserInputError(f"bert_config_file {path} has no vocab_size; is it a BERT config?")
        return cls.from_dict(values)

    def check_sequence_length(self, max_seq_length: int) -> None:
        """Refuse shapes no backend can build: heads that do not split the width, sequences beyond the positions."""
        if self.hidden_size % self.num_attention_heads:
            raise UserInputError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                                 f"{self.num_attention_heads}.")
        if max_seq_length > self.max_position_embeddings:
            raise UserInputError(f"max_seq_length {max_seq_length} is above the model's max_position_embeddings "
                                 f"{self.max_position_embeddings}.")

    def to_json_file(self, path: str | os.PathLike) -> None:
        write_text_atomic(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")


def named_shape(model_size: str) -> tuple[int, int, int, int]:
    """A named size (``L4-H256``, ``base``...) as (layers, hidden, intermediate, heads): 64-wide heads, 4x FFN, as
    Google's. Its own function, as the run compares a size with the shape a file gave without building one."""
    name = SIZE_ALIASES.get(model_size.lower(), model_size.upper())
    if name not in NAMED_SIZES:
        raise UserInputError(
            f"model_size {model_size!r} is unknown; use one of {', '.join(NAMED_SIZES)} or "
            f"{', '.join(SIZE_ALIASES)}, or give bert_config_file."
        )
    layers, hidden = NAMED_SIZES[name]
    return layers, hidden, 4 * hidden, hidden // 64


def bert_config_for_size(model_size: str, vocab_size: int, max_position_embeddings: int = 512,
                         hidden_act: str = "gelu") -> BertConfig:
    """A named size (:func:`named_shape`) as a BertConfig."""
    layers, hidden, inner, heads = named_shape(model_size)
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=inner, hidden_act=hidden_act,
                      max_position_embeddings=max_position_embeddings)


def checkpoint_bert_config(init_checkpoint: str) -> BertConfig | None:
    """The config shipped next to a checkpoint (Google ``bert_config.json`` or HF ``config.json``)."""
    folder = Path(init_checkpoint)
    folder = folder if folder.is_dir() else folder.parent
    for name in ("bert_config.json", "config.json"):
        if (folder / name).is_file():
            return BertConfig.from_json_file(folder / name)
    return None


def resolve_bert_config(*, model_size: str = "", bert_config_file: str = "", init_checkpoint: str = "",
                        vocab_size: int | None = None, max_position_embeddings: int = 0,
                        hidden_dropout_prob: float = -1.0, hidden_act: str = "gelu") -> BertConfig:
    """Pick the model's shape: bert_config_file, else the init checkpoint's config, else model_size (with
    ``max_position_embeddings`` positions, 0: BERT's 512, and ``hidden_act``)."""
    if bert_config_file:
        config = BertConfig.from_json_file(bert_config_file)
    elif init_checkpoint and checkpoint_bert_config(init_checkpoint):
        config = checkpoint_bert_config(init_checkpoint)
    elif model_size:
        if not vocab_size:
            raise UserInputError("model_size needs the vocab size: give vocab_file or a data_dir with a "
                                 "manifest.json.")
        config = bert_config_for_size(model_size, vocab_size, max_position_embeddings or 512, hidden_act)
    else:
        raise UserInputError("Say which model to build: --model_size (e.g. L4-H256) or --bert_config_file.")
    if vocab_size and config.vocab_size != vocab_size:
        raise UserInputError(
            f"The model's vocab_size is {config.vocab_size} but the data/vocab has {vocab_size} tokens: "
            "use the vocab.txt the model was trained with (create-data --vocab_file) or a matching config."
        )
    if hidden_dropout_prob >= 0:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = hidden_dropout_prob
    return config


def training_flops_per_sequence(config: BertConfig, seq: int, pred: int, backend: str = "jax") -> float:
    """Model FLOPs of one training sequence (multiply-add = 2; backward = 2 x forward, so 3 x forward): the work
    ``backend``'s model does.

    forward = (L - 1) * (T * (8 H^2 + 4 H I) + 4 T^2 H)   blocks: Q, K, V, O and FFN matmuls, QK^T and AV
            + T * 4 H^2 + R * (4 H^2 + 4 H I) + 4 R T H  the last block: keys and values of every position, the rest
                                                          at the R = P + 1 rows a loss reads (T if fewer;
                                                          the TensorFlow backend's: T, the whole block)
            + P * (2 H^2 + 2 H V)                         MLM head at the P masked positions (tied output)
            + 2 H^2 + 4 H                                 pooler and NSP

    The last block's other rows reach no loss: the JAX model leaves them out
    (``jax_backend.model.TransformerBlock.call_at_rows``), as every BERT leaves the MLM head's; the TensorFlow
    backend computes them (5.5% of BERT-base's FLOPs at 128 with 20 predictions), and so does Hugging Face's BERT,
    whose peer benchmark is counted as the JAX model (the work the loss needs).
    """
    layers, hidden, inner, vocab = (config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                                    config.vocab_size)
    rows = seq if backend == "tensorflow" else min(pred + 1, seq)
    forward = (layers - 1) * (seq * (8 * hidden**2 + 4 * hidden * inner) + 4 * seq**2 * hidden)
    forward += seq * 4 * hidden**2 + rows * (4 * hidden**2 + 4 * hidden * inner) + 4 * rows * seq * hidden
    forward += pred * (2 * hidden**2 + 2 * hidden * vocab) + 2 * hidden**2 + 4 * hidden
    return 3.0 * forward
