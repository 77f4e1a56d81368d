"""A plain-Python statement of BERT's original tokenisation and instance algorithm, for parity tests.

Written from the description of Google's ``tokenization.py`` (FullTokenizer: BasicTokenizer +
WordpieceTokenizer) and ``create_pretraining_data.py``: slow and obvious, so the fast versions in
the package can be checked against it.
"""

from __future__ import annotations

import unicodedata


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def basic_tokenize(text: str, do_lower_case: bool) -> list[str]:
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        cleaned.append(" " if _is_whitespace(ch) else ch)
    spaced = []
    for ch in cleaned:
        spaced.append(f" {ch} " if _is_cjk(ord(ch)) else ch)
    words = []
    for token in "".join(spaced).split():
        if do_lower_case:
            token = token.lower()
            token = "".join(c for c in unicodedata.normalize("NFD", token) if unicodedata.category(c) != "Mn")
        current = ""
        for ch in token:
            if _is_punctuation(ch):
                if current:
                    words.append(current)
                words.append(ch)
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return " ".join(words).split()


def wordpiece(word: str, vocab: set[str], max_chars: int = 100) -> list[str]:
    if len(word) > max_chars:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        found = None
        while start < end:
            candidate = word[start:end] if start == 0 else "##" + word[start:end]
            if candidate in vocab:
                found = candidate
                break
            end -= 1
        if found is None:
            return ["[UNK]"]
        pieces.append(found)
        start = end
    return pieces


def full_tokenize(text: str, vocab: set[str], do_lower_case: bool) -> list[str]:
    return [piece for word in basic_tokenize(text, do_lower_case) for piece in wordpiece(word, vocab)]


def random_next_share(docs_lengths: list[list[int]], max_seq_length: int, short_seq_prob: float, dupe_factor: int,
                      seed: int) -> float:
    """Share of random-next instances the original algorithm makes from documents of sentence lengths."""
    import random

    rng = random.Random(seed)
    random_next = total = 0
    max_num_tokens = max_seq_length - 3
    for _ in range(dupe_factor):
        for doc in docs_lengths:
            target = max_num_tokens
            if rng.random() < short_seq_prob:
                target = rng.randint(2, max_num_tokens)
            chunk, length, i = [], 0, 0
            while i < len(doc):
                chunk.append(doc[i])
                length += doc[i]
                if i == len(doc) - 1 or length >= target:
                    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                    if len(chunk) == 1 or rng.random() < 0.5:
                        random_next += 1
                        i -= len(chunk) - a_end
                    total += 1
                    chunk, length = [], 0
                i += 1
    return random_next / total


def segment_pairs(docs: list[list[list[int]]], doc_index: int, max_seq_length: int, short_seq_prob: float,
                  nsp: bool, rng) -> list[tuple[list[int], list[int], bool]]:
    """Google's ``create_instances_from_document`` on token lists, written out: (A, B, is_random_next) per pair.

    Truncation removes tokens one at a time from the longer segment (B on ties) as ``truncate_seq_pair`` does;
    how many of a segment's removals come from its front (each with p=0.5) is drawn as a popcount of that many
    random bits, A's then B's: the order the package draws its random numbers in, so the two compare on one seed.
    A pair is kept when A is not empty and B is not either (unless without NSP).
    """
    document = docs[doc_index]
    max_num_tokens = max_seq_length - 3
    target = rng.randint(2, max_num_tokens) if rng.random() < short_seq_prob else max_num_tokens
    pairs, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for s in chunk[:a_end] for t in s]
            random_next = nsp and len(docs) > 1 and (len(chunk) == 1 or rng.random() < 0.5)
            if random_next:
                for _ in range(10):
                    other = rng.randint(0, len(docs) - 1)
                    if other != doc_index:
                        break
                tokens_b = []
                for sentence in docs[other][rng.randint(0, len(docs[other]) - 1):]:
                    tokens_b += sentence
                    if len(tokens_b) >= target - len(tokens_a):
                        break
                i -= len(chunk) - a_end
            else:
                tokens_b = [t for s in chunk[a_end:] for t in s]
            cut = {"a": 0, "b": 0}
            while len(tokens_a) - cut["a"] + len(tokens_b) - cut["b"] > max_num_tokens:
                cut["a" if len(tokens_a) - cut["a"] > len(tokens_b) - cut["b"] else "b"] += 1
            segments = []
            for tokens, name in ((tokens_a, "a"), (tokens_b, "b")):
                front = bin(rng.getrandbits(cut[name])).count("1") if cut[name] else 0
                segments.append(tokens[front:len(tokens) - cut[name] + front])
            if segments[0] and (segments[1] or not nsp):
                pairs.append((segments[0], segments[1], random_next))
            chunk, length = [], 0
        i += 1
    return pairs
