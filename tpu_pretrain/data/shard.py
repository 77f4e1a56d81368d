"""One shard's work, from its documents to its records: the unit create-data runs in parallel.

A shard depends only on its documents (the work file the partition pass wrote), the settings, the
seed and its index, so any process, in any order, writes the same bytes. Documents are read back in
blocks of about ``BLOCK_CHARS`` characters (memory stays bounded), tokenised, turned into instances
``dupe_factor`` times, masked, shuffled within the block, and written under a temporary name that is
renamed only when the shard is complete; its statistics then go beside it for the manifest.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..storage.local import write_text_atomic
from .data_folder import ShardStats, sha256_file, shard_name, shard_stats_name
from .tfrecord import AtomicRecordWriter
from .vocab import Vocab

log = logging.getLogger(__name__)

BLOCK_CHARS = 2 << 20  # characters of documents tokenised and paired at a time (and the random-next pool)


@dataclass(frozen=True)
class ShardTask:
    """What a worker needs to write one shard (picklable: it crosses to a spawned process)."""

    split: str
    index: int
    count: int
    out: str
    work: str
    vocab: Vocab
    settings: dict

    @property
    def name(self) -> str:
        return shard_name(self.split, self.index, self.count)

    @property
    def work_file(self) -> Path:
        return Path(self.work) / f"{self.split}-{self.index}.txt"


def worker_init(workers: int, compile_notice=None) -> None:
    """Share the cores between worker processes (each tokeniser would otherwise take them all); load (or compile)
    the compiled code, the workers saying a compile once between them (``compile_notice``: a file path they share)."""
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    os.environ["RAYON_NUM_THREADS"] = threads
    os.environ["RAYON_RS_NUM_CPUS"] = threads
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from .compiled import share_notice
    from .shard_writer import load_compiled_code

    share_notice(compile_notice)
    load_compiled_code()


def write_shard(task: ShardTask, lines: Iterable[str] | None = None) -> ShardStats:
    """Write one shard atomically and its statistics beside it; return the statistics.

    The documents come from the task's work file, or from ``lines`` in the work file's format (the
    Beam pipeline hands them over this way): either way the same blocks, so the same bytes.
    """
    from .shard_writer import ShardWriter  # the compiled code: loaded where shards are written
    from .tokenization import load_tokenizer

    tokenizer = load_tokenizer(task.vocab, do_lower_case=task.settings["do_lower_case"])
    writer = ShardWriter(tokenizer, task.settings, task.split, task.index)
    stats = ShardStats(file=task.name, split=task.split)
    record_writer = AtomicRecordWriter(Path(task.out) / task.name)
    try:
        block_number = -1
        blocks = read_blocks(task.work_file) if lines is None else blocks_of_lines(lines)
        for block_number, block in enumerate(blocks):
            record_writer.write_framed(*writer.block_records(block, block_number, stats))
        record_writer.write_framed(*writer.last_records(block_number + 1, stats))
        stats.sha256 = record_writer.close()
    except BaseException:
        record_writer.abort()
        raise
    stats.bytes = record_writer.bytes
    write_json(Path(task.out) / shard_stats_name(task.name), asdict(stats))
    return stats


def shard_complete(out: Path, name: str) -> ShardStats | None:
    """A shard's stats if the shard is complete and matches its recorded checksum."""
    stats = read_json(out / shard_stats_name(name))
    path = out / name
    if stats is None or not path.is_file() or path.stat().st_size != stats["bytes"]:
        return None
    if sha256_file(path) != stats["sha256"]:
        log.warning("Shard %s does not match its checksum; it will be rewritten.", path)
        return None
    return ShardStats(**stats)


def read_blocks(path: Path) -> Iterator[list[list[str]]]:
    """Documents of a work file, in blocks of about ``BLOCK_CHARS`` characters."""
    with open(path, encoding="utf-8") as handle:
        yield from blocks_of_lines(handle)


def work_text(doc: list[str]) -> str:
    """One document as a work file holds it: a sentence a line, a blank line after."""
    return "\n".join(doc) + "\n\n"


def blocks_of_lines(lines: Iterable[str]) -> Iterator[list[list[str]]]:
    """Documents of work-file lines (a blank line ends one), in blocks of about ``BLOCK_CHARS`` characters."""
    block: list[list[str]] = []
    doc: list[str] = []
    chars = 0
    for line in lines:
        line = line.rstrip("\n")
        if line:
            doc.append(line)
            chars += len(line)
            continue
        if doc:
            block.append(doc)
            doc = []
            if chars >= BLOCK_CHARS:
                yield block
                block, chars = [], 0
    if doc:
        block.append(doc)
    if block:
        yield block


# -- small file helpers -----------------------------------------------------------------------------
def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_json(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")

