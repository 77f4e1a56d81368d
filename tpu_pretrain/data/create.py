"""``create-data``: a corpus to sharded TFRecords in the original BERT schema, plus ``manifest.json``.

Two passes keep memory bounded whatever the corpus size:

1. *Partition* (one process, streaming): read and normalise the corpus, deal documents round-robin into per-shard
   work files (held-out documents into eval shards).
2. *Shards* (worker processes): each shard is read back in blocks of documents, tokenised, turned into instances
   ``dupe_factor`` times, shuffled within the block, and written under a name renamed when the shard is complete.

A shard depends only on its documents, the seed and its index, so the output is byte-identical
whatever the number of workers. A re-run skips complete shards (checked against their checksums)
and redoes partial ones; an output folder made with other settings is refused, naming them. The corpus
counts by content (each file's size and sha256, not its path): a file edited in place is other data, the
same file named by another path is not.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import math
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..config import DATA, Config, pinned_settings, recipe_line
from ..config_checks import max_predictions
from ..errors import CommandFailed, UserInputError
from ..runtime import sigterm_as_interrupt
from ..storage.gcs import is_gcs_url
from ..storage.local import check_writable_folder, write_text_atomic
from .corpus import CorpusReader
from .corpus_hints import held_out_hint, separator_hint
from .corpus_tables import TableFile, table_input
from .data_folder import (
    FORMAT,
    IDENTITY,
    MANIFEST,
    VOCAB,
    WORK_DIR,
    Manifest,
    ShardStats,
    data_folder_lock,
    sha256_file,
)
from .shard import ShardTask, read_json, shard_complete, work_text, worker_init, write_json, write_shard
from .shard_pool import ShardPool, WorkerDied, how_it_ended
from .vocab import Vocab

log = logging.getLogger(__name__)

SHARD_TARGET_BYTES = 16 << 20


# -- orchestration ----------------------------------------------------------------------------------
@dataclass
class DataPlan:
    """What create-data makes, decided before any shard is written: the same for every runner (local, Beam)."""

    config: Config
    out: str  # a local folder, or (Beam only) a gs:// prefix
    reader: CorpusReader
    settings: dict
    inputs: list[dict]
    identity: dict
    vocab: Vocab


def check_required(config: Config) -> None:
    config.validate()
    if not config.storage.output_dir:
        raise UserInputError("Setting output_dir is empty: say where the shards go with --output_dir.")
    if not config.data.vocab_file:
        raise UserInputError("Setting vocab_file is empty: pass a vocab.txt (or build one with `tpu-pretrain vocab`).")


def plan_data(config: Config) -> DataPlan:
    """Check the settings, open the corpus (URLs fetched) and fix the settings that pin the shards."""
    check_required(config)
    vocab = Vocab.read(config.data.vocab_file)
    if vocab.is_tokenizer_json:
        config = _with_a_tokenizer_json(config)
    d, c = config.data, config.corpus
    reader = CorpusReader(c.input, c, do_lower_case=d.do_lower_case)
    _check_not_the_corpus_folder(config.storage.output_dir, c.input, reader)
    settings = {key: config.get(key) for key in pinned_settings(DATA)}
    inputs = [table_input(s) if isinstance(s, TableFile) else
              {"path": os.path.abspath(s), "bytes": os.path.getsize(s), "sha256": sha256_file(s)}
              for s in reader.sources]
    if d.num_shards == 0:
        settings["num_shards"] = auto_num_shards(sum(i["bytes"] for i in inputs))
    settings["max_predictions_per_seq"] = max_predictions(d.max_seq_length, d.max_predictions_per_seq,
                                                          max(d.masked_lm_prob, d.eval_masked_lm_prob))
    settings["no_nsp"] = d.no_nsp or d.pack_sequences  # packed documents have no "next sentence"
    identity = {"format": FORMAT, "settings": settings, "vocab_sha256": vocab.sha256, "inputs": inputs}
    return DataPlan(config, config.storage.output_dir, reader, settings, inputs, identity, vocab)


def _with_a_tokenizer_json(config: Config) -> Config:
    """Data made with a tokenizer.json is ModernBERT's (BERT takes a vocab.txt), which trains MLM only: next-sentence
    data made with one could be trained by neither family. The tokenizer lower-cases (or not) by its own normaliser:
    a copy of ``config`` has do_lower_case off (the caller's is unchanged)."""
    d = config.data
    if not (d.no_nsp or d.pack_sequences):
        raise UserInputError(
            f"--vocab_file {d.vocab_file} is a tokenizer.json, which only --model_family modernbert trains, and "
            "ModernBERT trains masked-LM data only: next-sentence data made with it (the classic recipe) could be "
            "trained by neither family. Add --recipe modern (packed, MLM only) or --no_nsp; or give a vocab.txt for "
            "BERT's next-sentence data.")
    if not d.do_lower_case:
        return config
    log.info("do_lower_case is off: %s lower-cases (or not) by its own normaliser.", d.vocab_file)
    config = copy.deepcopy(config)
    config.set("do_lower_case", False, source=f"{d.vocab_file}, a tokenizer.json")
    return config


def _check_not_the_corpus_folder(output_dir: str, inputs: list[str], reader: CorpusReader) -> None:
    """Refuse to write the data among the corpus files: the next run would count the shards, the manifest and the
    vocab as corpus (another corpus, so the same command would be refused)."""
    if "://" in output_dir:
        return
    out = os.path.realpath(output_dir)
    read_whole = [os.path.realpath(i) for i in inputs if "://" not in i and os.path.isdir(i)]  # read recursively
    beside = {os.path.dirname(os.path.realpath(s)) for s in reader.sources if not isinstance(s, TableFile)}
    for folder in [*read_whole, *beside]:
        inside = folder in read_whole and out.startswith(folder + os.sep)
        if out == folder or inside:
            raise UserInputError(
                f"output_dir {output_dir} is {'inside ' if inside else ''}the folder of the corpus ({folder}): the "
                "shards, manifest.json and vocab would be written among the corpus files and read as corpus by the "
                f"next run. Choose an --output_dir outside it (e.g. {os.path.join(os.path.dirname(folder), 'data')}); "
                "nothing was written.")


def create_pretraining_data(config: Config) -> Manifest:
    """Write the shards and manifest for ``config``; resumes where an earlier run stopped."""
    check_required(config)
    out = check_writable_folder(config.storage.output_dir)
    log.info("%s", recipe_line(config))
    try:
        with sigterm_as_interrupt(), _locked(out):
            return _create(plan_data(config), out)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise UserInputError(
            f"The disk under {out} is full ({exc.strerror}{': ' + str(exc.filename) if exc.filename else ''}). "
            "Free space and run the same command again: complete shards are kept and only the rest is written."
        ) from None


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """The data folder's lock for the block; a folder made only to hold it goes again if nothing was written."""
    made = not out.exists()
    try:
        with data_folder_lock(out):
            yield
    finally:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


def _create(plan: DataPlan, out: Path) -> Manifest:
    start = time.time()
    check_existing(out, plan.identity, plan.vocab)
    work = out / WORK_DIR
    partition = read_json(work / "partition.json")
    with contextlib.ExitStack() as stack:
        pool = None
        if partition is None or identity_differences(partition["identity"], plan.identity):
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / IDENTITY, plan.identity)
            workers = _worker_count(plan.config.data.workers, plan.settings["num_shards"])
            pool = _worker_pool(stack, workers) if workers > 1 else None  # they start while the corpus is dealt
            partition = _partition(plan.reader, work, plan.settings, plan.identity)
        tasks = shard_tasks(plan, partition, str(out), str(work))
        shards = _write_shards(tasks, out, plan.config.data.workers, pool)
    manifest = finish(plan, partition, [shards[task.name] for task in tasks], time.time() - start)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def shard_tasks(plan: DataPlan, partition: dict, out: str, work: str) -> list[ShardTask]:
    """One task per shard the partition made (refused when the corpus gave no training document)."""
    if partition["documents"]["train"] == 0:
        raise UserInputError(
            f"The corpus ({', '.join(plan.reader.files[:3])}) has no usable line: {partition['corpus_report']}."
        )
    return [ShardTask(split, index, count, out, work, plan.vocab, plan.settings)
            for split, count in partition["shard_counts"].items() for index in range(count)]


def finish(plan: DataPlan, partition: dict, shards: list[ShardStats], seconds: float) -> Manifest:
    """Write the manifest (and the data folder's own vocab.txt or tokenizer.json) once every shard is written."""
    rows = partition.get("rows_read") or [None] * len(plan.inputs)
    inputs = [i if n is None else i | {"rows": n} for i, n in zip(plan.inputs, rows, strict=True)]  # rows used
    vocab, name = plan.vocab.source, plan.vocab.copy_name
    manifest = Manifest(settings=plan.settings, vocab_size=len(plan.vocab), vocab_sha256=plan.vocab.sha256,
                        inputs=inputs, corpus_report=partition["corpus_report"], shards=shards, seconds=seconds,
                        vocab_name=name)
    text = json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n"
    if is_gcs_url(plan.out):
        from .. import storage

        storage.write_text(storage.join(plan.out, MANIFEST), text)
        storage.copy(str(vocab), storage.join(plan.out, name))
        return manifest
    out = Path(plan.out)
    write_text_atomic(out / MANIFEST, text)
    if vocab.resolve() != (out / name).resolve():
        shutil.copyfile(vocab, out / name)  # the data folder names its own vocab
    return manifest


def _write_shards(tasks: list[ShardTask], out: Path, workers: int, pool: ShardPool | None = None
                  ) -> dict[str, ShardStats]:
    """Every shard's statistics: complete shards are verified once and kept, the others (re)written (by ``pool``'s
    workers if one was started, else by as many as there are shards to write, up to ``workers``)."""
    shards = {task.name: shard_complete(out, task.name) for task in tasks}
    pending = [task for task in tasks if shards[task.name] is None]
    if not pending:
        return shards
    with contextlib.ExitStack() as stack:
        needed = _worker_count(workers, len(pending))
        if pool is None and needed > 1:
            pool = _worker_pool(stack, needed)
        log.info("Writing %d shard(s)%s...", len(pending), " in worker processes" if pool else "")
        bar = stack.enter_context(tqdm(total=len(pending), unit="shard", desc="shards", disable=None))
        written = pool.imap_unordered(write_shard, pending) if pool else map(write_shard, pending)
        try:
            for stats in written:
                shards[stats.file] = stats
                bar.update()
        except WorkerDied as died:
            pool.close()
            for partial in out.glob("*.tfrecord.tmp"):  # the stopped workers' unfinished shards
                partial.unlink(missing_ok=True)
            raise _worker_died(died, out, len(tasks), sum(s is not None for s in shards.values()),
                               _worker_count(workers, len(pending))) from None
    return shards


def _worker_died(died: WorkerDied, out: Path, total: int, complete: int, workers: int) -> CommandFailed:
    where = f"while writing {died.task.name}" if died.task is not None else "between shards"
    memory = died.exitcode == -signal.SIGKILL
    cause = ("most likely the system ran out of memory and the kernel's out-of-memory killer ended it (`dmesg` "
             "says so)" if memory else "see the messages above")
    fix = f"with fewer --workers (now {workers}) or more memory" if memory else "once the cause is fixed"
    return CommandFailed(
        f"A worker process {how_it_ended(died.exitcode)} {where} in {out}: {cause}. The {complete} complete "
        f"shard(s) of {total} are kept; run the same command again, {fix}, to write the rest.")


def _worker_count(workers: int, shards: int) -> int:
    return min(workers or os.cpu_count() or 1, shards)


def _worker_pool(stack: contextlib.ExitStack, workers: int) -> ShardPool:
    # one compile notice between the workers: the first to create this file says it (no semaphore to leak on SIGTERM)
    notice = os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="tpu-pretrain-")), "compile-said")
    return stack.enter_context(ShardPool(workers, worker_init, (workers, notice)))


def auto_num_shards(corpus_bytes: int) -> int:
    """One shard per 16 MB of text, and at least 8 (one per 256 KB under 2 MB of text), so that worker processes
    share the work; the num_shards setting's help says the same."""
    return max(1, min(8, math.ceil(corpus_bytes / (256 << 10))), math.ceil(corpus_bytes / SHARD_TARGET_BYTES))


def check_existing(out: Path, identity: dict, vocab: Vocab | None = None) -> None:
    """Refuse an output folder holding shards made from other settings (naming the differences), or a vocab.txt
    other than ``vocab``, which the finished data would replace."""
    previous = read_json(out / IDENTITY)
    if previous is None:
        manifest = read_json(out / MANIFEST)
        if manifest is not None:
            previous = {"format": manifest.get("format"), "settings": manifest.get("settings"),
                        "vocab_sha256": manifest.get("vocab_sha256"), "inputs": manifest.get("inputs")}
        elif out.is_dir() and any(out.glob("*.tfrecord")):
            raise UserInputError(
                f"Output folder '{out}' holds .tfrecord files but no {MANIFEST}: they were not made by this tool "
                "or by these settings. Use an empty --output_dir."
            )
    differences = identity_differences(previous, identity) if previous is not None else []
    if differences:
        raise UserInputError(
            f"Output folder '{out}' holds shards made with other settings ({'; '.join(differences)}). "
            "Use a new --output_dir, or delete that folder to rebuild it; nothing there was changed."
        )
    there = out / vocab.copy_name if vocab else out / VOCAB
    if vocab and there.is_file() and there.resolve() != vocab.source.resolve() \
            and there.read_bytes() != vocab.source.read_bytes():
        raise UserInputError(
            f"{there} exists and is not the --vocab_file {vocab.setting}: the data folder keeps the vocab its data is "
            f"made with, so it would be replaced. Make the data with it (--vocab_file {there}), or use another "
            "--output_dir; nothing there was changed.")


def identity_differences(previous: dict, identity: dict) -> list[str]:
    """What differs between two data identities: settings, vocab, format and the corpus by content."""
    before = {key: Config().get(key) for key in identity["settings"]} | (previous.get("settings") or {})
    differences = [f"{key}: {before.get(key)!r} there, {value!r} now"  # a setting added since: its default there
                   for key, value in identity["settings"].items() if before.get(key) != value]
    if previous.get("vocab_sha256") != identity["vocab_sha256"]:
        differences.append("vocab_file: a different vocab")
    differences += _input_differences(previous.get("inputs") or [], identity["inputs"])
    if previous.get("format") != identity["format"]:
        differences.append(f"format: {previous.get('format')!r} there, {identity['format']!r} now")
    return differences


def _input_differences(old: list[dict], new: list[dict]) -> list[str]:
    """The corpus compared by content: size and sha256 (folders from before sha256 was recorded: path and size)."""
    if len(old) != len(new):
        return [f"input: {len(old)} corpus file(s) there, {len(new)} now"]
    found = []
    for before, now in zip(old, new, strict=True):
        if before.get("sha256") and now.get("sha256"):
            same = before["sha256"] == now["sha256"] and before["bytes"] == now["bytes"]
        else:
            same = os.path.abspath(before["path"]) == os.path.abspath(now["path"]) and before["bytes"] == now["bytes"]
        if not same:
            found.append(f"input: {now['path']} ({now['bytes']} bytes) has other content than {before['path']} "
                         f"({before['bytes']} bytes) had")
    return found


class Dealer:
    """Pass 1's choice for each document, in corpus order: held out at random (eval), else round-robin.

    One reader deals every document, so the shards' contents do not depend on the runner.
    """

    def __init__(self, settings: dict):
        self.num_train = settings["num_shards"]
        self.eval_fraction = settings["eval_fraction"]
        self.num_eval = math.ceil(self.num_train * self.eval_fraction) if self.eval_fraction > 0 else 0
        self.counts = {"train": 0, "eval": 0}
        self.characters = {"train": 0, "eval": 0}
        self.chooser = random.Random(settings["random_seed"] ^ 0x5EED)

    def deal(self, documents: Iterable[list[str]]) -> Iterator[tuple[str, int, list[str]]]:
        """``(split, shard index, document)`` for each document."""
        counts = self.counts
        for doc in documents:
            # Held out at random; the second document at the latest, so a small corpus still has an eval set.
            held_out = self.chooser.random() < self.eval_fraction or (counts["eval"] == 0 and counts["train"] >= 1)
            split = "eval" if self.num_eval and held_out else "train"
            yield split, counts[split] % (self.num_eval if split == "eval" else self.num_train), doc
            counts[split] += 1
            self.characters[split] += sum(map(len, doc))

    def partition(self, reader: CorpusReader, identity: dict) -> dict:
        """What was dealt: document counts, shards per split and the corpus report."""
        return {
            "identity": identity,
            "documents": dict(self.counts),
            "shard_counts": {"train": self.num_train, "eval": self.num_eval if self.counts["eval"] else 0},
            "corpus_report": reader.stats.report(),
            "rows_read": reader.rows_read,
            "hints": [hint for hint in (separator_hint(reader.stats),
                                        held_out_hint(self.counts, self.characters, self.eval_fraction)) if hint],
        }

def _partition(reader: CorpusReader, work: Path, settings: dict, identity: dict) -> dict:
    """Pass 1: deal normalised documents into per-shard work files (one sentence a line, blank between)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    dealer = Dealer(settings)
    handles = {("train", i): open(work / f"train-{i}.txt", "w", encoding="utf-8") for i in range(dealer.num_train)}
    handles |= {("eval", i): open(work / f"eval-{i}.txt", "w", encoding="utf-8") for i in range(dealer.num_eval)}
    total_bytes = sum(i["bytes"] for i in identity["inputs"])
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="reading corpus", disable=None)
    try:
        for split, index, doc in dealer.deal(reader.documents()):
            bar.update(reader.stats.input_bytes - bar.n)
            handles[(split, index)].write(work_text(doc))
    finally:
        bar.close()
        for handle in handles.values():
            handle.close()
    partition = dealer.partition(reader, identity)
    write_json(work / "partition.json", partition)
    log.info("Corpus: %s", partition["corpus_report"])
    for hint in partition["hints"]:
        log.warning("%s", hint)
    return partition
