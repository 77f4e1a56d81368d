"""Reading shards back for checks: every example of a split, and the tokens before masking."""

from __future__ import annotations

import numpy as np

from tpu_pretrain.data.data_folder import load_manifest
from tpu_pretrain.tf_backend.input import feature_spec


def read_shards(data_dir, split="train"):
    """Every example of a split, parsed with the exact original BERT feature spec."""
    import tensorflow as tf

    manifest = load_manifest(data_dir)
    files = [str(data_dir / f) for f in manifest.files(split)]
    spec = feature_spec(manifest.settings["max_seq_length"], manifest.settings["max_predictions_per_seq"])
    dataset = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec)).batch(4096)
    parts = list(dataset.as_numpy_iterator())
    return {key: np.concatenate([p[key] for p in parts]) for key in spec}


def originals(batch):
    """Token ids before masking: the masked positions restored from masked_lm_ids."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_lm_weights"])
    ids[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
    return ids
