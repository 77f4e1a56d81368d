"""Did pretraining help? A downstream probe: the pretrained encoder against the same shape from random weights.

``probe(RUN, task_file)`` reads a small labelled file (``text<TAB>label`` per line), holds out a
stratified share of it, and for both encoders (the run's newest weights, and the same
``bert_config`` freshly initialised) either trains a light classifier on frozen features (``features``:
mean-pooled last hidden states, a ridge classifier whose regularisation is chosen on a slice of the
training part) or fine-tunes the whole encoder with a linear head (``finetune``). Held-out accuracy
and seconds are reported side by side with the majority-class rate, so "is my MLM accuracy good?"
gets an answer in the units the user cares about.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..data.tokenization import load_tokenizer
from ..errors import UserInputError
from ..models.inference import InferenceModel
from ..storage.local import write_text_atomic
from . import PROBE_MODES
from .rebuild import load_trained_model, untrained_copy

log = logging.getLogger(__name__)

RIDGE_PENALTIES = (0.01, 0.1, 1.0, 10.0, 100.0)


@dataclass
class ProbeResult:
    """Held-out accuracy of the pretrained and the randomly initialised encoder on one task."""

    task: str
    mode: str
    labels: list[str]
    train_examples: int
    test_examples: int
    majority_accuracy: float
    pretrained_accuracy: float
    random_accuracy: float
    pretrained_seconds: float
    random_seconds: float
    weights: str
    step: int | None = None
    path: str | None = None

    def summary(self) -> str:
        where = f"step {self.step}" if self.step is not None else self.weights
        gain = self.pretrained_accuracy - self.random_accuracy
        lines = [
            f"Probe of {where} on {self.task} ({self.mode}; {len(self.labels)} labels, {self.train_examples} "
            f"training and {self.test_examples} held-out examples)",
            f"  pretrained encoder:  accuracy {self.pretrained_accuracy:.4f} ({self.pretrained_seconds:.1f} s)",
            f"  random-init encoder: accuracy {self.random_accuracy:.4f} ({self.random_seconds:.1f} s)",
            f"  majority class:      accuracy {self.majority_accuracy:.4f}",
            f"  pretraining {'adds' if gain >= 0 else 'loses'} {abs(gain) * 100:.1f} points",
        ]
        if self.path:
            lines.append(f"  written to {self.path}")
        return "\n".join(lines)


# -- the task file -------------------------------------------------------------------------------------
def read_task(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Texts and labels of a ``text<TAB>label`` file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"Task file {path} does not exist.")
    texts, labels = [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UserInputError(f"Task file {path} is not UTF-8 ({exc}).") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        text, tab, label = line.rpartition("\t")
        if not tab or not text.strip() or not label.strip():
            raise UserInputError(f"{path}, line {number}: expected 'text<TAB>label', got {line[:80]!r}.")
        texts.append(text.strip())
        labels.append(label.strip())
    counts = Counter(labels)
    if len(counts) < 2:
        raise UserInputError(f"Task file {path} has {len(counts)} label(s); a probe needs at least two.")
    rare = [label for label, n in counts.items() if n < 4]
    if rare:
        raise UserInputError(f"Task file {path}: label(s) {', '.join(rare[:5])} have fewer than 4 examples; "
                             "give each label at least a few for training and testing.")
    return texts, labels


def split_task(labels: list[str], test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Stratified train/test indices: ``test_fraction`` of each label held out (at least one)."""
    rng = random.Random(seed)
    train, test = [], []
    for label in sorted(set(labels)):
        indices = [i for i, value in enumerate(labels) if value == label]
        rng.shuffle(indices)
        cut = max(1, round(len(indices) * test_fraction))
        test += indices[:cut]
        train += indices[cut:]
    return sorted(train), sorted(test)


def encode_texts(tokenizer, texts: list[str], max_seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] text [SEP]`` ids (truncated, zero padded) and segment ids, one row per text."""
    ids = np.zeros((len(texts), max_seq_length), dtype=np.int32)
    for row, tokens in enumerate(tokenizer.encode_batch(texts)):
        tokens = tokens[:max_seq_length - 2]
        ids[row, 0], ids[row, 1:1 + len(tokens)], ids[row, 1 + len(tokens)] = (
            tokenizer.cls_id, tokens, tokenizer.sep_id)
    return ids, np.zeros_like(ids)


# -- the two ways of probing -------------------------------------------------------------------------------
def pooled_features(model: InferenceModel, ids: np.ndarray, segments: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Mean of the last hidden states over each text's tokens ([CLS] and [SEP] included, padding not); the
    hidden states of ``batch_size`` texts at a time are held, not the whole task's."""
    out = []
    for start in range(0, len(ids), batch_size):
        part = slice(start, start + batch_size)
        hidden = model.hidden_states(ids[part], segments[part])
        mask = (ids[part] > 0)[..., None].astype(np.float32)
        out.append((hidden * mask).sum(1) / mask.sum(1))
    return np.concatenate(out).astype(np.float64)


def ridge_accuracy(train_x, train_y, test_x, test_y, num_labels: int, seed: int) -> float:
    """A ridge classifier on standardised features; its penalty is picked on a fifth of the training part."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    order = np.random.default_rng(seed).permutation(len(train_x))
    cut = max(1, len(order) // 5)
    fit, check = order[cut:], order[:cut]

    def solve(x, y, penalty):
        x = np.hstack([x, np.ones((len(x), 1))])
        targets = np.eye(num_labels)[y] * 2 - 1
        return np.linalg.solve(x.T @ x + penalty * np.eye(x.shape[1]), x.T @ targets)

    def accuracy(weights, x, y):
        return float(np.mean((np.hstack([x, np.ones((len(x), 1))]) @ weights).argmax(1) == y))

    best = max(RIDGE_PENALTIES, key=lambda p: accuracy(solve(train_x[fit], train_y[fit], p), train_x[check],
                                                        train_y[check]))
    return accuracy(solve(train_x, train_y, best), test_x, test_y)


# -- the probe -----------------------------------------------------------------------------------------------
def probe(run_dir: str | os.PathLike, task_file: str | os.PathLike, checkpoint: str | None = None, *,
          mode: str = "features", max_seq_length: int = 64, test_fraction: float = 0.2, seed: int = 0,
          epochs: int = 5, learning_rate: float = 5e-4, output: str | os.PathLike | None = None,
          backend: str | None = None) -> ProbeResult:
    """Held-out accuracy on ``task_file`` of the run's encoder and of the same shape from random weights.

    ``finetune`` trains the encoder with a linear head on its mean-pooled states (mean pooling rather than
    [CLS]: an MLM-only model, the modern recipe, never trains its [CLS] state), in the run's backend.
    """
    if mode not in PROBE_MODES:
        raise UserInputError(f"Probe mode {mode!r} is unknown; use one of {', '.join(PROBE_MODES)}.")
    if not 0 < test_fraction < 1:
        raise UserInputError(f"test_fraction={test_fraction} must be in (0, 1), e.g. 0.2.")
    texts, labels = read_task(task_file)
    trained = load_trained_model(run_dir, checkpoint, max_seq_length=max_seq_length, backend=backend)
    names = sorted(set(labels))
    y = np.asarray([names.index(label) for label in labels])
    ids, segments = encode_texts(load_tokenizer(trained.vocab_file, trained.do_lower_case), texts,
                                 trained.max_seq_length)
    train, test = split_task(labels, test_fraction, seed)
    accuracies, seconds = [], []
    for model in (trained, untrained_copy(trained, seed)):
        started = time.perf_counter()
        if mode == "features":
            features = pooled_features(model.model, ids, segments)
            accuracies.append(ridge_accuracy(features[train], y[train], features[test], y[test], len(names), seed))
        else:
            accuracies.append(model.model.finetune_accuracy((ids[train], segments[train], y[train]),
                                                            (ids[test], segments[test], y[test]), len(names), epochs,
                                                            learning_rate, seed, batch_size=16))
        seconds.append(time.perf_counter() - started)
    majority = Counter(y[train].tolist()).most_common(1)[0][0]
    result = ProbeResult(str(task_file), mode, names, len(train), len(test), float(np.mean(y[test] == majority)),
                         accuracies[0], accuracies[1], seconds[0], seconds[1], trained.weights, trained.step)
    if output:
        result.path = str(output)
        write_text_atomic(output, json.dumps(asdict(result), indent=2, ensure_ascii=False) + "\n")
    return result
