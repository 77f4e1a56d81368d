"""Google's BERT checkpoint names <-> Hugging Face names, and safetensors, with NumPy alone.

One module for both directions, so an export imports back unchanged: :func:`huggingface_to_google` and
:func:`google_to_huggingface` are exact inverses. Every backend and the exports use it, so nothing here
needs TensorFlow, JAX, torch or transformers (Google TF checkpoints are read by :mod:`.tf_bundle`), except
``pytorch_model.bin`` (torch). A transformers ModernBERT folder is read here too (:func:`read_modernbert_folder`):
its weights keep transformers' names, which are the ones a ModernBERT run stores.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np

from ..errors import UserInputError
from . import tf_bundle
from .modernbert_config import ModernBertConfig

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
NSP_WEIGHTS = "cls/seq_relationship/output_weights"  # Google stores it [2, hidden]: a Dense kernel transposed


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


def read_checkpoint_weights(path: str) -> dict[str, np.ndarray]:
    """Every weight of a checkpoint, by Google BERT variable name (a Google TF checkpoint read with NumPy alone,
    :mod:`.tf_bundle`, so a runtime without TensorFlow continues pretraining from Google's releases)."""
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
    names = [name for name in tf_bundle.list_tensors(prefix) if name != "global_step"
             and not name.endswith(("adam_m", "adam_v")) and not name.startswith("_CHECKPOINTABLE")]
    return tf_bundle.read_tensors(prefix, names)


def tf_checkpoint_prefix(p: Path) -> str | None:
    """The prefix of a TF checkpoint at ``p`` (a prefix, its .index file, or a folder holding one), or None."""
    return tf_bundle.find_bundle_prefix(p)


# -- transformers' ModernBERT folders (their weights keep transformers' names) ------------------------------
MODERNBERT_EMBEDDINGS = "model.embeddings.tok_embeddings.weight"
SHARD_INDEX = "model.safetensors.index.json"


def read_weight_files(folder: Path) -> dict[str, np.ndarray]:
    """A transformers folder's weights: ``model.safetensors``, its shards (``model.safetensors.index.json``) or
    ``pytorch_model.bin`` (which needs torch), as float32 arrays by name."""
    if (folder / SHARD_INDEX).is_file():
        shards = sorted(set(json.loads((folder / SHARD_INDEX).read_text())["weight_map"].values()))
        weights = {}
        for shard in shards:
            weights.update(read_safetensors(folder / shard))
        return weights
    if not any((folder / name).is_file() for name in HF_WEIGHT_FILES):
        raise UserInputError(f"{folder} holds no model.safetensors (nor pytorch_model.bin): no weights to read.")
    return read_hf_folder(folder)


def read_modernbert_folder(folder: str | os.PathLike) -> tuple[ModernBertConfig, dict[str, np.ndarray]]:
    """The config and weights (transformers' names and layout, float32) of a transformers ModernBERT folder:
    ``ModernBertForMaskedLM``'s, or an encoder's (``ModernBertModel``: its names get the ``model.`` prefix and
    the head is missing). Load them with :meth:`..jax_backend.families.JaxFamily.assign`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"{folder} is not a folder: give a transformers ModernBERT folder (config.json and "
                             "model.safetensors).")
    config = ModernBertConfig.from_json_file(folder / "config.json")
    weights = read_weight_files(folder)
    if MODERNBERT_EMBEDDINGS not in weights and "embeddings.tok_embeddings.weight" in weights:
        weights = {f"model.{name}": value for name, value in weights.items()}
    if MODERNBERT_EMBEDDINGS not in weights:
        raise UserInputError(f"{folder}'s weights have no {MODERNBERT_EMBEDDINGS}: they are not a ModernBERT's.")
    return config, weights
