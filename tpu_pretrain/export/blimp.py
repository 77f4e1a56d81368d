"""Does the model know English grammar? BLiMP's minimal pairs scored by pseudo-log-likelihood.

BLiMP (Warstadt et al. 2020; CC BY) holds 67 phenomena of 1,000 pairs, each a grammatical sentence and an
ungrammatical one that differ minimally. A masked LM scores a sentence by its pseudo-log-likelihood (Salazar et
al. 2020): every token masked in turn, the log-probability of the token summed; a pair is right when the
grammatical sentence scores strictly higher (chance is 50%). The pairs come from a local copy (a folder of
BLiMP's ``.jsonl`` files, or one file) or from the Hub (``nyu-mll/blimp``, with ``datasets``). The masked
copies go through the run's own model (:class:`..models.inference.InferenceModel`), rebuilt at the length the
sentences need, so it works for either backend and family. The work is counted in masked copies: a bar on a
terminal, a log line a minute elsewhere. The figures, beside random inits of the model's shape, and ``blimp.json``
beside evaluation.json are :mod:`.blimp_results`'s (docs/blimp.md).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.tokenization import load_tokenizer
from ..errors import UserInputError
from ..formatting import hms
from ..models.inference import InferenceModel
from .rebuild import TrainedModel, build_inference

log = logging.getLogger(__name__)

HUB_DATASET = "nyu-mll/blimp"
HUB_SOURCE = f"hf://datasets/{HUB_DATASET}"  # what --blimp alone means
BLIMP_FILE = "blimp.json"
REQUIRED = ("sentence_good", "sentence_bad", "UID")
BATCH_ROWS = 256  # masked copies per model call: one compiled shape, the last batch padded
LENGTH_STEP = 16  # sentences are scored at a multiple of this length (one model, one compiled shape each)
UNK_WARNING = 0.05  # share of BLiMP's tokens that are [UNK] above which the figures are said to mean little
LOG_EVERY_S = 60.0  # progress where no bar can be drawn (a log, a pipe): one line a minute at most


@dataclass(frozen=True)
class Pair:
    """One minimal pair: the grammatical sentence, the ungrammatical one, and the phenomenon and field it tests."""

    good: str
    bad: str
    uid: str
    field: str = ""
    term: str = ""


# -- reading the pairs ----------------------------------------------------------------------------------
def _pair(row: dict, where: str) -> Pair:
    missing = [k for k in REQUIRED if not isinstance(row.get(k), str) or not row.get(k)]
    if missing:
        raise UserInputError(f"{where}: a BLiMP pair needs {', '.join(REQUIRED)} (text); {', '.join(missing)} "
                             "missing or empty. Use BLiMP's own .jsonl files (data/ of github.com/alexwarstadt/blimp).")
    return Pair(row["sentence_good"], row["sentence_bad"], row["UID"], field_name(row.get("field") or ""),
                row.get("linguistics_term") or "")


def field_name(name: str) -> str:
    """One name per field: BLiMP's own files spell one field both ``syntax_semantics`` and ``syntax/semantics``
    (principle_A_case_2), which would be tallied as two; lower case, each run of other characters one ``_``."""
    return re.sub(r"[^a-z0-9]+", "_", str(name).strip().lower()).strip("_")


def read_local(path: str | os.PathLike, per_phenomenon: int | None = None) -> list[Pair]:
    """The pairs of a BLiMP ``.jsonl`` file, or of every ``.jsonl`` in a folder (name order); at most
    ``per_phenomenon`` (the first ones) of each UID."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise UserInputError(f"--blimp {path}: no .jsonl files in this folder. Give BLiMP's data/ folder "
                                 "(github.com/alexwarstadt/blimp) or one of its files.")
    elif path.is_file():
        files = [path]
    else:
        raise UserInputError(f"--blimp {path} does not exist: give a folder of BLiMP's .jsonl files or one file, or "
                             "--blimp alone to read it from the Hugging Face Hub.")
    pairs, counts = [], defaultdict(int)
    for file in files:
        for number, line in enumerate(_text_lines(file), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserInputError(f"{file}, line {number}: not JSON ({exc.msg}).") from None
            if not isinstance(row, dict):
                raise UserInputError(f"{file}, line {number}: a BLiMP pair is a JSON object.")
            pair = _pair(row, f"{file}, line {number}")
            if per_phenomenon is None or counts[pair.uid] < per_phenomenon:
                counts[pair.uid] += 1
                pairs.append(pair)
    if not pairs:
        raise UserInputError(f"--blimp {path}: no pairs in {', '.join(str(f) for f in files[:3])}.")
    return pairs


def _text_lines(file: Path) -> list[str]:
    """A .jsonl file's lines as UTF-8 (JSON's encoding), a byte-order mark skipped as corpus files' is; other bytes
    named by line, with the fix."""
    data = file.read_bytes()
    try:
        return data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UserInputError(f"{file}, line {line}: not UTF-8 text (byte {data[exc.start]:#04x}); JSON lines are "
                             "UTF-8: convert the file (iconv -f latin1 -t utf-8), or use BLiMP's own files.") from None


def read_hub(per_phenomenon: int | None = None) -> list[Pair]:
    """Every phenomenon of ``nyu-mll/blimp`` (one config each) through ``datasets``, which caches the download."""
    try:
        import datasets
    except ImportError:
        raise UserInputError(f"--blimp without a PATH reads BLiMP from the Hugging Face Hub ({HUB_DATASET}) with the "
                             "datasets library, which is not installed: pip install datasets, or pass --blimp PATH "
                             "(a folder of BLiMP's .jsonl files: data/ of github.com/alexwarstadt/blimp).") from None
    split = f"train[:{per_phenomenon}]" if per_phenomenon else "train"
    pairs = []
    try:
        for uid in datasets.get_dataset_config_names(HUB_DATASET):
            rows = datasets.load_dataset(HUB_DATASET, uid, split=split)
            pairs += [_pair(row, f"{HUB_DATASET}/{uid}") for row in rows]
    except (OSError, ConnectionError, ValueError) as exc:
        raise UserInputError(f"Could not read {HUB_DATASET} from the Hub ({type(exc).__name__}: {exc}). Without a "
                             "network, pass --blimp PATH (a folder of BLiMP's .jsonl files).") from None
    return pairs


def load_pairs(source: str | os.PathLike = HUB_SOURCE, per_phenomenon: int | None = None) -> list[Pair]:
    """BLiMP's pairs from ``source``: a ``.jsonl`` file or a folder of them, or :data:`HUB_SOURCE` (the Hub)."""
    if per_phenomenon is not None and per_phenomenon < 1:
        raise UserInputError(f"--blimp_pairs {per_phenomenon}: give a number of pairs per phenomenon >= 1.")
    if str(source) == HUB_SOURCE:
        return read_hub(per_phenomenon)
    if str(source).startswith("hf://"):
        raise UserInputError(f"--blimp {source}: BLiMP on the Hub is {HUB_SOURCE} (--blimp alone reads it).")
    return read_local(source, per_phenomenon)


# -- progress ------------------------------------------------------------------------------------------------
class ScoringProgress:
    """How far the scoring is, counted in masked copies (the unit of work: a sentence of n tokens is n of them), over
    the model and its random inits together, so the time left covers them all. On a terminal (stderr) a bar; in a
    log or a pipe, where a bar's redraws would be hundreds of lines, a line a minute at most and one at the end."""

    def __init__(self, total: int, desc: str, terminal: bool | None = None, every_s: float = LOG_EVERY_S):
        self.total, self.desc, self.done, self.every_s = total, desc, 0, every_s
        self.started = self.logged = time.monotonic()
        self.bar = None
        if sys.stderr.isatty() if terminal is None else terminal:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=" masked", file=sys.stderr, dynamic_ncols=True,
                            mininterval=0.5)

    def describe(self, desc: str) -> None:
        """Name what is being scored now (the model, random init 2 of 3)."""
        self.desc = desc
        if self.bar is not None:
            self.bar.set_description_str(desc)

    def advance(self, rows: int) -> None:
        """``rows`` more masked copies scored."""
        self.done += rows
        if self.bar is not None:
            self.bar.update(rows)
        elif time.monotonic() - self.logged >= self.every_s and self.done < self.total:
            self.logged = time.monotonic()
            log.info("%s: %s", self.desc, self._said())

    def _said(self) -> str:
        spent = time.monotonic() - self.started
        left = spent * (self.total - self.done) / self.done if self.done else float("nan")
        return (f"{self.done:,} of {self.total:,} masked copies scored ({self.done / max(self.total, 1):.0%}), "
                f"{hms(spent)} spent, about {hms(left)} left")

    def close(self) -> None:
        """The bar closed where it was drawn; elsewhere one last line once all is scored, so a log shows the end."""
        if self.bar is not None:
            self.bar.close()
        elif self.done >= self.total:
            log.info("BLiMP scored: %s", self._said().split(", about")[0])


# -- pseudo-log-likelihood ---------------------------------------------------------------------------------
def pseudo_log_likelihoods(model: InferenceModel, sentences: list[list[int]], mask_id: int,
                           batch_rows: int = BATCH_ROWS, progress: ScoringProgress | None = None) -> np.ndarray:
    """Per sentence (token ids with its [CLS] and [SEP]): the sum over its other tokens of log p(token) with that
    token masked. Every masked copy is one row; rows go ``batch_rows`` at a time through ``model.outputs``."""
    seq, pred = model.max_seq_length, model.max_predictions_per_seq
    rows = [(s, i) for s, ids in enumerate(sentences) for i in range(1, len(ids) - 1)]
    scores = np.zeros(len(sentences))
    for start in range(0, len(rows), batch_rows):
        chunk = rows[start:start + batch_rows]
        ids = np.zeros((batch_rows, seq), np.int32)
        positions = np.zeros((batch_rows, pred), np.int32)
        targets = np.zeros(len(chunk), np.int64)
        for r, (s, i) in enumerate(chunk):
            ids[r, :len(sentences[s])] = sentences[s]
            targets[r] = sentences[s][i]
            ids[r, i] = mask_id
            positions[r, 0] = i
        logits = model.outputs(ids, np.zeros_like(ids), positions)[0][:len(chunk), 0].astype(np.float64)
        peak = logits.max(axis=-1)
        log_norm = peak + np.log(np.exp(logits - peak[:, None]).sum(axis=-1))
        np.add.at(scores, [s for s, _ in chunk], logits[np.arange(len(chunk)), targets] - log_norm)
        if progress is not None:
            progress.advance(len(chunk))
    return scores


def scoring_model(trained: TrainedModel, length: int) -> InferenceModel:
    """The trained model at ``length`` tokens and one prediction a row (BLiMP's sentences are short: a run's
    128 or 512 would cost many times more), its weights copied by name; the model itself where it already fits."""
    model = trained.model
    if model.max_seq_length == length and model.max_predictions_per_seq == 1:
        return model
    short = build_inference(model.backend, model.config, length, 1, model.with_nsp)
    short.load_stored_weights(model.stored_weights(), trained.weights)
    return short


@dataclass
class Encoded:
    """The pairs that fit the model, tokenized once for the model and every random init of its shape."""

    pairs: list[Pair]
    sentences: list[list[int]]  # good, bad, good, bad, ...: token ids with [CLS] and [SEP]
    mask_id: int
    unk_share: float
    skipped: int

    @property
    def rows(self) -> int:
        """Masked copies one model scores: one per token of every sentence."""
        return sum(len(s) - 2 for s in self.sentences)


def encode(trained: TrainedModel, pairs: list[Pair]) -> Encoded:
    """Tokenize every pair with the run's vocab: a vocab that cannot spell English is warned about, a pair longer
    than the model's positions skipped (and counted)."""
    tokenizer = load_tokenizer(trained.vocab_file, trained.do_lower_case)
    encoded = tokenizer.encode_batch([s for p in pairs for s in (p.good, p.bad)])
    sentences = [[tokenizer.cls_id, *map(int, ids), tokenizer.sep_id] for ids in encoded]
    tokens = sum(len(s) - 2 for s in sentences)
    unk_share = sum(int(np.sum(np.asarray(ids) == tokenizer.unk_id)) for ids in encoded) / max(tokens, 1)
    if unk_share > UNK_WARNING:
        log.warning("The vocab %s makes %.0f%% of BLiMP's tokens [UNK]: BLiMP is English, and these figures say "
                    "little about a model whose vocab cannot spell it.", trained.vocab_file, 100 * unk_share)
    fits = [max(len(sentences[2 * n]), len(sentences[2 * n + 1])) <= trained.max_seq_length for n in range(len(pairs))]
    if not all(fits):
        log.warning("%d BLiMP pairs are longer than the model's %d tokens: skipped.", fits.count(False),
                    trained.max_seq_length)
    kept = [n for n, ok in enumerate(fits) if ok]
    if not kept:
        raise UserInputError(f"No BLiMP pair fits the model's {trained.max_seq_length} tokens.")
    return Encoded([pairs[n] for n in kept], [sentences[i] for n in kept for i in (2 * n, 2 * n + 1)],
                   tokenizer.mask_id, unk_share, fits.count(False))


def right_answers(trained: TrainedModel, encoded: Encoded, batch_rows: int = BATCH_ROWS,
                  progress: ScoringProgress | None = None) -> np.ndarray:
    """Per pair, whether the model gives the grammatical sentence the higher pseudo-log-likelihood (a pair whose
    sentences tokenize alike, e.g. both [UNK], is wrong: the model cannot prefer either)."""
    sentences = encoded.sentences
    scores = np.zeros(len(sentences))
    buckets = defaultdict(list)  # sentences by the length they are scored at: a short one costs no long one's time
    for n, ids in enumerate(sentences):
        buckets[min(trained.max_seq_length, -(-len(ids) // LENGTH_STEP) * LENGTH_STEP)].append(n)
    for length, members in sorted(buckets.items()):
        scores[members] = pseudo_log_likelihoods(scoring_model(trained, length), [sentences[n] for n in members],
                                                 encoded.mask_id, batch_rows, progress)
    return (scores[0::2] > scores[1::2]) & ~ties(encoded)


def ties(encoded: Encoded) -> np.ndarray:
    """Per pair, whether its two sentences are the same tokens."""
    return np.array([encoded.sentences[2 * n] == encoded.sentences[2 * n + 1] for n in range(len(encoded.pairs))])


def tally(pairs: list[Pair], right: np.ndarray, key) -> dict:
    """Pairs, right answers and accuracy per group of pairs (``key(pair)`` names its group), in name order."""
    groups = defaultdict(list)
    for pair, ok in zip(pairs, right, strict=True):
        groups[key(pair)].append(ok)
    return {name: {"pairs": len(oks), "correct": int(sum(oks)), "accuracy": float(np.mean(oks))}
            for name, oks in sorted(groups.items())}


def field_of(pair: Pair) -> str:
    """The field a pair is tallied under."""
    return pair.field or "(no field)"


def uid_of(pair: Pair) -> str:
    """The phenomenon a pair is tallied under."""
    return pair.uid
