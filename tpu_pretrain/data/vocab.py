"""WordPiece vocab files: check an existing ``vocab.txt``, or build one from a corpus.

Building trains SentencePiece on a bounded random sample of the corpus, after BERT's own
pre-tokenisation (so no piece can span punctuation or a CJK character), and converts the pieces to
BERT's WordPiece form: word-initial pieces plain, continuation pieces with ``##``. The special tokens
come first, then ``[unusedN]`` placeholders for later domain tokens, then every character of the sample
(so nothing seen becomes [UNK]), then the pieces, to exactly the requested size.
"""

from __future__ import annotations

import collections
import hashlib
import io
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserInputError
from ..storage.local import disk_full_said, write_text_atomic
from .data_folder import VOCAB
from .tokenizer_json import TOKENIZER_JSON, is_tokenizer_json, tokenizer_json_file
from .vocab_tokenizer import SPECIAL_TOKENS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vocab:
    """A ``vocab_file`` setting resolved once: which kind of vocab it is, the file itself, its tokens (checked),
    its checksum and the name data and run folders keep their copy under. The data plan, its shard tasks and the
    run plan carry it, so no later step asks again what the setting names (its tokenizer:
    :func:`.tokenization.load_tokenizer`)."""

    setting: str  # as given: a vocab.txt, a tokenizer.json, or a model folder holding one
    source: Path  # the file itself
    is_tokenizer_json: bool  # a Hugging Face tokenizer.json (ModernBERT's byte-level BPE), else a WordPiece vocab.txt
    sha256: str
    tokens: list[str] = field(repr=False, compare=False)

    @classmethod
    def read(cls, vocab_file: str | os.PathLike) -> Vocab:
        tokens = load_vocab(vocab_file)
        source = _vocab_source(vocab_file)
        return cls(str(vocab_file), source, is_tokenizer_json(vocab_file),
                   hashlib.sha256(source.read_bytes()).hexdigest(), tokens)

    @property
    def kind(self) -> str:
        return TOKENIZER_JSON if self.is_tokenizer_json else "WordPiece vocab.txt"

    @property
    def copy_name(self) -> str:
        """The name a data or run folder keeps its copy under: ``vocab.txt`` or ``tokenizer.json``."""
        return TOKENIZER_JSON if self.is_tokenizer_json else VOCAB

    def __len__(self) -> int:
        return len(self.tokens)


def load_vocab(vocab_file: str | os.PathLike) -> list[str]:
    """Tokens of a vocab.txt (or a tokenizer.json, :mod:`.tokenizer_json`) in id order, checked for the special
    tokens BERT pretraining needs."""
    if is_tokenizer_json(vocab_file):
        from .tokenizer_json import tokenizer_tokens

        return tokenizer_tokens(vocab_file)
    path = _vocab_source(vocab_file)
    if Path(vocab_file).is_dir() and not path.is_file():
        raise UserInputError(f"Folder '{vocab_file}' holds no vocab.txt or {TOKENIZER_JSON} (check --vocab_file): "
                             "give the vocab file, or the folder of a model that has one.")
    if not path.is_file():
        raise UserInputError(f"Vocab file '{path}' does not exist (check --vocab_file).")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise UserInputError(f"Vocab file '{path}' is not UTF-8 text (line {line}); is it a vocab.txt?") from None
    except OSError as exc:
        raise UserInputError(f"Vocab file '{path}' cannot be read: {exc}.") from None
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    tokens = [t.rstrip("\r") for t in tokens]
    if not tokens:
        raise UserInputError(f"Vocab file '{path}' is empty.")
    for number, token in enumerate(tokens, 1):
        if len(token.split()) != 1 or token.strip() != token:
            raise UserInputError(
                f"Vocab file '{path}' line {number} is {token!r}: a WordPiece vocab has one token per line, "
                "no blanks or spaces. Is this a SentencePiece .vocab file? Build a vocab with `tpu-pretrain vocab`."
            )
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise UserInputError(
            f"Vocab file '{path}' lacks the special token(s) {', '.join(missing)} that BERT pretraining needs; "
            "use a BERT vocab.txt or build one with `tpu-pretrain vocab`."
        )
    duplicates = [t for t, n in collections.Counter(tokens).items() if n > 1]
    if duplicates:
        raise UserInputError(f"Vocab file '{path}' lists {len(duplicates)} token(s) twice, e.g. {duplicates[0]!r}.")
    return tokens


def replacement_ids(tokens: list[str]) -> list[int]:
    """Ids masking may draw a "random token" from: never a special token or an [unusedN] placeholder.

    Static masking (create-data) and dynamic masking (training) both draw from this list; a tokenizer.json's
    added tokens (its :class:`.tokenizer_json.TokenList` knows them) are never drawn either.
    """
    special, added = set(SPECIAL_TOKENS), getattr(tokens, "added_ids", frozenset())
    return [i for i, t in enumerate(tokens) if t not in special and not t.startswith("[unused") and i not in added]


def _vocab_source(vocab_file: str | os.PathLike) -> Path:
    """The file a vocab_file setting names: itself, or a model folder's tokenizer.json (else its vocab.txt)."""
    if is_tokenizer_json(vocab_file):
        return tokenizer_json_file(vocab_file)
    path = Path(vocab_file)
    return path / VOCAB if path.is_dir() else path


MIN_USES = 5  # a piece the sample's tokenisation uses fewer times is hardly learnt: an embedding spent on noise


@dataclass
class VocabResult:
    path: str
    vocab_size: int
    sample_lines: int
    characters: int
    pieces: int
    unused: int
    corpus_report: str
    padding: int = 0  # [unusedN] added because the sample yielded too few pieces for vocab_size
    continuation_characters: int = 0  # of ``characters``, the ##c forms
    rare_pieces: int = 0  # pieces the sample's tokenisation uses fewer than MIN_USES times
    advised_size: int = 0  # a size checked to say nothing more (0: none needed)

    def summary(self) -> str:
        plain = self.characters - self.continuation_characters
        characters = (f"{self.characters} characters ({plain} plain, {self.continuation_characters} ##)"
                      if self.continuation_characters else f"{self.characters} characters")
        # The placeholders asked for and those added for want of pieces are counted apart, in the order vocab.txt
        # holds them, so the warning's count of the extra ones is a number the first line gave.
        asked = f"{self.unused - self.padding} [unusedN]"
        extra = f" + {self.padding} extra [unusedN]" if self.padding else ""
        text = (
            f"Wrote {self.path}: {self.vocab_size} tokens = 5 special + {asked} + "
            f"{characters} + {self.pieces} SentencePiece pieces{extra}, "
            f"from a sample of {self.sample_lines} lines.\nCorpus: {self.corpus_report}"
        )
        if wants_fewer(self.padding, self.rare_pieces, self.pieces):
            said = [f"{self.rare_pieces} of the {self.pieces} pieces occur fewer than {MIN_USES} times in the "
                    "tokenised sample, too few to learn them from"] if self.pieces else []  # none: nothing to count
            if self.padding:
                said.append(f"the {self.padding} extra [unusedN] are placeholders the model never sees, added as the "
                            "sample yielded no more pieces")
            keeps = (f"keeps the pieces seen at least {MIN_USES} times" if self.pieces else
                     "the characters and tokens the sample gives")
            advised = self.advised_size or self.vocab_size - self.padding - self.rare_pieces  # first cut if unchecked
            text += (f"\nwarning: {'; and '.join(said)}. Use --vocab_size {advised} --overwrite ({keeps}), or give "
                     "more text (more --input, a larger --vocab_sample_lines).")
        return text


def build_vocab(config, overwrite: bool = False) -> VocabResult:
    """Train SentencePiece on a sample of ``config.corpus.input`` and write ``output_dir/vocab.txt``.

    An existing vocab.txt (a released model's, say) is never replaced unless ``overwrite``.
    """
    from ..storage.local import check_writable_folder
    from .corpus import CorpusReader

    c, v, d = config.corpus, config.vocab, config.data
    out = check_writable_folder(config.storage.output_dir or ".") / "vocab.txt"
    if out.exists() and not overwrite:
        raise UserInputError(f"{out} already exists and was left alone: choose another --output_dir, or pass "
                             "--overwrite (Python: build_vocab(config, overwrite=True)) to replace it.")
    reader = CorpusReader(c.input, c, do_lower_case=d.do_lower_case)
    sample = reader.sample_lines(v.vocab_sample_lines, d.random_seed)
    if not sample:
        raise UserInputError(f"The corpus ({', '.join(reader.files[:3])}) has no usable line to build a vocab from: "
                             f"{reader.stats.report()}.")
    words_per_line = pretokenize(sample, d.do_lower_case)
    vocab = _vocab_of_size(words_per_line, v.vocab_size, v, d.random_seed)
    _write_vocab(out, vocab.tokens)
    return VocabResult(str(out), len(vocab.tokens), len(sample), vocab.characters, vocab.pieces,
                       v.num_unused_tokens + vocab.padding, reader.stats.report(), padding=vocab.padding,
                       continuation_characters=vocab.continuation_characters, rare_pieces=vocab.rare_pieces,
                       advised_size=_settled_size(words_per_line, vocab, v, d.random_seed))


def wants_fewer(padding: int, rare_pieces: int, pieces: int) -> bool:
    """Whether the entries the sample cannot teach (placeholders it yielded no pieces for, rare pieces) are over a
    quarter of its pieces: a few are the price of any size; thousands are a model spent on noise."""
    return padding + rare_pieces > pieces // 4


@dataclass
class _SizedVocab:
    tokens: list[str]
    characters: int
    continuation_characters: int
    pieces: int
    padding: int
    rare_pieces: int


def _vocab_of_size(words_per_line: list[list[str]], vocab_size: int, v, seed: int) -> _SizedVocab:
    """The vocab of one size from the sample, with the counts its summary and its advice need."""
    tokens, n_chars, n_pieces = wordpiece_tokens(words_per_line, vocab_size, v.num_unused_tokens,
                                                 v.sentencepiece_model_type, seed)
    padding = sum(t.startswith("[unused") for t in tokens) - v.num_unused_tokens
    first_piece = len(tokens) - padding - n_pieces
    uses = token_uses(tokens, words_per_line)
    return _SizedVocab(tokens, n_chars, sum(t.startswith("##") for t in tokens[:first_piece]), n_pieces, padding,
                       sum(n < MIN_USES for n in uses[first_piece:first_piece + n_pieces]))


def _settled_size(words_per_line: list[list[str]], vocab: _SizedVocab, v, seed: int, rounds: int = 4) -> int:
    """The size to advise, built and checked here: a smaller vocab learns other pieces, some of them rare again, so
    the first cut (drop the placeholders and the rare pieces) is rebuilt until the warning would not come back."""
    size = 0
    for _ in range(rounds):
        if not wants_fewer(vocab.padding, vocab.rare_pieces, vocab.pieces):
            break
        size = len(vocab.tokens) - vocab.padding - vocab.rare_pieces
        vocab = _vocab_of_size(words_per_line, size, v, seed)
    return size


def _write_vocab(out: Path, tokens: list[str]) -> None:
    """vocab.txt written whole or not at all; a full disk said in one line, as create-data says it."""
    with disk_full_said(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, "\n".join(tokens) + "\n")


def token_uses(tokens: list[str], words_per_line: list[list[str]]) -> list[int]:
    """How often WordPiece uses each token to spell the sample: a piece merged on the way to a longer one may be
    used rarely, or never."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = collections.Counter(word for words in words_per_line for word in words)
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                           max_input_chars_per_word=100))  # BERT's, as the data's tokenizer
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    distinct = list(words)
    uses = [0] * len(tokens)
    for word, encoding in zip(distinct, tokenizer.encode_batch(distinct, add_special_tokens=False), strict=True):
        for i in encoding.ids:
            uses[i] += words[word]
    return uses


def pretokenize(lines: list[str], do_lower_case: bool) -> list[list[str]]:
    """BERT's basic tokenisation (Hugging Face implementation): the words WordPiece will later see."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
    )
    pre = pre_tokenizers.BertPreTokenizer()
    return [[w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(line))] for line in lines]


def wordpiece_tokens(
    words_per_line: list[list[str]], vocab_size: int, num_unused: int, model_type: str, seed: int
) -> tuple[list[str], int, int]:
    """The vocab's tokens: specials, [unusedN], every sample character, then converted pieces."""
    initial_chars: collections.Counter[str] = collections.Counter()
    inner_chars: collections.Counter[str] = collections.Counter()
    for words in words_per_line:
        for word in words:
            initial_chars[word[0]] += 1
            inner_chars.update(word[1:])
    char_tokens = [ch for ch, _ in initial_chars.most_common()]
    char_tokens += [ch for ch, _ in inner_chars.most_common() if ch not in initial_chars]
    char_tokens += ["##" + ch for ch, _ in inner_chars.most_common()]
    fixed = len(SPECIAL_TOKENS) + num_unused + len(char_tokens)
    if fixed > vocab_size:
        raise UserInputError(
            f"vocab_size={vocab_size} is too small: the sample has {len(char_tokens)} distinct characters and "
            f"continuation characters, which with 5 special tokens and num_unused_tokens={num_unused} need "
            f"{fixed}; raise vocab_size to at least {fixed} (about {fixed + 1000} leaves room for a thousand word "
            "pieces) or lower num_unused_tokens."
        )
    tokens = list(SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(num_unused)] + char_tokens
    seen = set(tokens)
    pieces = 0
    for piece in train_sentencepiece(words_per_line, vocab_size, model_type, seed):
        if len(tokens) >= vocab_size:
            break
        if len(piece) == 1:
            continue  # single characters are already covered, in the forms BERT's splitting allows
        token = piece[1:] if piece.startswith("\u2581") else "##" + piece
        if token in ("", "##") or token in seen or "\u2581" in token:
            continue
        tokens.append(token)
        seen.add(token)
        pieces += 1
    extra = num_unused
    while len(tokens) < vocab_size:  # a small corpus has fewer pieces than asked: reserve the rest
        tokens.append(f"[unused{extra}]")
        extra += 1
    return tokens, len(char_tokens), pieces


def train_sentencepiece(words_per_line: list[list[str]], vocab_size: int, model_type: str, seed: int) -> list[str]:
    """SentencePiece pieces, best first, learnt from space-joined pre-tokenised words."""
    import sentencepiece as spm

    lines = [" ".join(words) for words in words_per_line if words]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        hard_vocab_limit=False,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        split_by_whitespace=True,
        max_sentence_length=1 << 16,
        num_threads=os.cpu_count() or 1,
        input_sentence_size=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_unknown(i) or processor.is_control(i))
    ]
