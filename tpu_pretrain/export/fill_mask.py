"""Fill-mask: the model's top whole-word candidates for each ``[MASK]`` slot of a sentence.

``[MASK][MASK]`` (no space) asks for one word of two WordPieces, ``play[MASK]`` for the end of a word,
``[MASK] [MASK]`` for two words; a ``[SEP]`` in the text starts a second segment (the NSP probability is
then reported too). Candidates are found by a small beam search over the slot's pieces, never proposing
a token the slot rules out (special tokens, ``[unusedN]``, a continuation piece where a word starts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..data.tokenization import load_tokenizer
from ..errors import UserInputError
from .rebuild import TrainedModel

MASK = "[MASK]"


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


def fill_mask(trained: TrainedModel, sentences, top_k: int = 5) -> list[dict]:
    """Predict every [MASK] slot of each sentence: top-k whole words with probabilities and the filled text.

    ``[MASK][MASK]`` (no space) asks for one word of two WordPieces; ``[MASK] [MASK]`` for two words.
    Probabilities are the model's softmax over the vocabulary (product over a slot's pieces).
    """
    tokenizer = load_tokenizer(trained.vocab_file, trained.do_lower_case)
    inv_vocab = tokenizer.inv_vocab
    added = getattr(inv_vocab, "added_ids", frozenset())  # a tokenizer.json's added tokens
    allowed = np.array([not (t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]") or t.startswith("[unused") or i in added)
                        for i, t in enumerate(inv_vocab)])
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
            outputs = trained.model.outputs(np.array([ids + [0] * pad], np.int32),
                                            np.array([segments + [0] * pad], np.int32),
                                            np.array([part + [0] * (pred - len(part))], np.int32))
            logits.append(outputs[0][0, :len(part)])
            if len(outputs) > 1:
                nsp = _softmax(outputs[1][0].astype(np.float64))
        probs = _softmax(np.concatenate(logits).astype(np.float64)) if positions else np.zeros((0, len(inv_vocab)))
        item = {"text": text, "tokens": tokenizer.convert_ids_to_tokens(ids), "masks": []}
        offset, filled, shift = 0, text, 0
        for slot in slots:
            slot_probs = probs[offset:offset + len(slot.positions)]
            offset += len(slot.positions)
            candidates = []
            for piece_ids, score in _slot_candidates(slot_probs, slot, allowed, continuation, cjk, top_k):
                pieces = tokenizer.convert_ids_to_tokens(piece_ids)
                word = tokenizer.join_pieces(pieces)
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
        pieces = len(slot["positions"])
        if pieces == 1:
            words = ", ".join(f"{c['word']} ({_probability(c['probability'])})" for c in slot["candidates"])
            lines.append(f"    mask {n}: {words}")
            continue
        # A word of several pieces: their joint probability is small by nature; the per-piece mean compares.
        words = ", ".join(f"{c['word']} ({_probability(c['probability'])}; {c['probability'] ** (1 / pieces):.3f} "
                          "per piece)" for c in slot["candidates"])
        lines.append(f"    mask {n} ({pieces} pieces, joint probability; per piece: its geometric mean): {words}")
    if "is_next_probability" in item:
        lines.append(f"    P(second segment follows the first) = {item['is_next_probability']:.3f}")
    return "\n".join(lines)


def _probability(p: float) -> str:
    """Three decimals, or two significant digits below 0.001 (never a ``0.000`` that is not zero)."""
    return f"{p:.3f}" if p >= 0.001 or p == 0 else f"{p:.1e}"
