"""A Hugging Face ``tokenizer.json`` as the data's vocab: a released model's own tokenizer (ModernBERT's byte-level
BPE), so that its pretraining can be continued on ids that mean what they meant to it.

The file's normaliser, pre-tokeniser and model are used as they are; text is encoded without the post-processor's
[CLS]/[SEP] (instances add their own), and a special token typed in the text stays text. It must hold BERT's five
special tokens by name ([PAD] [UNK] [CLS] [SEP] [MASK], at any ids). Whole-word masking needs to know which tokens
continue a word: a WordPiece model's ``##`` pieces; otherwise (byte-level BPE, SentencePiece) every token that
does not start with the word-start marker (``Ġ``, ``▁``), except special, added and punctuation-only tokens.
"""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

import numpy as np

from ..errors import UserInputError
from .vocab_tokenizer import SPECIAL_TOKENS, VocabTokenizer

TOKENIZER_JSON = "tokenizer.json"
WORD_START_MARKERS = ("Ġ", "▁")  # byte-level BPE's encoded space, SentencePiece's


def is_tokenizer_json(path: str | os.PathLike) -> bool:
    """Whether a vocab_file setting names a tokenizer.json (any ``.json`` file, ``.JSON`` too, or a folder with one)."""
    path = Path(path)
    return path.suffix.lower() == ".json" if not path.is_dir() else (path / TOKENIZER_JSON).is_file()


def tokenizer_json_file(path: str | os.PathLike) -> Path:
    """The file itself: ``path``, or ``path/tokenizer.json`` for a model folder."""
    path = Path(path)
    return path / TOKENIZER_JSON if path.is_dir() else path


def _punctuation_only(token: str) -> bool:
    return bool(token) and all(unicodedata.category(ch)[0] in "PS" for ch in token)


class TokenList(list):
    """A tokenizer.json's tokens in id order (ids it leaves unused as ``[unused id N]``), knowing its added tokens,
    which masking never draws as a "random token"."""

    def __init__(self, tokens: list[str], added_ids: frozenset[int]):
        super().__init__(tokens)
        self.added_ids = added_ids


class TokenizerJson(VocabTokenizer):
    """A ``tokenizer.json`` with the interface of :class:`.tokenization.BertTokenizer`. ``do_lower_case`` is
    ignored: casing is the file's normaliser's business."""

    def __init__(self, vocab_file: str | os.PathLike, do_lower_case: bool = False):
        from tokenizers import Tokenizer

        path = tokenizer_json_file(vocab_file)
        self.vocab_file, self.do_lower_case = str(path), False
        spec = read_tokenizer_json(path)
        try:
            tokenizer = Tokenizer.from_str(json.dumps(spec))
        except Exception as exc:  # tokenizers raises a bare Exception for a spec it cannot build
            raise UserInputError(f"{path} is not a tokenizer.json that Hugging Face tokenizers can load: {exc}.") \
                from None
        self.vocab = tokenizer.get_vocab(with_added_tokens=True)
        missing = [t for t in SPECIAL_TOKENS if t not in self.vocab]
        if missing:
            raise UserInputError(f"Tokenizer file {path} lacks the special token(s) {', '.join(missing)} that "
                                 "masked-LM pretraining needs (by these names, at any ids), as ModernBERT's has them.")
        added = tokenizer.get_added_tokens_decoder()
        inv = [f"[unused id {i}]" for i in range(max(self.vocab.values()) + 1)]
        for token, index in self.vocab.items():
            inv[index] = token
        self.inv_vocab = TokenList(inv, frozenset(added))
        self._name_special_ids()
        self.is_continuation = continuation_flags(self.inv_vocab, spec)
        tokenizer.encode_special_tokens = True  # "[MASK]" in the corpus is text, not the mask token
        self._tokenizer = tokenizer

    def word_continuations(self, ids: np.ndarray) -> np.ndarray:
        """Per token of a sentence: whether it continues the previous token's word. A sentence's first token starts
        one, though it has no word-start marker (``add_prefix_space`` off, as ModernBERT's tokenizer has it)."""
        flags = self.is_continuation[ids]
        flags[:1] = False
        return flags

    def join_pieces(self, tokens: list[str]) -> str:
        """One word from its pieces, as text (fill-mask's candidates)."""
        return self._tokenizer.decoder.decode(tokens).strip() if self._tokenizer.decoder else "".join(tokens)


def read_tokenizer_json(path: Path) -> dict:
    """The file's JSON, with errors that name it."""
    if not path.is_file():
        raise UserInputError(f"Tokenizer file '{path}' does not exist (check --vocab_file).")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"Tokenizer file '{path}' is not valid JSON ({exc}); give a Hugging Face "
                             "tokenizer.json (or a model folder holding one) or a WordPiece vocab.txt.") from None
    if not isinstance(spec, dict) or "model" not in spec:
        raise UserInputError(f"Tokenizer file '{path}' is JSON but not a Hugging Face tokenizer.json (no \"model\").")
    return spec


def _byte_level_text(token: str) -> str | None:
    """A byte-level token's text; None for part of a character (bytes that are not whole UTF-8)."""
    try:
        return bytes(_BYTE_OF_CHAR[ch] for ch in token).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return None


def _gpt2_byte_chars() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (what byte-level BPE's tokens are spelt in), to its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_BYTE_OF_CHAR = _gpt2_byte_chars()


def continuation_flags(tokens: TokenList, spec: dict) -> np.ndarray:
    """Per id: whether the token continues the previous token's word (for whole-word masking). A byte-level token
    is judged by its bytes: part of a character always continues, punctuation is its own word."""
    model = spec.get("model") or {}
    if model.get("type") == "WordPiece":
        prefix = model.get("continuing_subword_prefix") or "##"
        return np.array([t.startswith(prefix) for t in tokens], dtype=bool)
    byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))

    def continues(token: str) -> bool:
        if token.startswith(WORD_START_MARKERS) or token.startswith("[unused id "):
            return False
        text = _byte_level_text(token) if byte_level else token
        return text is None or not _punctuation_only(text)

    flags = np.array([continues(t) for t in tokens], dtype=bool)
    flags[list(tokens.added_ids)] = False
    return flags


def tokenizer_tokens(vocab_file: str | os.PathLike) -> TokenList:
    """The tokens of a tokenizer.json in id order, its special tokens checked."""
    return TokenizerJson(vocab_file).inv_vocab
