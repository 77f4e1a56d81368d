"""The BERT pretraining model, built with bert4keras, and its initialisation from released weights.

Why not bert4keras's own ``with_mlm=True`` head: it computes full-vocabulary logits for every token,
which costs ~25% of a BERT-base step and a [batch, length, vocab] softmax. Like the original BERT we
gather the hidden states at ``masked_lm_positions`` first, then apply the tied-embedding MLM head.
We also give every weight matrix its own random draw (bert4keras hands one initializer object to the
Q, K, V and output kernels, and an unseeded tf-keras initializer repeats its values).
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import tensorflow as tf
from bert4keras.layers import Dense, Embedding, Lambda, LayerNormalization, ScaleOffset
from bert4keras.models import BERT

from .errors import UserInputError

keras = tf.keras
log = logging.getLogger(__name__)

# Google's BERT miniatures (github.com/google-research/bert) plus base and large: (layers, hidden).
NAMED_SIZES: dict[str, tuple[int, int]] = {
    f"L{layers}-H{hidden}": (layers, hidden)
    for layers in (2, 4, 6, 8, 10, 12)
    for hidden in (128, 256, 512, 768)
}
NAMED_SIZES["L24-H1024"] = (24, 1024)
SIZE_ALIASES = {"tiny": "L2-H128", "mini": "L4-H256", "small": "L4-H512", "medium": "L8-H512",
                "base": "L12-H768", "large": "L24-H1024"}


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
        path = Path(path)
        if not path.is_file():
            raise UserInputError(f"bert_config_file {path} does not exist.")
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UserInputError(f"bert_config_file {path} is not valid JSON: {exc}") from None
        if "vocab_size" not in values:
            raise UserInputError(f"bert_config_file {path} has no vocab_size; is it a BERT config?")
        return cls.from_dict(values)

    def to_json_file(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")


def bert_config_for_size(model_size: str, vocab_size: int, max_position_embeddings: int = 512) -> BertConfig:
    """A named size (``L4-H256``, ``base``...) as a BertConfig: 64-wide heads, 4x FFN, as Google's."""
    name = SIZE_ALIASES.get(model_size.lower(), model_size.upper())
    if name not in NAMED_SIZES:
        raise UserInputError(
            f"model_size {model_size!r} is unknown; use one of {', '.join(NAMED_SIZES)} or "
            f"{', '.join(SIZE_ALIASES)}, or give bert_config_file."
        )
    layers, hidden = NAMED_SIZES[name]
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
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
                        vocab_size: int | None = None, max_position_embeddings: int = 512,
                        hidden_dropout_prob: float = -1.0) -> BertConfig:
    """Pick the model's shape: bert_config_file, else the init checkpoint's config, else model_size."""
    if bert_config_file:
        config = BertConfig.from_json_file(bert_config_file)
    elif init_checkpoint and checkpoint_bert_config(init_checkpoint):
        config = checkpoint_bert_config(init_checkpoint)
    elif model_size:
        if not vocab_size:
            raise UserInputError("model_size needs the vocab size: give vocab_file or a data_dir with a "
                                 "manifest.json.")
        config = bert_config_for_size(model_size, vocab_size, max_position_embeddings)
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


class FreshTruncatedNormal(keras.initializers.Initializer):
    """BERT's truncated normal that draws new values on every call.

    tf-keras's unseeded initializers return the same values each time one object is called, and
    bert4keras calls one object for several kernels. This one uses the stateful global RNG, so the
    draws differ per call and are reproducible after ``tf.keras.utils.set_random_seed``.
    """

    def __init__(self, stddev: float = 0.02):
        self.stddev = stddev

    def __call__(self, shape, dtype=None, **kwargs):
        dtype = tf.as_dtype(dtype or keras.backend.floatx())
        return tf.random.truncated_normal(shape, stddev=self.stddev, dtype=dtype)

    def get_config(self):
        return {"stddev": self.stddev}


def _gather_positions(inputs):
    """[batch, length, hidden] at [batch, predictions] positions -> [batch, predictions, hidden]."""
    sequence, positions = inputs
    return tf.gather(sequence, tf.cast(positions, tf.int32), batch_dims=1)


class PretrainingBERT(BERT):
    """bert4keras BERT whose heads are the original pretraining heads (MLM at masked positions, NSP).

    Outputs logits (no softmax) so the loss is computed stably in float32. Layer names follow
    bert4keras, so its ``variable_mapping()`` (Google's variable names) covers the heads too.
    """

    def __init__(self, initializer_range: float = 0.02, with_nsp_head: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.initializer_range = initializer_range
        self.with_nsp_head = with_nsp_head

    @property
    def initializer(self):
        return FreshTruncatedNormal(self.initializer_range)

    def apply_final_layers(self, inputs):
        sequence = inputs
        self.sequence_output = sequence
        positions = self.inputs[-1]
        x = self.apply(inputs=[sequence, positions], layer=Lambda, function=_gather_positions,
                       name="MLM-Gather")
        x = self.apply(inputs=x, layer=Dense, units=self.embedding_size, activation=self.hidden_act,
                       kernel_initializer=self.initializer, name="MLM-Dense")
        x = self.apply(inputs=x, layer=LayerNormalization, epsilon=1e-12, name="MLM-Norm")
        x = self.apply(inputs=x, layer=Embedding, arguments={"mode": "dense"}, name="Embedding-Token")
        mlm_logits = self.apply(inputs=x, layer=ScaleOffset, scale=False, name="MLM-Bias")
        if not self.with_nsp_head:
            return [mlm_logits]
        x = self.apply(inputs=sequence, layer=Lambda, function=lambda t: t[:, 0], name="Pooler")
        x = self.apply(inputs=x, layer=Dense, units=self.hidden_size, activation="tanh",
                       kernel_initializer=self.initializer, name="Pooler-Dense")
        nsp_logits = self.apply(inputs=x, layer=Dense, units=2, kernel_initializer=self.initializer,
                                name="NSP-Proba")  # logits; the name is bert4keras's, for the mapping
        return [mlm_logits, nsp_logits]


@dataclass
class PretrainingModel:
    """The Keras pretraining model, the encoder-only view sharing its weights, and the bert4keras builder.

    ``model`` takes ``[input_ids, segment_ids, masked_lm_positions]`` and returns ``[mlm_logits]``
    (+ ``nsp_logits``); ``encoder`` takes ``[input_ids, segment_ids]`` and returns the last hidden
    states. Padding is read from ``input_ids == 0`` ([PAD] is id 0 in every BERT vocab).
    """

    model: keras.Model
    encoder: keras.Model
    bert: PretrainingBERT
    config: BertConfig
    with_nsp: bool


def build_pretraining_model(config: BertConfig, max_seq_length: int, max_predictions_per_seq: int,
                            with_nsp: bool = True) -> PretrainingModel:
    """Build (in the current strategy scope) BERT with static shapes, as TPUs need."""
    if config.hidden_size % config.num_attention_heads:
        raise UserInputError(f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                             f"{config.num_attention_heads}.")
    if max_seq_length > config.max_position_embeddings:
        raise UserInputError(f"max_seq_length {max_seq_length} is above the model's max_position_embeddings "
                             f"{config.max_position_embeddings}.")
    bert = PretrainingBERT(
        initializer_range=config.initializer_range,
        with_nsp_head=with_nsp,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        dropout_rate=config.hidden_dropout_prob,
        attention_dropout_rate=config.attention_probs_dropout_prob,
        max_position=config.max_position_embeddings,
        segment_vocab_size=config.type_vocab_size,
        sequence_length=max_seq_length,
        name="bert",
    )
    positions = keras.layers.Input(shape=(max_predictions_per_seq,), dtype="int32",
                                   name="Input-MLM-Positions")
    bert.build(additional_input_layers=positions)
    encoder = keras.Model(bert.inputs[:2], bert.sequence_output, name="bert_encoder")
    return PretrainingModel(model=bert.model, encoder=encoder, bert=bert, config=config, with_nsp=with_nsp)


# -- initialisation from released weights ---------------------------------------------------------
@dataclass
class InitReport:
    """What an init checkpoint provided: loaded and missing variables (Google names)."""

    source: str
    loaded: list[str]
    missing: list[str]

    def summary(self) -> str:
        text = f"Initialised {len(self.loaded)} weights from {self.source}"
        if self.missing:
            text += f"; {len(self.missing)} not in it keep their random init: {', '.join(self.missing[:6])}"
            text += " ..." if len(self.missing) > 6 else ""
        return text


def load_init_checkpoint(pretraining: PretrainingModel, init_checkpoint: str) -> InitReport:
    """Load a Google TF checkpoint (``bert/encoder/layer_N/...``) or a Hugging Face BERT folder."""
    weights = read_checkpoint_weights(init_checkpoint)
    bert = pretraining.bert
    loaded, missing, pairs = [], [], []
    for layer_name, names in bert.variable_mapping().items():
        if layer_name not in bert.layers:
            continue
        for variable, name in zip(bert.layers[layer_name].trainable_weights, names, strict=False):
            if name not in weights:
                missing.append(name)
                continue
            value = bert.load_variable(weights, name)
            if tuple(value.shape) != tuple(variable.shape):
                raise UserInputError(
                    f"init_checkpoint {init_checkpoint}: {name} has shape {tuple(value.shape)} but the model "
                    f"needs {tuple(variable.shape)}; build the model from the checkpoint's own config "
                    "(leave model_size and bert_config_file empty, or use its bert_config.json)."
                )
            pairs.append((variable, value))
            loaded.append(name)
    if not loaded:
        raise UserInputError(f"init_checkpoint {init_checkpoint} holds no BERT weights that this model uses.")
    for variable, value in pairs:
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))
    report = InitReport(init_checkpoint, loaded, missing)
    log.info(report.summary())
    return report


def read_checkpoint_weights(path: str) -> dict[str, np.ndarray]:
    """Every weight of a checkpoint, by Google BERT variable name."""
    p = Path(path)
    if p.is_dir() and any((p / n).is_file() for n in ("model.safetensors", "pytorch_model.bin")):
        return huggingface_to_google(_read_hf_folder(p))
    prefix = _tf_checkpoint_prefix(p)
    if prefix is None:
        raise UserInputError(
            f"init_checkpoint {path} is neither a TF checkpoint (a prefix such as .../bert_model.ckpt with "
            ".index and .data files, or a folder holding one) nor a Hugging Face folder with "
            "model.safetensors."
        )
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.endswith(("adam_m", "adam_v")) and name != "global_step"}


def _tf_checkpoint_prefix(p: Path) -> str | None:
    if p.is_dir():
        latest = tf.train.latest_checkpoint(str(p))
        if latest:
            return latest
        indexes = sorted(p.glob("*.index"))
        return str(indexes[0])[: -len(".index")] if indexes else None
    if Path(str(p) + ".index").is_file():
        return str(p)
    if p.suffix == ".index" and p.is_file():
        return str(p)[: -len(".index")]
    return None


def _read_hf_folder(folder: Path) -> dict[str, np.ndarray]:
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")
    try:
        import torch
    except ImportError:
        raise UserInputError(f"{folder} holds pytorch_model.bin, which needs torch: pip install torch "
                             "(or convert it to model.safetensors).") from None
    state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
                       "I32": np.int32, "BF16": None}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a .safetensors file with numpy alone (the format is a JSON header and raw arrays)."""
    data = Path(path).read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[base + start : base + end]
        if info["dtype"] == "BF16":
            array = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _SAFETENSORS_DTYPES:
            array = np.frombuffer(raw, _SAFETENSORS_DTYPES[info["dtype"]])
        else:
            continue
        out[name] = array.reshape(info["shape"]).astype(np.float32, copy=False)
    return out


def huggingface_to_google(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rename Hugging Face BERT weights to Google's checkpoint names (transposing Linear kernels)."""
    out = {}
    for key, value in state.items():
        name = key[len("bert."):] if key.startswith("bert.") else key
        if name.endswith("position_ids") or name.startswith("cls.predictions.decoder"):
            continue
        if name == "cls.predictions.bias":
            out["cls/predictions/output_bias"] = value
            continue
        if name.startswith("cls.seq_relationship."):
            suffix = "output_weights" if name.endswith("weight") else "output_bias"
            out[f"cls/seq_relationship/{suffix}"] = value  # Google also stores it as [2, hidden]
            continue
        parts = re.sub(r"layer\.(\d+)", r"layer_\1", name).split(".")
        leaf = parts.pop()
        is_norm = parts[-1] == "LayerNorm"
        if name.startswith("embeddings.") and not is_norm:
            google = "/".join(parts)  # embeddings/word_embeddings (no kernel suffix)
        elif is_norm:
            google = "/".join(parts + [{"weight": "gamma", "bias": "beta"}.get(leaf, leaf)])
        elif leaf == "weight":
            google, value = "/".join(parts + ["kernel"]), value.T
        else:
            google = "/".join(parts + [leaf])
        if not google.startswith("cls/"):
            google = "bert/" + google
        out[google] = np.ascontiguousarray(value)
    return out
