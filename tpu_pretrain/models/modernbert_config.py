"""The shape of a ModernBERT (transformers' ``ModernBertConfig``), and its named sizes.

Pure Python (no TensorFlow, no JAX): the run folder, the exports and any backend read it. The fields are those
``ModernBertForMaskedLM`` builds from; :meth:`ModernBertConfig.to_hf_dict` writes the ``config.json`` transformers
reads back to the same architecture, and :meth:`ModernBertConfig.from_hf_dict` reads both spellings transformers
has used: ``global_attn_every_n_layers``/``global_rope_theta``/``local_rope_theta`` (the published checkpoints,
transformers 4.x) and ``layer_types``/``rope_parameters`` (transformers 5).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..errors import UserInputError
from ..storage.local import write_text_atomic
from .bert_config import read_config_json

# Published ModernBERT (answerdotai/ModernBERT-base, -large) and miniatures named as BERT's are:
# "L{layers}-H{hidden}" -> (layers, hidden, intermediate). Miniatures: 64-wide heads and base's 1.5x GeGLU width.
NAMED_SIZES: dict[str, tuple[int, int, int]] = {
    f"L{layers}-H{hidden}": (layers, hidden, hidden * 3 // 2)
    for layers in (2, 4, 6, 8, 10, 12)
    for hidden in (128, 256, 512, 768)
}
NAMED_SIZES["L22-H768"] = (22, 768, 1152)
NAMED_SIZES["L28-H1024"] = (28, 1024, 2624)
SIZE_ALIASES = {"tiny": "L2-H128", "mini": "L4-H256", "small": "L4-H512", "medium": "L8-H512",
                "base": "L22-H768", "large": "L28-H1024"}
# Activations the JAX backend builds (transformers' ACT2FN names); "gelu" is the exact (erf) GELU.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
VOCAB_MULTIPLE = 64  # a tokenizer.json's vocab is padded to this many rows, as the released ModernBERTs'
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "mask_token_id")
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer types


@dataclass(frozen=True)
class ModernBertConfig:
    """The fields of transformers' ``ModernBertConfig`` that shape ``ModernBertForMaskedLM`` (its defaults are
    ModernBERT-base's). ``mask_token_id`` is not read by transformers' model (it lives in the tokenizer); it is
    kept here for masking, and written to ``config.json`` as an extra field transformers keeps."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    local_attention: int = 128
    global_attn_every_n_layers: int = 3
    attention_bias: bool = False
    mlp_bias: bool = False
    decoder_bias: bool = True
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    tie_word_embeddings: bool = True
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0
    pad_token_id: int = 50283
    bos_token_id: int | None = 50281
    eos_token_id: int | None = 50282
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    mask_token_id: int | None = 50284

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings", "local_attention", "global_attn_every_n_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserInputError(f"ModernBertConfig.{name} must be a positive integer, not {value!r}.")
        for name in ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                     "local_rope_theta"):
            if not _number(getattr(self, name)) or getattr(self, name) <= 0:
                raise UserInputError(f"ModernBertConfig.{name} must be a positive number, not {getattr(self, name)!r}.")
        for name in ("embedding_dropout", "attention_dropout", "mlp_dropout"):
            if not _number(getattr(self, name)) or not 0 <= getattr(self, name) < 1:
                raise UserInputError(f"ModernBertConfig.{name} must be a rate in [0, 1), not {getattr(self, name)!r}.")
        for name in ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias",
                     "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise UserInputError(f"ModernBertConfig.{name} must be true or false, not {getattr(self, name)!r}.")
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                raise UserInputError(f"ModernBertConfig.{name} {getattr(self, name)!r} is not one of "
                                     f"{', '.join(ACTIVATIONS)}.")
        self._check_token_ids()
        if self.hidden_size % self.num_attention_heads:
            raise UserInputError(f"ModernBertConfig.hidden_size {self.hidden_size} is not a multiple of "
                                 f"num_attention_heads {self.num_attention_heads}.")
        if self.head_size % 2:
            raise UserInputError(f"ModernBertConfig: the head size (hidden_size / num_attention_heads) "
                                 f"{self.head_size} must be even (rotary embeddings rotate pairs of dimensions).")

    def _check_token_ids(self) -> None:
        for name in TOKEN_IDS:
            value = getattr(self, name)
            if value is None and name != "pad_token_id":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise UserInputError(f"ModernBertConfig.{name} {value!r} is not a token id of the vocab (0 to "
                                     f"{self.vocab_size - 1}); give the tokenizer's ids with vocab_size.")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def layer_is_global(self, index: int) -> bool:
        """Whether layer ``index`` attends globally (every ``global_attn_every_n_layers``-th, from layer 0)."""
        return index % self.global_attn_every_n_layers == 0

    @property
    def layer_types(self) -> list[str]:
        return [FULL if self.layer_is_global(i) else SLIDING for i in range(self.num_hidden_layers)]

    def check_sequence_length(self, max_seq_length: int) -> None:
        """Refuse sequences beyond the positions the model was shaped for."""
        if max_seq_length > self.max_position_embeddings:
            raise UserInputError(f"max_seq_length {max_seq_length} is above the model's max_position_embeddings "
                                 f"{self.max_position_embeddings}.")

    @classmethod
    def from_hf_dict(cls, values: dict, source: str = "config") -> ModernBertConfig:
        """From a transformers ``config.json`` dict (either spelling of the layer pattern and rotary bases)."""
        model_type = values.get("model_type", "modernbert")
        if model_type != "modernbert":
            raise UserInputError(f"{source} describes a {model_type!r} model, not a ModernBERT (model_type "
                                 "'modernbert').")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        for name in ("mask_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
            kwargs.setdefault(name, None)  # absent: not this model's to say (the tokenizer's)
        if values.get("rope_scaling"):
            raise UserInputError(f"{source}: rope_scaling {values['rope_scaling']!r} is not supported (plain RoPE).")
        kwargs.update(_rope_thetas(values.get("rope_parameters"), source))
        layer_types = values.get("layer_types")
        if layer_types is not None:
            layers = kwargs.get("num_hidden_layers", cls.num_hidden_layers)
            if not isinstance(layer_types, list) or len(layer_types) != layers:
                raise UserInputError(f"{source}: layer_types {layer_types!r} does not name one type for each of the "
                                     f"{layers} layers (num_hidden_layers).")
            kwargs["global_attn_every_n_layers"] = _every_n(layer_types, source)
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        """The ``config.json`` of ``ModernBertForMaskedLM``: both spellings of the layer pattern and rotary bases,
        so transformers 4.x and 5.x read it to the same architecture."""
        out = {"architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert"}
        out.update({f.name: getattr(self, f.name) for f in fields(self)})
        out["layer_types"] = self.layer_types
        out["rope_parameters"] = {FULL: {"rope_theta": self.global_rope_theta, "rope_type": "default"},
                                  SLIDING: {"rope_theta": self.local_rope_theta, "rope_type": "default"}}
        out["torch_dtype"] = "float32"
        return out

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> ModernBertConfig:
        values = read_config_json(path, "ModernBERT config")
        if "model_type" not in values:
            raise UserInputError(f"{path} has no model_type; a ModernBERT config.json says model_type 'modernbert'.")
        return cls.from_hf_dict(values, str(path))

    def to_json_file(self, path: str | os.PathLike) -> None:
        write_text_atomic(path, json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n")


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rope_thetas(parameters, source: str) -> dict:
    """``global_rope_theta``/``local_rope_theta`` from transformers 5's ``rope_parameters`` (none if absent)."""
    out = {}
    for layer_type, name in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
        entry = (parameters or {}).get(layer_type) or {}
        if entry.get("rope_type", "default") != "default":
            raise UserInputError(f"{source}: rope_parameters.{layer_type}.rope_type {entry['rope_type']!r} is not "
                                 "supported (only 'default' RoPE).")
        if "rope_theta" in entry:
            out[name] = float(entry["rope_theta"])
    return out


def _every_n(layer_types: list, source: str) -> int:
    """The ``global_attn_every_n_layers`` that gives ``layer_types`` (global at 0, n, 2n...), or an error."""
    if any(t not in (FULL, SLIDING) for t in layer_types):
        raise UserInputError(f"{source}: layer_types may name only {FULL!r} and {SLIDING!r}.")
    later = [i for i, t in enumerate(layer_types) if i and t == FULL]
    n = later[0] if later else max(len(layer_types), 1)
    if [FULL if i % n == 0 else SLIDING for i in range(len(layer_types))] != list(layer_types):
        raise UserInputError(f"{source}: layer_types {layer_types} is not one global layer every n layers from "
                             "layer 0 (the only pattern ModernBERT builds here).")
    return n


def named_shape(model_size: str) -> tuple[int, int, int, int]:
    """A named size as (layers, hidden, intermediate, heads), 64-wide heads: without building a config, whose
    default token ids need the published vocab, the run compares a size with the shape a file gave."""
    name = SIZE_ALIASES.get(model_size.lower(), model_size.upper())
    if name not in NAMED_SIZES:
        raise UserInputError(f"model_size {model_size!r} is unknown for ModernBERT; use one of "
                             f"{', '.join(NAMED_SIZES)} or {', '.join(SIZE_ALIASES)}, or give a config.json.")
    layers, hidden, inner = NAMED_SIZES[name]
    return layers, hidden, inner, hidden // 64


def modernbert_config_for_size(model_size: str, vocab_size: int | None = None,
                               max_position_embeddings: int | None = None, **overrides) -> ModernBertConfig:
    """A named size (``base``, ``large``, ``L4-H256``...) as a ModernBertConfig. ``vocab_size`` and
    ``max_position_embeddings`` default to the published 50368 and 8192; another vocab needs its token ids in
    ``overrides`` (``pad_token_id=0``...); any other field may be overridden too."""
    layers, hidden, inner, heads = named_shape(model_size)
    config = ModernBertConfig()
    shape = {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": inner,
             "num_attention_heads": heads}
    if vocab_size is not None:
        shape["vocab_size"] = vocab_size
    if max_position_embeddings is not None:
        shape["max_position_embeddings"] = max_position_embeddings
    unknown = sorted(set(overrides) - {f.name for f in fields(ModernBertConfig)})
    if unknown:
        raise UserInputError(f"ModernBertConfig has no field {', '.join(unknown)}.")
    return replace(config, **shape, **overrides)


def training_flops_per_sequence(config: ModernBertConfig, seq: int, pred: int, backend: str = "jax") -> float:
    """Model FLOPs of one training sequence, as :func:`.bert_config.training_flops_per_sequence` counts BERT's:
    fused Q, K, V and the output (8 H^2), the GeGLU MLP (``Wi`` to 2 I, ``Wo`` back: 6 H I), the attention
    products over the whole sequence (the local layers' window is masked, not skipped), the head at the masked
    positions (dense and tied decoder); backward = 2 x forward. The last layer computes its keys and values at every
    position and the rest at the R = P masked rows only (``jax_backend.modernbert.ModernBertLayer.call_at_rows``;
    T if fewer): their other rows reach no loss (ModernBERT-base at 1,024 with 30% masked: 2.4% of its FLOPs).
    ``backend``: BERT's signature (ModernBERT trains on the JAX backend only)."""
    layers, hidden, inner, vocab = (config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                                    config.vocab_size)
    rows = min(pred, seq)
    forward = (layers - 1) * (seq * (8 * hidden**2 + 6 * hidden * inner) + 4 * seq**2 * hidden)
    forward += seq * 4 * hidden**2 + rows * (4 * hidden**2 + 6 * hidden * inner) + 4 * rows * seq * hidden
    forward += pred * (2 * hidden**2 + 2 * hidden * vocab)
    return 3.0 * forward


def vocab_token_ids(tokens: list[str]) -> dict[str, int]:
    """The config's token ids from a vocab's tokens, WordPiece or a tokenizer.json's (``[PAD]``, ``[CLS]``, ``[SEP]``,
    ``[MASK]``; BOS and EOS are ``[CLS]`` and ``[SEP]``, as ModernBERT's own tokenizer has them)."""
    index = {token: i for i, token in enumerate(tokens)}
    cls, sep = index["[CLS]"], index["[SEP]"]
    return {"pad_token_id": index["[PAD]"], "cls_token_id": cls, "sep_token_id": sep, "mask_token_id": index["[MASK]"],
            "bos_token_id": cls, "eos_token_id": sep}


def checkpoint_modernbert_config(init_checkpoint: str) -> ModernBertConfig | None:
    """The config of a ModernBERT given as init_checkpoint: a transformers folder's ``config.json``, or a ModernBERT
    run's ``modernbert_config.json`` for one of its checkpoints (``RUN/checkpoints/ckpt-N``); None without one."""
    if not init_checkpoint:
        return None
    folder = Path(init_checkpoint)
    for path in (folder / "config.json", folder.parent.parent / "modernbert_config.json"):
        if path.is_file() and (path.name == "config.json" or folder.parent.name == "checkpoints"):
            return ModernBertConfig.from_json_file(path)
    return None


def resolve_modernbert_config(*, model_size: str = "", config_file: str = "", init_checkpoint: str = "",
                              vocab_size: int | None = None, token_ids: dict[str, int] | None = None,
                              max_position_embeddings: int = 0, dropout: float = -1.0,
                              padded_vocab: bool = False) -> ModernBertConfig:
    """Pick a ModernBERT's shape: ``config_file`` (a transformers config.json), else the init checkpoint's, else
    ``model_size`` (``max_position_embeddings`` positions; 0: the released 8,192); checked against the data's
    vocab (its size and, ``token_ids``, its special tokens: ids the config leaves out are taken from the vocab).
    ``dropout`` >= 0 sets the embedding, attention and MLP dropout.
    ``padded_vocab`` (a tokenizer.json's vocab): the model's vocab may be larger than the tokenizer's, as released
    ModernBERTs pad theirs to a multiple of 64 (50368 rows for 50285 tokens); a named size is padded so too."""
    source = config_file or (f"init_checkpoint {init_checkpoint}" if init_checkpoint else f"model_size {model_size}")
    ids = dict(token_ids or {})
    if config_file:
        config = ModernBertConfig.from_json_file(config_file)
    elif checkpoint_modernbert_config(init_checkpoint) is not None:
        config = checkpoint_modernbert_config(init_checkpoint)
    elif model_size:
        if not vocab_size:
            raise UserInputError("model_size needs the vocab size: give vocab_file or a data_dir with a manifest.json.")
        rows = -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE if padded_vocab else vocab_size
        config = modernbert_config_for_size(model_size, rows, max_position_embeddings or None, **ids)
    else:
        raise UserInputError("Say which ModernBERT to build: --model_size (base, large, L4-H256...), "
                             "--bert_config_file (a transformers config.json) or --init_checkpoint (a transformers "
                             "ModernBERT folder).")
    if vocab_size and (config.vocab_size < vocab_size or (config.vocab_size != vocab_size and not padded_vocab)):
        raise UserInputError(f"The ModernBERT's vocab_size is {config.vocab_size} ({source}) but the data's vocab has "
                             f"{vocab_size} tokens{' (the model may have more, not fewer)' if padded_vocab else ''}: "
                             "make the data with that model's vocab, or give a config whose vocab_size is the data's.")
    for name, wanted in ids.items():
        if getattr(config, name) is not None and getattr(config, name) != wanted:
            raise UserInputError(f"{source}: {name} is {getattr(config, name)} but the data's vocab has that token at "
                                 f"id {wanted}: make the data with that model's vocab, or give a config with its ids.")
    config = replace(config, **{k: v for k, v in ids.items() if getattr(config, k) is None})
    if dropout >= 0:
        config = replace(config, embedding_dropout=dropout, attention_dropout=dropout, mlp_dropout=dropout)
    return config


def is_modernbert_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder whose ``config.json`` (or a ``config.json`` file itself) describes a ModernBERT
    (model_type modernbert)."""
    config = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        return bool(path) and config.is_file() and json.loads(config.read_text()).get("model_type") == "modernbert"
    except (OSError, ValueError, AttributeError):
        return False
