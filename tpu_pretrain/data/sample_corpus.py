"""A small English corpus that every Python installation can build: the standard library's docstrings.

The demo and the tests need real prose without downloads or copied text files. Each module's,
class's and function's docstring becomes a document (paragraphs joined, one sentence a line), which
gives the blank-line-separated format of the original BERT scripts.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from pathlib import Path

from ..storage.local import write_text_atomic
from .corpus import split_sentences

MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar cmd codecs collections colorsys configparser "
    "contextlib copy csv dataclasses datetime decimal difflib dis email enum fileinput fnmatch fractions "
    "ftplib functools getopt gettext glob gzip hashlib heapq hmac html http imaplib inspect io ipaddress "
    "itertools json logging lzma mailbox math mimetypes multiprocessing numbers operator optparse os pathlib "
    "pickle pkgutil platform plistlib poplib pprint queue random re sched secrets selectors shelve shlex "
    "shutil signal smtplib socket socketserver sqlite3 ssl statistics string struct subprocess tarfile "
    "tempfile textwrap threading timeit tokenize trace traceback turtle typing unittest urllib uuid warnings "
    "wave weakref xml zipfile zlib"
).split()


def documents(max_chars: int = 1_500_000) -> list[list[str]]:
    """Docstring documents (lists of sentences), in a fixed order, up to about ``max_chars``."""
    docs: list[list[str]] = []
    total = 0
    seen: set[int] = set()
    for name in MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # a module missing from this build of Python is skipped
            continue
        objects = [module] + [obj for _, obj in sorted(vars(module).items()) if _is_own(obj, module)]
        for obj in objects:
            for member in [obj] + (sorted_members(obj) if inspect.isclass(obj) else []):
                doc = _sentences(inspect.getdoc(member) or "")
                key = hash(tuple(doc))
                if len(doc) < 2 or key in seen:
                    continue
                seen.add(key)
                docs.append(doc)
                total += sum(map(len, doc))
                if total >= max_chars:
                    return docs
    return docs


def sorted_members(cls) -> list:
    return [obj for name, obj in sorted(vars(cls).items()) if not name.startswith("_") and callable(obj)]


def _is_own(obj, module) -> bool:
    return (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == module.__name__


def _sentences(docstring: str) -> list[str]:
    """Prose paragraphs of a docstring as sentences; code examples and tables are left out."""
    sentences = []
    for paragraph in re.split(r"\n\s*\n", docstring):
        lines = [line.strip() for line in paragraph.splitlines()]
        if not lines or any(line.startswith((">>>", "...", "|", "+-", "$")) for line in lines):
            continue
        text = " ".join(lines)
        if len(text) < 20 or sum(ch.isalpha() for ch in text) < 0.6 * len(text):
            continue
        sentences.extend(split_sentences(text))
    return sentences


def write_sample_corpus(path: str | Path, max_chars: int = 1_500_000) -> Path:
    """Write the corpus in BERT's format (one sentence a line, a blank line between documents)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join("\n".join(doc) for doc in documents(max_chars)) + "\n"
    write_text_atomic(path, text)
    return path
