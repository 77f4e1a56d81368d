"""Weights by name: Google's checkpoint names <-> Hugging Face names, safetensors, released checkpoints.

One module for both directions, so an export imports back unchanged. Google's BERT names
(``bert/encoder/layer_0/attention/self/query/kernel``) are the hub: bert4keras's ``variable_mapping``
maps the model's layers to them, :func:`huggingface_to_google` and :func:`google_to_huggingface` are
exact inverses, and safetensors are read and written with NumPy alone (no torch, no transformers).
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from ..errors import UserInputError
from .model import PretrainingModel

log = logging.getLogger(__name__)
NSP_WEIGHTS = "cls/seq_relationship/output_weights"
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def google_weights(pretraining: PretrainingModel, skip=()) -> dict[str, np.ndarray]:
    """Every weight of the model under its original Google BERT checkpoint name (but those in ``skip``)."""
    bert = pretraining.bert
    out, skip = {}, set(skip)
    for layer_name, names in bert.variable_mapping().items():
        if layer_name not in bert.layers:
            continue
        for variable, name in zip(bert.layers[layer_name].trainable_weights, names, strict=False):
            if name in skip:
                continue
            value = np.asarray(variable.numpy(), dtype=np.float32)
            out[name] = value.T if name == NSP_WEIGHTS else value  # Google stores it [2, hidden]
    return out


def google_to_huggingface(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Google BERT names -> Hugging Face BERT names (Linear kernels transposed to [out, in])."""
    out = {}
    for name, value in weights.items():
        if name == "cls/predictions/output_bias":
            out["cls.predictions.bias"] = value
            continue
        if name.startswith("cls/seq_relationship/"):
            out["cls.seq_relationship." + ("weight" if name.endswith("output_weights") else "bias")] = value
            continue
        parts = re.sub(r"layer_(\d+)", r"layer.\1", name).split("/")
        leaf = parts.pop()
        if parts and parts[-1] == "LayerNorm":
            parts.append({"gamma": "weight", "beta": "bias"}[leaf])
        elif leaf == "kernel":
            parts.append("weight")
            value = value.T
        elif leaf == "bias":
            parts.append("bias")
        else:  # embeddings/word_embeddings and friends: no kernel suffix in Google's names
            parts += [leaf, "weight"]
        out[".".join(parts)] = np.ascontiguousarray(value, dtype=np.float32)
    return out


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """Write float32 tensors as .safetensors (an 8-byte header length, a JSON header, raw little-endian data)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for blob in blobs:
            handle.write(blob)


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
        return huggingface_to_google(read_hf_folder(p))
    prefix = tf_checkpoint_prefix(p)
    if prefix is None:
        raise UserInputError(
            f"init_checkpoint {path} is neither a TF checkpoint (a prefix such as .../bert_model.ckpt with "
            ".index and .data files, or a folder holding one) nor a Hugging Face folder with "
            "model.safetensors."
        )
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.endswith(("adam_m", "adam_v")) and name != "global_step"}


def tf_checkpoint_prefix(p: Path) -> str | None:
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


def read_hf_folder(folder: Path) -> dict[str, np.ndarray]:
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


def has_pooler(path: Path) -> bool:
    """Whether released weights hold a pooler (and so possibly NSP): read from the names, not the arrays."""
    if path.is_dir() and (path / "model.safetensors").is_file():
        with open(path / "model.safetensors", "rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        return any("pooler.dense" in name or "seq_relationship" in name for name in header)
    prefix = tf_checkpoint_prefix(path)
    if prefix is None:
        return True  # pytorch_model.bin: BERT checkpoints nearly always carry the pooler
    names = [name for name, _ in tf.train.list_variables(prefix)]
    return any(name.startswith(("bert/pooler/", "cls/seq_relationship/")) for name in names)
