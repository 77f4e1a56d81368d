"""Parquet tables as corpus input: a row is a document, the lines of its text column are its sentences.

Local files (a Kaggle input, a downloaded dataset) and a Hub dataset's files (:mod:`.hub_datasets`) are
read the same way, through an fsspec filesystem, one row group at a time and only the text column, so
nothing is downloaded whole before work starts. Each file is checked from its footer first (it is
parquet, it has a text column, how many rows it holds); a problem names the file (and the dataset) and
the fix, before any slow work starts.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserInputError

PARQUET_MAGIC = b"PAR1"
TEXT_COLUMN = "text"
BATCH_ROWS = 1024
OPTIONS = ("column", "split")  # what an input's ``?key=value`` part may say


@dataclass
class TableFile:
    """One parquet file of corpus input, and the column its text is in (found when not named)."""

    path: str  # as ``fs`` names it
    column: str = ""
    fs: Any = None  # an fsspec filesystem; None: the local disk
    dataset: dict = field(default_factory=dict)  # a Hub dataset's repo, config, split, revision
    rows: int = 0  # from the footer, once checked

    @property
    def name(self) -> str:
        """How messages and the manifest name the file (``hf://datasets/...`` for a Hub dataset's)."""
        return f"hf://{self.path}" if self.dataset else self.path

    def describe(self) -> str:
        where = f"file {self.name}"
        return f"Dataset {self.dataset['dataset']}, {where}" if self.dataset else f"Corpus {where}"

    def open(self):
        return self.fs.open(self.path, "rb") if self.fs is not None else open(self.path, "rb")

    def reader(self):
        """pyarrow's reader of the file (footer read); it fetches only the row groups and columns asked for."""
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.path, filesystem=self.fs)


def split_options(item: str) -> tuple[str, dict[str, str]]:
    """``path?column=body`` -> (``path``, {"column": "body"}); an item whose ``?`` is not options is kept whole."""
    base, mark, query = item.rpartition("?")
    if not mark:
        return item, {}
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    if not pairs or any(key not in OPTIONS for key, _ in pairs):
        return item, {}
    return base, dict(pairs)


def is_parquet(path: str) -> bool:
    """A parquet file by content (its first bytes), whatever it is called."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def _parquet_file(table: TableFile):
    """The file's parquet reader (footer read), or an error naming the file that is not readable parquet."""
    import pyarrow as pa

    try:
        return table.reader()
    except FileNotFoundError:
        raise UserInputError(f"{table.describe()} does not exist.") from None
    except (pa.ArrowException, OSError) as exc:
        raise UserInputError(f"{table.describe()} is not a readable parquet file ({exc}): download it again, or "
                             "leave it out.") from None


def check_table(table: TableFile) -> TableFile:
    """Read the footer: refuse a file that is not parquet or lacks a text column; note the column and rows."""
    import pyarrow as pa

    parquet = _parquet_file(table)
    try:
        schema = parquet.schema_arrow
        texts = [f.name for f in schema if _is_text(f.type)]
        if table.column:
            if table.column not in schema.names:
                raise UserInputError(f"{table.describe()} has no column '{table.column}' (its columns: "
                                     f"{', '.join(schema.names)}); name the text column with ?column=NAME.")
            kind = schema.field(table.column).type
            if not _is_text(kind):
                raise UserInputError(f"{table.describe()}: column '{table.column}' holds {kind}, not text; name the "
                                     f"text column with ?column=NAME (text columns: {', '.join(texts) or 'none'}).")
        elif TEXT_COLUMN in texts or (len(texts) == 1 and TEXT_COLUMN not in schema.names):
            table.column = TEXT_COLUMN if TEXT_COLUMN in texts else texts[0]
        elif TEXT_COLUMN in schema.names:  # a column named text that holds numbers or lists
            raise UserInputError(
                f"{table.describe()}: its '{TEXT_COLUMN}' column holds {schema.field(TEXT_COLUMN).type}, not text "
                f"(text columns: {', '.join(texts) or 'none'}): name the column holding the text with ?column=NAME, "
                "or write the text as strings.")
        else:
            raise UserInputError(
                f"{table.describe()} has no '{TEXT_COLUMN}' column and {len(texts)} text columns "
                f"({', '.join(texts) or 'none'}; all columns: {', '.join(schema.names)}): name the one to read with "
                "?column=NAME.")
        table.rows = parquet.metadata.num_rows
    except pa.ArrowException as exc:
        raise UserInputError(f"{table.describe()} has a damaged footer ({exc}): download it again.") from None
    finally:
        parquet.close()
    return table


def _is_text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def table_rows(table: TableFile) -> Iterator[tuple[int, str | None, int]]:
    """``(row number, text or None, UTF-8 size)`` for every row, read a batch of one row group at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parquet = _parquet_file(table)
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=[table.column]):
            column = batch.column(0)
            sizes = pc.binary_length(column).to_pylist()
            for text, size in zip(column.to_pylist(), sizes, strict=True):
                yield row, text, size or 0
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise UserInputError(f"{table.describe()} is damaged after row {row} ({type(exc).__name__}: {exc}): "
                             "download it again, or leave it out.") from None
    finally:
        parquet.close()


def table_input(table: TableFile) -> dict:
    """What the manifest records of a table: where, size and sha256 (the Hub's own for a Hub file), and the
    dataset's name, config, split and revision."""
    if table.fs is None:
        from .data_folder import sha256_file

        return {"path": os.path.abspath(table.path), "bytes": os.path.getsize(table.path),
                "sha256": sha256_file(table.path), "column": table.column}
    info = table.fs.info(table.path)
    lfs = info.get("lfs") or {}
    digest = lfs.get("sha256") or _sha256_stream(table)
    return {"path": table.name, "bytes": int(info["size"]), "sha256": digest, "column": table.column} | table.dataset


def _sha256_stream(table: TableFile) -> str:
    digest = hashlib.sha256()
    with table.open() as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
