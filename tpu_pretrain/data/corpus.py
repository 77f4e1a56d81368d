"""Read a raw text corpus as a stream of normalised documents.

Input follows the original BERT scripts: one sentence (or paragraph) per line, a blank line between
documents; a configurable separator line (e.g. ``%``) also ends a document. Parquet tables (local files,
a Hub dataset: :mod:`.corpus_tables`, :mod:`.hub_datasets`) give one document a row, its text's lines
its sentences, so the same text as rows or as a file makes the same documents. Input is streamed,
never loaded whole, so corpus size does not bound memory; ``max_documents``/``max_bytes`` stop early.
Small problems in the input (a few undecodable bytes, over-long lines, empty files or rows) are counted
and reported with their location; a file that is not text at all is refused before the work starts
(:mod:`.corpus_files`).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..config import CorpusConfig
from ..errors import UserInputError
from ..storage.download import fetch, is_remote
from .corpus_files import DAMAGED_STREAM, check_text_file, open_corpus_file, read_error
from .corpus_tables import TableFile, check_table, is_parquet, split_options, table_rows
from .hub_datasets import dataset_tables, is_hub_url

log = logging.getLogger(__name__)

CORPUS_SUFFIXES = (".txt", ".gz", ".text", ".bz2", ".xz", ".zip", ".parquet")
_EXAMPLES_KEPT = 5
_MARKER_LENGTH, _MARKER_KINDS = 5, 20  # a line that may separate documents: its length, the kinds counted
_SKIP = object()  # a line that is dropped without ending a document

# ANSI/VT100 escape sequences (CSI ... final byte, OSC ... BEL/ST, and two-byte ESC sequences).
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# Control, invisible format and private-use characters BERT's tokenizers drop or turn into [UNK] (tab: a space).
_CONTROL_RE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb"
    "\U000f0000-\U0010ffff]"
)
# Sentence ends: English . ! ? followed by space and an upper-case letter, digit or quote; Chinese and
# Japanese full-width ends (optionally followed by closing quotes) without needing a space.
_SENTENCE_END_RE = re.compile(
    r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9À-Ý])"
    r"|[。！？!?；…]+[”’」』）)]*"
)


@dataclass
class CorpusStats:
    """What reading the corpus met: counts, and where the first few problems are."""

    files: int = 0
    empty_files: list[str] = field(default_factory=list)
    lines: int = 0
    rows: int = 0
    empty_rows: int = 0
    documents: int = 0
    sentences: int = 0
    characters: int = 0
    input_bytes: int = 0
    undecodable_lines: int = 0
    too_long_lines: int = 0
    duplicate_lines: int = 0
    max_line_length: int = 0  # the limit over-long lines broke (named in the report)
    examples: dict[str, list[str]] = field(default_factory=dict)
    marker_lines: dict[str, int] = field(default_factory=dict)  # short lines of symbols alone ('%', '***'): counts

    def note_marker(self, line: str) -> None:
        """Count a line that may separate documents: a few symbols, no letter or digit (bounded: a few kinds)."""
        if len(line) <= _MARKER_LENGTH and not any(ch.isalnum() for ch in line) and (
                line in self.marker_lines or len(self.marker_lines) < _MARKER_KINDS):
            self.marker_lines[line] = self.marker_lines.get(line, 0) + 1

    def note(self, kind: str, where: str) -> None:
        kept = self.examples.setdefault(kind, [])
        if len(kept) < _EXAMPLES_KEPT:
            kept.append(where)

    def report(self) -> str:
        counts = [f"{self.files} file(s)"] + [f"{self.rows} rows"] * bool(self.rows) + [f"{self.lines} lines"]
        if self.documents:
            counts += [f"{self.documents} documents", f"{self.sentences} sentences"]
        parts = [", ".join(counts + [f"{self.characters} characters"])]
        for label, count, kind in (
            ("lines with undecodable bytes (bad bytes dropped; is --encoding right?)", self.undecodable_lines,
             "undecodable"),
            (f"over-long lines dropped (over max_line_length={self.max_line_length} characters; raise "
             "--max_line_length to keep them)", self.too_long_lines, "too_long"),
            ("duplicate lines dropped", self.duplicate_lines, "duplicate"),
            ("empty or null rows", self.empty_rows, "empty_row"),
        ):
            if count:
                where = ", ".join(self.examples.get(kind, []))
                parts.append(f"{count} {label} (first at {where})")
        if self.empty_files:
            parts.append(f"{len(self.empty_files)} empty file(s): {', '.join(self.empty_files[:_EXAMPLES_KEPT])}")
        return "; ".join(parts)


def expand_inputs(inputs: Iterable[str]) -> list[str | TableFile]:
    """Text files and checked parquet tables named by paths, globs, folders (every corpus file inside,
    recursively), URLs (fetched once) or Hub datasets (``hf://datasets/...``)."""
    files: list[str | TableFile] = []
    for item in inputs:
        item = os.path.expanduser(str(item))
        if is_hub_url(item):
            files.extend(dataset_tables(item))
            continue
        item, options = split_options(item)
        if options.get("split"):
            raise UserInputError(f"--input {item}?split=...: a split is chosen only in a Hub dataset (hf://datasets/"
                                 "...); give the files of that split.")
        files += [check_table(TableFile(p, options.get("column", ""))) if is_parquet(p) else p
                  for p in _local_files(item)]
    if not files:
        raise UserInputError("No corpus input given: pass one or more files, globs or folders with --input.")
    unique: dict[str, str | TableFile] = {}
    for source in files:  # keep order, drop repeats
        unique.setdefault(source.name if isinstance(source, TableFile) else source, source)
    return list(unique.values())


def _local_files(item: str) -> list[str]:
    """The local files one path, glob, folder or URL names."""
    if is_remote(item):
        return [str(fetch(item))]
    if os.path.isdir(item):
        found = sorted(
            str(p) for p in Path(item).rglob("*") if p.is_file() and p.name.lower().endswith(CORPUS_SUFFIXES)
        )
        if not found:
            raise UserInputError(f"Corpus folder '{item}' holds no {', '.join(CORPUS_SUFFIXES)} files.")
        return found
    if os.path.isfile(item):  # a file's own name first, glob characters and all: corpus[1].txt is that file
        return [item]
    if glob.has_magic(item):
        found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
        if not found:
            brackets = (f" In a pattern [...] is one of the characters inside; for brackets in a file's name write "
                        f"'{glob.escape(item)}'." if "[" in item else "")
            raise UserInputError(f"Corpus pattern '{item}' matches no file (check the path given to --input)."
                                 + brackets)
        return found
    raise UserInputError(f"Corpus input '{item}' does not exist (check the path given to --input).")


class TextNormalizer:
    """Turns one raw line into clean text according to :class:`CorpusConfig` (and lower-casing)."""

    def __init__(self, config: CorpusConfig, do_lower_case: bool = False):
        self.form = None if config.unicode_normalization == "none" else config.unicode_normalization
        self.strip_control = config.strip_control
        self.do_lower_case = do_lower_case
        self.punctuation_table = _punctuation_table() if config.strip_punctuation else None

    def __call__(self, text: str) -> str:
        """Clean, Unicode-normalised, whitespace-collapsed text; case is kept (see :meth:`lower`)."""
        if self.strip_control and not text.isprintable():
            text = _CONTROL_RE.sub(" ", _ANSI_RE.sub("", text))
        if self.form and not text.isascii() and not unicodedata.is_normalized(self.form, text):
            text = unicodedata.normalize(self.form, text)
        if self.punctuation_table is not None:
            text = text.translate(self.punctuation_table)
        return " ".join(text.split())

    def lower(self, text: str) -> str:
        """Lower-case and strip accents when ``do_lower_case`` (after sentence splitting, which needs case)."""
        if not self.do_lower_case:
            return text
        return text.lower() if text.isascii() else strip_accents(text.lower())


def strip_accents(text: str) -> str:
    """Drop combining marks after canonical decomposition, as BERT's uncased models do."""
    decomposed = unicodedata.normalize("NFD", text)
    if decomposed.isascii():
        return decomposed
    return decomposed.translate(_combining_marks())


class _CombiningMarks(dict):
    """A str.translate table deleting every non-spacing mark (category Mn), filled in as characters are met:
    building it whole for all of Unicode costs half a second in every process."""

    def __missing__(self, cp: int):
        self[cp] = value = None if unicodedata.category(chr(cp)) == "Mn" else cp
        return value


_COMBINING = _CombiningMarks()


def _combining_marks() -> dict[int, int | None]:
    return _COMBINING


_PUNCT_TABLE: dict[int, None] | None = None


def _punctuation_table() -> dict[int, None]:
    """Every Unicode punctuation code point (category P*) plus ASCII symbols BERT counts as punctuation."""
    global _PUNCT_TABLE
    if _PUNCT_TABLE is None:
        table = {cp: None for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)).startswith("P")}
        for cp in list(range(33, 48)) + list(range(58, 65)) + list(range(91, 97)) + list(range(123, 127)):
            table[cp] = None
        _PUNCT_TABLE = table
    return _PUNCT_TABLE


def split_sentences(text: str) -> list[str]:
    """Split a paragraph at English (. ! ? + capital) and Chinese (。！？；…) sentence ends."""
    parts, start = [], 0
    for match in _SENTENCE_END_RE.finditer(text):
        parts.append(text[start:match.end()].strip())
        start = match.end()
    parts.append(text[start:].strip())
    return [p for p in parts if p]


class CorpusReader:
    """Streams documents (lists of sentences) from corpus files; :attr:`stats` says what it met."""

    def __init__(self, inputs: Iterable[str], config: CorpusConfig, do_lower_case: bool = False):
        self.sources = expand_inputs(inputs)
        self.files = [s.name if isinstance(s, TableFile) else s for s in self.sources]  # as messages name them
        for source in self.sources:
            if not isinstance(source, TableFile):
                check_text_file(source, config.encoding)
        self.config = config
        self.normalize = TextNormalizer(config, do_lower_case)
        self.stats = CorpusStats(max_line_length=self.config.max_line_length)
        self.rows_read: list[int | None] = [0 if isinstance(s, TableFile) else None for s in self.sources]
        self._seen: set[int] | None = set() if config.dedupe_lines else None

    def lines(self) -> Iterator[str | None]:
        """Normalised lines; ``None`` marks a document boundary. Stops at a boundary once the
        ``max_documents`` or ``max_bytes`` cap is reached."""
        max_documents, max_bytes = self.config.max_documents, self.config.max_bytes
        ended, filled = 0, False
        for index, source in enumerate(self.sources):
            self.stats.files += 1
            stream = self._table_lines(index, source) if isinstance(source, TableFile) else self._file_lines(source)
            with contextlib.closing(stream):
                for line in stream:
                    if line is not None:
                        filled = True
                    elif filled:
                        ended, filled = ended + 1, False
                        if (max_documents and ended >= max_documents) or \
                                (max_bytes and self.stats.input_bytes >= max_bytes):
                            yield None
                            return
                    yield line

    def _file_lines(self, path: str) -> Iterator[str | None]:
        number = 0
        try:
            with open_corpus_file(path) as handle:
                for number, raw in enumerate(handle, 1):
                    line = self._line(raw, path, number)
                    if line is not _SKIP:
                        yield line
        except DAMAGED_STREAM as exc:
            raise read_error(path, exc, f"after line {number}") from None
        if not number:
            self.stats.empty_files.append(path)
        yield None  # a file always ends a document

    def _table_lines(self, index: int, table: TableFile) -> Iterator[str | None]:
        """A row's lines, then a boundary: blank lines inside a row do not end its document."""
        stats = self.stats
        for row, text, size in table_rows(table):
            self.rows_read[index] = row + 1
            stats.rows += 1
            stats.input_bytes += size + 1
            kept = False
            for raw in (text or "").split("\n"):
                stats.lines += 1
                line = self._text(raw, table.name, row, " row ")
                if line is not None and line is not _SKIP:
                    kept = True
                    yield line
            if kept:
                yield None
            else:
                stats.empty_rows += 1
                stats.note("empty_row", f"{table.name} row {row}")
        if not table.rows:
            stats.empty_files.append(table.name)

    def _line(self, raw: bytes, path: str, number: int):
        """One raw line counted, decoded, checked, normalised: the line, ``None`` (a boundary) or ``_SKIP``."""
        cfg, stats = self.config, self.stats
        stats.lines += 1
        stats.input_bytes += len(raw)
        try:
            text = raw.decode(cfg.encoding)
        except UnicodeDecodeError:
            text = raw.decode(cfg.encoding, errors="ignore")
            stats.undecodable_lines += 1
            stats.note("undecodable", f"{path}:{number}")
        return self._text(text, path, number)

    def _text(self, text: str, path: str, number: int, at: str = ":"):
        """One decoded line checked and normalised (problems located as ``path{at}number``)."""
        cfg, stats = self.config, self.stats
        if len(text) > cfg.max_line_length:
            stats.too_long_lines += 1
            stats.note("too_long", f"{path}{at}{number}")
            return _SKIP
        stripped = text.strip()
        separator = cfg.doc_separator.strip()
        if not stripped or (separator and stripped == separator):
            return None
        if not separator:
            stats.note_marker(stripped)
        line = self.normalize(stripped)
        if not line:
            return _SKIP  # nothing left after normalisation: not a document boundary
        if self._seen is not None:
            key = hash(line)  # 64-bit: a collision among distinct lines is negligible
            if key in self._seen:
                stats.duplicate_lines += 1
                stats.note("duplicate", f"{path}{at}{number}")
                return _SKIP
            self._seen.add(key)
        return line

    def documents(self) -> Iterator[list[str]]:
        """Documents as lists of sentences, in corpus order."""
        doc: list[str] = []
        split = self.config.split_sentences
        for line in self.lines():
            if line is None:
                if doc:
                    self.stats.documents += 1
                    self.stats.sentences += len(doc)
                    yield doc
                    doc = []
                continue
            self.stats.characters += len(line)
            if split:
                doc.extend(self.normalize.lower(s) for s in split_sentences(line))
            else:
                doc.append(self.normalize.lower(line))
        if doc:  # pragma: no cover - lines() always ends with a boundary
            self.stats.documents += 1
            self.stats.sentences += len(doc)
            yield doc

    def sample_lines(self, count: int, seed: int) -> list[str]:
        """A uniform random sample of at most ``count`` lines (reservoir sampling: one pass, bounded memory)."""
        import random

        rng = random.Random(seed)
        sample: list[str] = []
        seen = 0
        for line in self.lines():
            if line is None:
                continue
            self.stats.characters += len(line)
            line = self.normalize.lower(line)
            seen += 1
            if len(sample) < count:
                sample.append(line)
            else:
                j = rng.randrange(seen)
                if j < count:
                    sample[j] = line
        return sample
