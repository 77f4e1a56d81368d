"""The one definition of the MLM and NSP statistics that training, its evaluations and ``evaluate`` share.

A batch's statistics are sums (loss, correct predictions, masked-token weight, examples), so they add
up across micro-batches, replicas, steps and eval batches without bias; :func:`metrics_from_sums` turns
them into the reported means: MLM loss and accuracy per masked token, NSP per example.
"""

from __future__ import annotations

import math

STAT_KEYS = ("mlm_loss_sum", "mlm_weight", "mlm_correct", "nsp_loss_sum", "nsp_correct", "examples")


def pretraining_stats(outputs, batch: dict, with_nsp: bool) -> dict:
    """Summed statistics of a batch from the model's ``[mlm_logits(, nsp_logits)]`` (float32 math).

    The TensorFlow form; :mod:`..jax_backend.trainer` states the same sums in ``jax.numpy``.
    """
    import tensorflow as tf

    outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
    logits = tf.cast(outputs[0], tf.float32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    right = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    stats = {"mlm_loss_sum": tf.reduce_sum(ce * weights), "mlm_weight": tf.reduce_sum(weights),
             "mlm_correct": tf.reduce_sum(right * weights), "examples": tf.cast(tf.shape(labels)[0], tf.float32),
             "nsp_loss_sum": tf.constant(0.0), "nsp_correct": tf.constant(0.0)}
    if with_nsp:
        nsp_logits, nsp_labels = tf.cast(outputs[1], tf.float32), batch["next_sentence_labels"]
        stats["nsp_loss_sum"] = tf.reduce_sum(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits))
        stats["nsp_correct"] = tf.reduce_sum(tf.cast(
            tf.equal(tf.argmax(nsp_logits, -1, output_type=tf.int32), nsp_labels), tf.float32))
    return stats


def metrics_from_sums(sums: dict) -> dict:
    """Means from summed statistics: MLM loss/accuracy over masked tokens, NSP over examples."""
    s = {k: float(v) for k, v in sums.items()}
    out = {"mlm_loss": s["mlm_loss_sum"] / max(s["mlm_weight"], 1e-9),
           "mlm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-9)}
    out["mlm_perplexity"] = math.exp(min(out["mlm_loss"], 50.0))
    out["loss"] = out["mlm_loss"]
    if s["nsp_loss_sum"] or s["nsp_correct"]:
        out["nsp_loss"] = s["nsp_loss_sum"] / max(s["examples"], 1e-9)
        out["nsp_accuracy"] = s["nsp_correct"] / max(s["examples"], 1e-9)
        out["loss"] += out["nsp_loss"]
    return out


def add_sums(totals: dict, sums: dict) -> dict:
    """``totals`` plus a batch's (or a call's) summed statistics, as Python floats."""
    return {key: totals.get(key, 0.0) + float(sums[key]) for key in STAT_KEYS}


def format_metrics(metrics: dict) -> str:
    keys = ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy")
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys if k in metrics)
