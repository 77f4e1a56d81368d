"""The one definition of the MLM and NSP statistics that training, its evaluations and ``evaluate`` share.

A batch's statistics are sums (loss, correct predictions, masked-token weight, examples), so they add
up across micro-batches, replicas, steps and eval batches without bias; :func:`metrics_from_sums` turns
them into the reported means: MLM loss and accuracy per masked token, NSP per example.
"""

from __future__ import annotations

import math
from typing import Protocol

STAT_KEYS = ("mlm_loss_sum", "mlm_weight", "mlm_correct", "nsp_loss_sum", "nsp_correct", "examples")


class ArrayOps(Protocol):
    """The few array operations the statistics need, given by each backend (TensorFlow, ``jax.numpy``)."""

    def float32(self, x): ...

    def loss_and_prediction(self, logits, labels): ...  # per row: -log softmax(logits)[label] in float32, argmax

    def sum(self, x): ...

    def rows(self, labels): ...  # the number of rows, as a float32 scalar


def pretraining_stats(outputs, batch: dict, with_nsp: bool, ops: ArrayOps) -> dict:
    """Summed statistics of a batch from the model's ``[mlm_logits(, nsp_logits)]``, in float32, with ``ops``.

    One formula for both backends, so their losses and accuracies agree by construction.
    """
    outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
    logits = ops.float32(outputs[0])
    loss, prediction = ops.loss_and_prediction(logits, labels)
    right = ops.float32(prediction == labels)
    zero = ops.float32(0.0)
    stats = {"mlm_loss_sum": ops.sum(loss * weights), "mlm_weight": ops.sum(weights),
             "mlm_correct": ops.sum(right * weights), "examples": ops.rows(labels),
             "nsp_loss_sum": zero, "nsp_correct": zero}
    if with_nsp:
        nsp_logits, nsp_labels = ops.float32(outputs[1]), batch["next_sentence_labels"]
        nsp_loss, nsp_prediction = ops.loss_and_prediction(nsp_logits, nsp_labels)
        stats["nsp_loss_sum"] = ops.sum(nsp_loss)
        stats["nsp_correct"] = ops.sum(ops.float32(nsp_prediction == nsp_labels))
    return stats


def global_batch_loss(stats: dict, global_weight, global_examples, with_nsp: bool):
    """This share's part of the loss of the *global* batch: MLM per masked token, NSP per example of the
    whole batch, so any number of replicas and micro-batches add up to the same loss and gradients."""
    loss = stats["mlm_loss_sum"] / global_weight
    if with_nsp:
        loss = loss + stats["nsp_loss_sum"] / global_examples
    return loss


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


def format_metrics(metrics: dict, random_next_share: float | None = None) -> str:
    """The figures a person reads; ``mlm_loss`` only beside an NSP loss (MLM only: it is ``loss``), and an NSP
    accuracy at the eval data's majority-class share (``random_next_share``: its random-next pairs) said so."""
    keys = ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy") if "nsp_loss" in metrics else (
        "loss", "mlm_accuracy")
    text = ", ".join(f"{k} {metrics[k]:.4f}" for k in keys if k in metrics)
    return text + nsp_majority_note(metrics, random_next_share)


def nsp_majority_note(metrics: dict, random_next_share: float | None) -> str:
    """`` (= the majority class share: ...)`` when the NSP accuracy is what predicting one class always scores."""
    if random_next_share is None or "nsp_accuracy" not in metrics:
        return ""
    majority = max(random_next_share, 1.0 - random_next_share)
    tolerance = 0.5 / metrics["sequences"] if metrics.get("sequences") else 1e-4  # one sequence's worth
    if abs(metrics["nsp_accuracy"] - majority) > tolerance:
        return ""
    return " (= the majority class share: the head has learnt nothing yet)"


def eval_random_next_share(data_dir: str | None) -> float | None:
    """The share of random-next pairs in a data folder's eval shards, from its manifest (None: unknown, or no NSP)."""
    from ..data.data_folder import EVAL, read_manifest

    manifest = read_manifest(data_dir) if data_dir else None
    if manifest is None or manifest.settings.get("no_nsp"):
        return None
    totals = manifest.totals(EVAL)
    return totals["random_next"] / totals["instances"] if totals["instances"] else None
