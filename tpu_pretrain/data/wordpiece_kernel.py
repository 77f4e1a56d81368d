"""BERT's tokenisation of ASCII words, compiled (numba): create-data's tokeniser, the same ids as ``tokenizers``.

A space always separates words in BERT's tokenisation, so a text's ids are those of its space-separated chunks one
after another. On a chunk of printable ASCII, BERT's normaliser has nothing to do but lower-case, and its
pre-tokeniser makes every non-alphanumeric character a word of its own: what remains is the greedy longest-match
WordPiece, here one loop over the bytes of a whole block with the vocab in an open-addressing hash table. Chunks
with any other character (accents, CJK, controls), with the spaces between such neighbours, go to Hugging Face
``tokenizers`` in one batch and their ids are spliced in. The tests compare the result on every corpus line.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .compiled import njit

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_CONTINUATION = np.uint64(0x9E3779B97F4A7C15)  # mixed into the hashes of ``##`` pieces: one table holds both kinds
_SPACE = 32
_LOWER = np.array([b + 32 if 65 <= b <= 90 else b for b in range(256)], dtype=np.uint8)  # A-Z only: UTF-8 intact
_ALPHANUMERIC = np.array([chr(b).isalnum() and b < 128 for b in range(256)], dtype=np.bool_)


class WordPieceTable:
    """The vocab's ASCII tokens in a hash table, word-initial pieces and ``##`` continuations apart, and the
    tokenisation of texts with it."""

    def __init__(self, vocab: dict[str, int], unk_id: int, lower_case: bool, max_word_chars: int):
        self.unk_id, self.lower_case, self.max_word_chars = unk_id, lower_case, max_word_chars
        keys = [(token, False, index) for token, index in vocab.items() if token.isascii()]
        keys += [(token[2:], True, index) for token, index in vocab.items()
                 if token.isascii() and token.startswith("##") and len(token) > 2]
        self.bytes = np.frombuffer("".join(key for key, _, _ in keys).encode("ascii") or b"\0", dtype=np.uint8)
        self.lengths = np.array([len(key) for key, _, _ in keys], dtype=np.int64)
        self.starts = np.zeros(len(keys), dtype=np.int64)
        self.starts[1:] = np.cumsum(self.lengths)[:-1]
        self.continuation = np.array([c for _, c, _ in keys], dtype=np.bool_)
        self.ids = np.array([index for _, _, index in keys], dtype=np.int32)
        self.slots = _fill_slots(self.bytes, self.starts, self.lengths, self.continuation,
                                 1 << max(4, (2 * len(keys)).bit_length()))
        self.longest = int(self.lengths.max()) if len(keys) else 0

    def encode(self, texts: list[str], fallback: Callable[[list[str]], list[list[int]]]) -> list[np.ndarray]:
        """Token ids of each text, the ASCII words in one compiled call; ``fallback`` tokenises the rest."""
        # writable, like its lower-cased copy: one compiled signature whether the vocab is cased or not
        raw = np.frombuffer(bytearray("".join(texts).encode("utf-8", "surrogatepass") or b"\0"), dtype=np.uint8)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts],
                  out=offsets[1:])
        ids, id_offsets, span_starts, span_ends = wordpiece(
            raw, _LOWER[raw] if self.lower_case else raw, offsets, self.bytes, self.starts, self.lengths,
            self.continuation, self.ids, self.slots, self.longest, self.unk_id, self.max_word_chars)
        if len(span_starts):
            raw_bytes = raw.tobytes()
            spans = fallback([raw_bytes[a:b].decode("utf-8", "surrogatepass")
                              for a, b in zip(span_starts.tolist(), span_ends.tolist(), strict=True)])
            span_offsets = np.zeros(len(spans) + 1, dtype=np.int64)
            np.cumsum([len(s) for s in spans], out=span_offsets[1:])
            span_ids = np.fromiter((i for s in spans for i in s), dtype=np.int32, count=int(span_offsets[-1]))
            ids, id_offsets = _splice(ids, id_offsets, span_ids, span_offsets)
        return np.split(ids, id_offsets[1:-1])


@njit()
def _hash(text, start, end, continuation):
    h = _FNV_OFFSET ^ (_CONTINUATION if continuation else np.uint64(0))
    for k in range(start, end):
        h = (h ^ np.uint64(text[k])) * _FNV_PRIME
    return h


@njit()
def _fill_slots(data, starts, lengths, continuation, size):
    """Open addressing, linear probing, the table at most half full."""
    slots = np.full(size, -1, dtype=np.int64)
    mask = np.uint64(size - 1)
    for key in range(len(starts)):
        slot = _hash(data, starts[key], starts[key] + lengths[key], continuation[key]) & mask
        while slots[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        slots[slot] = key
    return slots


@njit()
def _find(text, start, end, continuation, data, starts, lengths, key_continuation, ids, slots):
    """The id of ``text[start:end]`` as a word-initial piece or a continuation, or -1."""
    mask = np.uint64(len(slots) - 1)
    slot = _hash(text, start, end, continuation) & mask
    length = end - start
    while slots[slot] >= 0:
        key = slots[slot]
        if lengths[key] == length and key_continuation[key] == continuation:
            same = True
            for k in range(length):
                if data[starts[key] + k] != text[start + k]:
                    same = False
                    break
            if same:
                return ids[key]
        slot = (slot + np.uint64(1)) & mask
    return -1


@njit()
def _word_pieces(text, start, end, out, count, data, starts, lengths, key_continuation, ids, slots, longest, unk_id,
                 max_word_chars):
    """WordPiece of the word ``text[start:end]`` into ``out`` from ``count``; the new count."""
    if end - start > max_word_chars:
        out[count] = unk_id
        return count + 1
    first = count
    position = start
    while position < end:
        piece_end = min(end, position + longest)
        found = -1
        while piece_end > position:
            found = _find(text, position, piece_end, position > start, data, starts, lengths, key_continuation, ids,
                          slots)
            if found >= 0:
                break
            piece_end -= 1
        if found < 0:  # one piece missing: the whole word is unknown
            out[first] = unk_id
            return first + 1
        out[count] = found
        count += 1
        position = piece_end
    return count


@njit()
def wordpiece(raw, text, offsets, data, starts, lengths, key_continuation, ids, slots, longest, unk_id,
              max_word_chars):
    """Ids of every text ``raw[offsets[i]:offsets[i + 1]]`` (UTF-8; ``text`` is it lower-cased where the vocab is),
    flat, where each text's ids start, and the byte spans left to the fallback: each stands in the ids as
    ``-1 - its index``."""
    out = np.empty(len(raw), dtype=np.int32)  # every id, and every span, takes at least one byte
    out_offsets = np.zeros(len(offsets), dtype=np.int64)
    span_starts = np.empty(len(raw) // 2 + 1, dtype=np.int64)  # spans are a space apart at least
    span_ends = np.empty(len(raw) // 2 + 1, dtype=np.int64)
    count = 0
    spans = 0
    for t in range(len(offsets) - 1):
        position, end_of_text = offsets[t], offsets[t + 1]
        in_span = False  # the last chunk went to the fallback: the next one, if it goes too, joins its span
        while position < end_of_text:
            if raw[position] == _SPACE:
                position += 1
                continue
            chunk_end = position
            plain = True
            while chunk_end < end_of_text and raw[chunk_end] != _SPACE:
                plain = plain and 33 <= raw[chunk_end] <= 126
                chunk_end += 1
            if not plain:
                if not in_span:
                    span_starts[spans] = position
                    out[count] = -1 - spans
                    count += 1
                    spans += 1
                    in_span = True
                span_ends[spans - 1] = chunk_end
                position = chunk_end
                continue
            in_span = False
            while position < chunk_end:  # words: runs of letters and digits; any other character is one of its own
                word_end = position + 1
                if _ALPHANUMERIC[text[position]]:
                    while word_end < chunk_end and _ALPHANUMERIC[text[word_end]]:
                        word_end += 1
                count = _word_pieces(text, position, word_end, out, count, data, starts, lengths, key_continuation,
                                     ids, slots, longest, unk_id, max_word_chars)
                position = word_end
        out_offsets[t + 1] = count
    return out[:count], out_offsets, span_starts[:spans], span_ends[:spans]


@njit()
def _splice(ids, offsets, span_ids, span_offsets):
    """``ids`` with each span's stand-in replaced by the span's ids, and the texts' new offsets."""
    total = 0
    for token in ids:
        total += 1 if token >= 0 else span_offsets[-token] - span_offsets[-1 - token]
    out = np.empty(total, dtype=np.int32)
    new_offsets = np.zeros(len(offsets), dtype=np.int64)
    count = 0
    for t in range(len(offsets) - 1):
        for k in range(offsets[t], offsets[t + 1]):
            token = ids[k]
            if token >= 0:
                out[count] = token
                count += 1
            else:
                for j in range(span_offsets[-1 - token], span_offsets[-token]):
                    out[count] = span_ids[j]
                    count += 1
        new_offsets[t + 1] = count
    return out, new_offsets
