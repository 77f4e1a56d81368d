"""Did pretraining work? Held-out MLM/NSP figures and fill-mask examples for a run's weights.

``evaluate(RUN)`` restores the newest (or a chosen) checkpoint, computes MLM loss, accuracy and
perplexity and NSP accuracy over the eval shards with the same formulas as training's periodic eval,
fills ``[MASK]`` slots in sentences the user gives (top k, with probabilities, whole words shown),
and writes it all to ``RUN/evaluation.json``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf

from .errors import UserInputError
from .input_pipeline import parse_batch, read_data_info
from .storage.local import write_text_atomic
from .trained_model import TrainedModel, load_trained_model
from .training import STAT_KEYS, metrics_from_sums

log = logging.getLogger(__name__)
MASK = "[MASK]"
RESULTS_FILE = "evaluation.json"


@dataclass
class EvalResult:
    """Figures on the eval shards, fill-mask predictions, and which weights they describe."""

    weights: str
    step: int | None
    metrics: dict | None
    eval_examples: int
    fill_mask: list[dict] = field(default_factory=list)
    data_dir: str | None = None
    seconds: float = 0.0
    path: str | None = None

    def summary(self) -> str:
        where = f"step {self.step}" if self.step is not None else self.weights
        lines = [f"Evaluation of {where}"]
        if self.metrics:
            m = self.metrics
            text = (f"  eval ({self.eval_examples} sequences): MLM loss {m['mlm_loss']:.4f}, accuracy "
                    f"{m['mlm_accuracy']:.4f}, perplexity {m['mlm_perplexity']:.2f}")
            if "nsp_accuracy" in m:
                text += f"; NSP accuracy {m['nsp_accuracy']:.4f}"
            lines.append(text)
        else:
            lines.append("  no eval shards: figures skipped")
        lines += [format_fill_mask(item) for item in self.fill_mask]
        if self.path:
            lines.append(f"  written to {self.path}")
        return "\n".join(lines)


# -- held-out figures -------------------------------------------------------------------------------
def eval_sums(trained: TrainedModel, files: list[str], batch_size: int, max_batches: int | None) -> dict:
    """Summed MLM/NSP statistics over the records of ``files`` (every record, last batch included)."""
    model, with_nsp = trained.pretraining.model, trained.pretraining.with_nsp
    seq, pred = trained.max_seq_length, trained.max_predictions_per_seq
    ds = tf.data.TFRecordDataset(sorted(files)).batch(batch_size)
    if max_batches:
        ds = ds.take(max_batches)
    ds = ds.map(lambda s: parse_batch(s, seq, pred), num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)

    @tf.function
    def step(batch):
        outputs = model([batch["input_ids"], batch["segment_ids"], batch["masked_lm_positions"]], training=False)
        outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
        labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
        logits = tf.cast(outputs[0], tf.float32)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        right = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        stats = {"mlm_loss_sum": tf.reduce_sum(ce * weights), "mlm_weight": tf.reduce_sum(weights),
                 "mlm_correct": tf.reduce_sum(right * weights),
                 "examples": tf.cast(tf.shape(labels)[0], tf.float32),
                 "nsp_loss_sum": tf.constant(0.0), "nsp_correct": tf.constant(0.0)}
        if with_nsp:
            nsp_logits, nsp_labels = tf.cast(outputs[1], tf.float32), batch["next_sentence_labels"]
            stats["nsp_loss_sum"] = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits))
            stats["nsp_correct"] = tf.reduce_sum(tf.cast(
                tf.equal(tf.argmax(nsp_logits, -1, output_type=tf.int32), nsp_labels), tf.float32))
        return stats

    totals = {key: 0.0 for key in STAT_KEYS}
    for batch in ds:
        for key, value in step(batch).items():
            totals[key] += float(value)
    return totals


# -- fill-mask ----------------------------------------------------------------------------------------
@dataclass
class _Slot:
    """Consecutive [MASK]s typed without spaces between them: one word in WordPieces."""

    positions: list[int]
    start: int  # character span of the slot in the text
    end: int
    continues_word: bool  # typed right after a word ("play[MASK]"): may start with a ## piece


def _encode_with_masks(tokenizer, text: str, max_seq_length: int):
    """Token ids ([CLS] A [SEP] [B [SEP]]), segment ids and the mask slots of a sentence.

    ``[SEP]`` in the text separates a second segment; ``[MASK]`` marks a token to predict.
    """
    ids, segments, slots = [tokenizer.cls_id], [0], []
    segment, cursor = 0, 0
    for match in re.finditer(r"\[MASK\]|\[SEP\]", text):
        ids += tokenizer.encode(text[cursor:match.start()])
        if match.group() == "[SEP]":
            ids.append(tokenizer.sep_id)
            segments += [segment] * (len(ids) - len(segments))  # the [SEP] closes segment A
            segment = 1
        else:
            previous = slots[-1] if slots else None
            if previous and previous.end == match.start():
                previous.positions.append(len(ids))
                previous.end = match.end()
            else:
                before = text[match.start() - 1] if match.start() else " "
                attached = before.isalnum() and not _is_cjk(before)  # CJK characters are words of their own
                slots.append(_Slot([len(ids)], match.start(), match.end(), attached))
            ids.append(tokenizer.mask_id)
        segments += [segment] * (len(ids) - len(segments))
        cursor = match.end()
    ids += tokenizer.encode(text[cursor:])
    if ids[-1] != tokenizer.sep_id:
        ids.append(tokenizer.sep_id)
    segments += [segment] * (len(ids) - len(segments))
    if len(ids) > max_seq_length:
        raise UserInputError(f"The sentence {text[:60]!r}... has {len(ids)} tokens; the model takes "
                             f"{max_seq_length}. Shorten it.")
    return ids, segments, slots


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x2FA1F)


def _slot_candidates(probs: np.ndarray, slot: _Slot, allowed: np.ndarray, continuation: np.ndarray,
                     cjk: np.ndarray, top_k: int) -> list[tuple[list[int], float]]:
    """Top-k fillings of one slot by the product of per-position probabilities (beam search).

    The first piece starts a word, unless the slot is typed onto a word ("play[MASK]"); later pieces are
    ``##`` continuations, or CJK characters (each its own WordPiece word, as a Chinese word's characters).
    """
    beams = [([], 1.0)]
    for i in range(len(slot.positions)):
        if i > 0:
            fits = continuation | cjk
        else:
            fits = continuation if slot.continues_word else ~continuation
        p = probs[i] * allowed * fits
        best = [t for t in np.argsort(-p)[:top_k] if p[t] > 0]  # never a token the slot rules out
        beams = sorted(((ids + [int(t)], score * float(p[t])) for ids, score in beams for t in best),
                       key=lambda b: -b[1])[:top_k]
    return beams


def _word(tokens: list[str]) -> str:
    return "".join(t[2:] if t.startswith("##") else t for t in tokens)


def fill_mask(trained: TrainedModel, sentences, top_k: int = 5) -> list[dict]:
    """Predict every [MASK] slot of each sentence: top-k whole words with probabilities and the filled text.

    ``[MASK][MASK]`` (no space) asks for one word of two WordPieces; ``[MASK] [MASK]`` for two words.
    Probabilities are the model's softmax over the vocabulary (product over a slot's pieces).
    """
    from .tokenization import load_tokenizer

    tokenizer = load_tokenizer(trained.vocab_file, trained.do_lower_case)
    inv_vocab = tokenizer.inv_vocab
    allowed = np.array([not (t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]") or t.startswith("[unused"))
                        for t in inv_vocab])
    continuation = tokenizer.is_continuation
    cjk = np.array([len(t) == 1 and _is_cjk(t) for t in inv_vocab])
    seq, pred = trained.max_seq_length, trained.max_predictions_per_seq
    results = []
    for text in sentences:
        ids, segments, slots = _encode_with_masks(tokenizer, text, seq)
        positions = [p for slot in slots for p in slot.positions]
        pad = seq - len(ids)
        logits, nsp = [], None
        for chunk in range(0, max(len(positions), 1), pred):
            part = positions[chunk:chunk + pred]
            outputs = trained.pretraining.model([np.array([ids + [0] * pad], np.int32),
                                                 np.array([segments + [0] * pad], np.int32),
                                                 np.array([part + [0] * (pred - len(part))], np.int32)])
            outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
            logits.append(outputs[0].numpy()[0, :len(part)])
            if len(outputs) > 1:
                nsp = _softmax(outputs[1].numpy()[0].astype(np.float64))
        probs = _softmax(np.concatenate(logits).astype(np.float64)) if positions else np.zeros((0, len(inv_vocab)))
        item = {"text": text, "tokens": tokenizer.convert_ids_to_tokens(ids), "masks": []}
        offset, filled, shift = 0, text, 0
        for slot in slots:
            slot_probs = probs[offset:offset + len(slot.positions)]
            offset += len(slot.positions)
            candidates = []
            for piece_ids, score in _slot_candidates(slot_probs, slot, allowed, continuation, cjk, top_k):
                pieces = tokenizer.convert_ids_to_tokens(piece_ids)
                word = _word(pieces)
                candidates.append({"word": word, "pieces": pieces, "probability": score,
                                   "text": text[:slot.start] + word + text[slot.end:]})
            item["masks"].append({"positions": slot.positions, "candidates": candidates})
            if candidates:
                best = candidates[0]["word"]
                filled = filled[:slot.start + shift] + best + filled[slot.end + shift:]
                shift += len(best) - (slot.end - slot.start)
        item["filled"] = filled
        if nsp is not None and 1 in segments:
            item["is_next_probability"] = float(nsp[0])  # label 0 = B follows A (BERT's convention)
        results.append(item)
    return results


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def format_fill_mask(item: dict) -> str:
    """A fill-mask result as text: the sentence, the filled sentence and each slot's candidates."""
    lines = [f"  {item['text']}", f"    -> {item['filled']}"]
    for n, slot in enumerate(item["masks"], 1):
        words = ", ".join(f"{c['word']} ({c['probability']:.3f})" for c in slot["candidates"])
        lines.append(f"    mask {n}: {words}")
    if "is_next_probability" in item:
        lines.append(f"    P(second segment follows the first) = {item['is_next_probability']:.3f}")
    return "\n".join(lines)


# -- the whole evaluation -------------------------------------------------------------------------------
def evaluate(run_dir: str | os.PathLike, checkpoint: str | None = None, *, sentences=(), top_k: int = 5,
             data_dir: str | None = None, max_eval_steps: int | None = None, eval_batch_size: int | None = None,
             output: str | os.PathLike | None = None, trained: TrainedModel | None = None) -> EvalResult:
    """Evaluate a run's newest (or the given) weights on its eval shards; fill masks; write evaluation.json.

    ``data_dir``, ``max_eval_steps`` and ``eval_batch_size`` default to the run's configuration;
    ``max_eval_steps=0`` reads every eval record.
    """
    started = time.perf_counter()
    trained = trained or load_trained_model(run_dir, checkpoint)
    config = trained.config
    data_dir = data_dir or (config.storage.data_dir if config else None)
    metrics, examples = None, 0
    if data_dir:
        info = read_data_info(data_dir)
        if (info.max_seq_length, info.max_predictions_per_seq) != (trained.max_seq_length,
                                                                   trained.max_predictions_per_seq):
            raise UserInputError(f"The data in {data_dir} has max_seq_length={info.max_seq_length}, "
                                 f"max_predictions_per_seq={info.max_predictions_per_seq}; the run was trained on "
                                 f"{trained.max_seq_length}, {trained.max_predictions_per_seq}.")
        if info.eval_files:
            t = config.train if config else None
            batch = eval_batch_size or (t.eval_batch_size or t.train_batch_size if t else 32)
            steps = (t.max_eval_steps if t else 100) if max_eval_steps is None else max_eval_steps
            sums = eval_sums(trained, info.eval_files, batch, steps or None)
            examples = int(sums["examples"])
            if examples:
                metrics = metrics_from_sums(sums)
        else:
            log.warning("%s has no eval shards (create-data --eval_fraction): figures skipped.", data_dir)
    result = EvalResult(trained.weights, trained.step, metrics, examples,
                        fill_mask(trained, list(sentences), top_k) if sentences else [],
                        str(data_dir) if data_dir else None)
    result.seconds = time.perf_counter() - started
    if output is None and trained.run_dir:
        output = Path(trained.run_dir) / RESULTS_FILE
    if output is not None:
        result.path = str(output)
        write_text_atomic(output, json.dumps(_jsonable(asdict(result)), indent=2, ensure_ascii=False) + "\n")
    return result


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
