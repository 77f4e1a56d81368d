"""``create-data``: a corpus to sharded TFRecords in the original BERT schema, plus ``manifest.json``.

Two passes keep memory bounded whatever the corpus size:

1. *Partition* (one process, streaming): read and normalise the corpus, deal documents round-robin
   into per-shard work files (held-out documents into eval shards).
2. *Shards* (worker processes): each shard is read back in blocks of documents, tokenised, turned
   into instances ``dupe_factor`` times, shuffled within the block, and written under a temporary
   name that is renamed when the shard is complete.

A shard depends only on its documents, the seed and its index, so the output is byte-identical
whatever the number of workers. A re-run skips complete shards (checked against their checksums)
and redoes partial ones; an output folder made with other settings is refused, naming them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .config import Config
from .corpus import CorpusReader
from .errors import UserInputError
from .instances import MaskingSpec, RawInstance, Sentence, document_instances, mask_batch
from .storage.local import write_text_atomic
from .tfrecord import AtomicRecordWriter, encode_examples
from .vocab import SPECIAL_TOKENS, load_vocab, vocab_sha256

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
WORK_DIR = ".work"
FORMAT = "tpu_pretrain.pretraining_data/1"
BLOCK_CHARS = 2 << 20  # characters of documents tokenised and paired at a time (and the random-next pool)
SHARD_TARGET_BYTES = 16 << 20
BATCH = 1024

# Settings that determine the bytes of the shards (workers and paths do not).
DATA_SETTINGS = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "dupe_factor", "short_seq_prob",
                 "random_seed", "do_lower_case", "do_whole_word_mask", "no_nsp", "chinese_whole_word",
                 "num_shards", "eval_fraction")
CORPUS_SETTINGS = ("doc_separator", "split_sentences", "unicode_normalization", "strip_control",
                   "strip_punctuation", "dedupe_lines", "max_line_length")


@dataclass
class ShardStats:
    file: str
    split: str
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    instances: int = 0
    masked_tokens: int = 0
    real_tokens: int = 0
    random_next: int = 0
    bytes: int = 0
    sha256: str = ""


@dataclass
class Manifest:
    settings: dict
    vocab_size: int
    vocab_sha256: str
    inputs: list
    corpus_report: str
    shards: list[ShardStats] = field(default_factory=list)
    format: str = FORMAT
    seconds: float = 0.0

    def totals(self, split: str) -> dict:
        keys = ("documents", "sentences", "tokens", "instances", "masked_tokens", "real_tokens", "random_next", "bytes")
        return {k: sum(getattr(s, k) for s in self.shards if s.split == split) for k in keys}

    def files(self, split: str) -> list[str]:
        return [s.file for s in self.shards if s.split == split]

    def to_json(self) -> dict:
        data = asdict(self)
        data["totals"] = {split: self.totals(split) for split in ("train", "eval")}
        return data

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        data = dict(data)
        data.pop("totals", None)
        shards = [ShardStats(**s) for s in data.pop("shards")]
        return cls(shards=shards, **data)

    def summary(self) -> str:
        lines = []
        for split in ("train", "eval"):
            t = self.totals(split)
            if not self.files(split):
                continue
            share = t["masked_tokens"] / max(t["real_tokens"], 1)
            nsp = t["random_next"] / max(t["instances"], 1)
            lines.append(
                f"{split}: {len(self.files(split))} shard(s), {t['documents']} documents, {t['tokens']} tokens, "
                f"{t['instances']} instances, {t['masked_tokens']} masked ({share:.1%} of real tokens), "
                f"random next {nsp:.1%}"
            )
        lines.append(f"corpus: {self.corpus_report}")
        lines.append(f"time: {self.seconds:.1f} s")
        train = self.totals("train")
        if not self.settings.get("no_nsp") and train["random_next"] > 0.7 * max(train["instances"], 1):
            lines.append(
                f"warning: {train['random_next'] / train['instances']:.0%} of instances have a random next segment "
                "(about 50% is the aim): most documents hold one sentence, so next-sentence prediction learns "
                "little. Use --split_sentences for a paragraph-per-line corpus, blank lines or --doc_separator "
                "between documents, or --no_nsp.")
        return "\n".join(lines)


def load_manifest(data_dir: str | os.PathLike) -> Manifest:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise UserInputError(f"No {MANIFEST} in '{data_dir}': make the data with `tpu-pretrain create-data` first.")
    return Manifest.from_json(json.loads(path.read_text()))


# -- orchestration ----------------------------------------------------------------------------------
def create_pretraining_data(config: Config) -> Manifest:
    """Write the shards and manifest for ``config``; resumes where an earlier run stopped."""
    start = time.time()
    config.validate()
    d, c = config.data, config.corpus
    if not config.storage.output_dir:
        raise UserInputError("Setting output_dir is empty: say where the shards go with --output_dir.")
    if not d.vocab_file:
        raise UserInputError("Setting vocab_file is empty: pass a vocab.txt (or build one with `tpu-pretrain vocab`).")
    out = Path(config.storage.output_dir)
    vocab = load_vocab(d.vocab_file)
    reader = CorpusReader(c.input, c, do_lower_case=d.do_lower_case)
    settings = {k: getattr(d, k) for k in DATA_SETTINGS} | {k: getattr(c, k) for k in CORPUS_SETTINGS}
    inputs = [{"path": p, "bytes": os.path.getsize(p)} for p in reader.files]
    if d.num_shards == 0:
        settings["num_shards"] = auto_num_shards(sum(i["bytes"] for i in inputs))
    identity = {"format": FORMAT, "settings": settings, "vocab_sha256": vocab_sha256(d.vocab_file), "inputs": inputs}
    _check_existing(out, identity)

    work = out / WORK_DIR
    partition = _read_json(work / "partition.json")
    if partition is None or partition["identity"] != identity:
        out.mkdir(parents=True, exist_ok=True)
        _write_json(out / ".identity.json", identity)
        partition = _partition(reader, work, settings, identity)
    if partition["documents"]["train"] == 0:
        raise UserInputError(
            f"The corpus ({', '.join(reader.files[:3])}) has no usable line: {partition['corpus_report']}."
        )

    jobs = [(split, index, count) for split, count in partition["shard_counts"].items() for index in range(count)]
    shards = {_shard_name(*job): _complete_stats(out, _shard_name(*job)) for job in jobs}  # verified once
    pending = [job for job in jobs if shards[_shard_name(*job)] is None]
    if pending:
        workers = min(config.data.workers or os.cpu_count() or 1, len(pending))
        task_args = [(job, str(out), str(work), d.vocab_file, settings) for job in pending]
        log.info("Writing %d shard(s) with %d worker(s)...", len(pending), workers)
        with contextlib.ExitStack() as stack:
            bar = stack.enter_context(tqdm(total=len(task_args), unit="shard", desc="shards", disable=None))
            if workers == 1:
                written = map(_shard_task, task_args)
            else:
                pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(
                    workers, initializer=_worker_init, initargs=(workers,)))
                written = pool.imap_unordered(_shard_task, task_args)
            for stats in written:
                shards[stats.file] = stats
                bar.update()
    manifest = Manifest(settings=settings, vocab_size=len(vocab), vocab_sha256=identity["vocab_sha256"],
                        inputs=inputs, corpus_report=partition["corpus_report"],
                        shards=[shards[_shard_name(*job)] for job in jobs], seconds=time.time() - start)
    _write_json(out / MANIFEST, manifest.to_json())
    if Path(d.vocab_file).resolve() != (out / "vocab.txt").resolve():
        shutil.copyfile(d.vocab_file, out / "vocab.txt")  # the data folder names its own vocab
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def auto_num_shards(corpus_bytes: int) -> int:
    """About 16 MB of text a shard, and up to 8 shards (for parallel workers) once the corpus passes 256 KB."""
    return max(1, min(8, math.ceil(corpus_bytes / (256 << 10))), math.ceil(corpus_bytes / SHARD_TARGET_BYTES))


def _shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def _check_existing(out: Path, identity: dict) -> None:
    """Refuse an output folder holding shards made from other settings, naming the differences."""
    previous = _read_json(out / ".identity.json")
    if previous is None:
        manifest = _read_json(out / MANIFEST)
        if manifest is not None:
            previous = {"format": manifest.get("format"), "settings": manifest.get("settings"),
                        "vocab_sha256": manifest.get("vocab_sha256"), "inputs": manifest.get("inputs")}
        elif out.is_dir() and any(out.glob("*.tfrecord")):
            raise UserInputError(
                f"Output folder '{out}' holds .tfrecord files but no {MANIFEST}: they were not made by this tool "
                "or by these settings. Use an empty --output_dir."
            )
    if previous is None or previous == identity:
        return
    differences = []
    for key, value in identity["settings"].items():
        old = (previous.get("settings") or {}).get(key)
        if old != value:
            differences.append(f"{key}: {old!r} there, {value!r} now")
    if previous.get("vocab_sha256") != identity["vocab_sha256"]:
        differences.append("vocab_file: a different vocab")
    if previous.get("inputs") != identity["inputs"]:
        differences.append("input: different corpus files or sizes")
    raise UserInputError(
        f"Output folder '{out}' holds shards made with other settings ({'; '.join(differences) or 'format'}). "
        "Use a new --output_dir, or delete that folder to rebuild it; nothing there was changed."
    )


def _partition(reader: CorpusReader, work: Path, settings: dict, identity: dict) -> dict:
    """Pass 1: deal normalised documents into per-shard work files (one sentence a line, blank between)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    num_train = settings["num_shards"]
    eval_fraction = settings["eval_fraction"]
    num_eval = math.ceil(num_train * eval_fraction) if eval_fraction > 0 else 0
    handles = {("train", i): open(work / f"train-{i}.txt", "w", encoding="utf-8") for i in range(num_train)}
    handles |= {("eval", i): open(work / f"eval-{i}.txt", "w", encoding="utf-8") for i in range(num_eval)}
    counts = {"train": 0, "eval": 0}
    chooser = random.Random(settings["random_seed"] ^ 0x5EED)
    total_bytes = sum(os.path.getsize(f) for f in reader.files)
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="reading corpus", disable=None)
    try:
        for doc in reader.documents():
            bar.update(reader.stats.input_bytes - bar.n)
            # Held out at random; the second document at the latest, so a small corpus still has an eval set.
            held_out = chooser.random() < eval_fraction or (counts["eval"] == 0 and counts["train"] >= 1)
            split = "eval" if num_eval and held_out else "train"
            handle = handles[(split, counts[split] % (num_eval if split == "eval" else num_train))]
            handle.write("\n".join(doc))
            handle.write("\n\n")
            counts[split] += 1
    finally:
        bar.close()
        for handle in handles.values():
            handle.close()
    partition = {
        "identity": identity,
        "documents": counts,
        "shard_counts": {"train": num_train, "eval": num_eval if counts["eval"] else 0},
        "corpus_report": reader.stats.report(),
    }
    _write_json(work / "partition.json", partition)
    log.info("Corpus: %s", partition["corpus_report"])
    return partition


def _complete_stats(out: Path, name: str) -> ShardStats | None:
    """A shard's stats if the shard is complete and matches its recorded checksum."""
    stats = _read_json(out / (name + ".json"))
    path = out / name
    if stats is None or not path.is_file() or path.stat().st_size != stats["bytes"]:
        return None
    if _sha256(path) != stats["sha256"]:
        log.warning("Shard %s does not match its checksum; it will be rewritten.", path)
        return None
    return ShardStats(**stats)


# -- one shard (runs in a worker process) -----------------------------------------------------------
def _worker_init(workers: int) -> None:
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    os.environ["RAYON_NUM_THREADS"] = threads
    os.environ["RAYON_RS_NUM_CPUS"] = threads
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


def _shard_task(args) -> ShardStats:
    (split, index, count), out, work, vocab_file, settings = args
    from .tokenization import load_tokenizer

    tokenizer = load_tokenizer(vocab_file, do_lower_case=settings["do_lower_case"])
    writer = ShardWriter(tokenizer, settings, split, index)
    name = _shard_name(split, index, count)
    stats = ShardStats(file=name, split=split)
    record_writer = AtomicRecordWriter(Path(out) / name)
    try:
        for block_number, block in enumerate(_read_blocks(Path(work) / f"{split}-{index}.txt")):
            records = writer.block_records(block, block_number, stats)
            record_writer.write_all(records)
        stats.sha256 = record_writer.close()
    except BaseException:
        record_writer.abort()
        raise
    stats.bytes = record_writer.bytes
    _write_json(Path(out) / (name + ".json"), asdict(stats))
    return stats


def _read_blocks(path: Path) -> Iterator[list[list[str]]]:
    """Documents of a work file, in blocks of about ``BLOCK_CHARS`` characters."""
    block: list[list[str]] = []
    doc: list[str] = []
    chars = 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
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


class ShardWriter:
    """Tokenises blocks of documents and turns them into serialised, shuffled pretraining examples."""

    def __init__(self, tokenizer, settings: dict, split: str, index: int):
        self.tokenizer = tokenizer
        self.settings = settings
        self.seed = (settings["random_seed"], 0 if split == "train" else 1, index)
        self.whole_word = settings["do_whole_word_mask"] or settings["chinese_whole_word"]
        special = set(SPECIAL_TOKENS)
        replacement = [i for i, t in enumerate(tokenizer.inv_vocab) if t not in special and not t.startswith("[unused")]
        self.spec = MaskingSpec(
            max_seq_length=settings["max_seq_length"],
            max_predictions_per_seq=settings["max_predictions_per_seq"],
            masked_lm_prob=settings["masked_lm_prob"],
            short_seq_prob=settings["short_seq_prob"],
            do_whole_word_mask=self.whole_word,
            nsp=not settings["no_nsp"],
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            mask_id=tokenizer.mask_id,
            replacement_ids=np.asarray(replacement, dtype=np.int32),
        )

    def tokenize_block(self, block: list[list[str]]) -> list[list[Sentence]]:
        sentences = [s for doc in block for s in doc]
        if self.settings["chinese_whole_word"]:
            encoded = chinese_word_continuations(self.tokenizer, sentences)
        else:
            ids = self.tokenizer.encode_batch(sentences)
            is_cont = self.tokenizer.is_continuation
            encoded = [(a, is_cont[a]) for a in ids]
        docs, k = [], 0
        for doc in block:
            sents = [s for s in encoded[k:k + len(doc)] if len(s[0])]
            k += len(doc)
            if sents:
                docs.append(sents)
        return docs

    def block_records(self, block: list[list[str]], block_number: int, stats: ShardStats) -> list[bytes]:
        docs = self.tokenize_block(block)
        stats.documents += len(docs)
        stats.sentences += sum(len(d) for d in docs)
        stats.tokens += sum(len(s[0]) for d in docs for s in d)
        seed = [*self.seed, block_number]
        rng = random.Random(hash_seed(seed))
        np_rng = np.random.Generator(np.random.PCG64(seed))
        records: list[bytes] = []
        pending: list[RawInstance] = []
        for _ in range(self.settings["dupe_factor"]):
            for doc_index in range(len(docs)):
                pending.extend(document_instances(docs, doc_index, self.spec, rng))
                if len(pending) >= BATCH:
                    records.extend(self._encode(pending, np_rng, stats))
                    pending = []
        if pending:
            records.extend(self._encode(pending, np_rng, stats))
        rng.shuffle(records)
        return records

    def _encode(self, instances: list[RawInstance], np_rng, stats: ShardStats) -> list[bytes]:
        batch = mask_batch(instances, self.spec, np_rng)
        stats.instances += len(instances)
        stats.masked_tokens += int(batch["masked_lm_weights"].sum())
        stats.real_tokens += sum(len(i.tokens_a) + len(i.tokens_b) for i in instances)
        stats.random_next += int(batch["next_sentence_labels"].sum())
        return encode_examples(batch)


def hash_seed(parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(list(parts)).encode()).digest()[:8], "little")


def chinese_word_continuations(tokenizer, sentences: list[str]) -> list[Sentence]:
    """Token ids, with a token marked as continuing a word when jieba puts it in the previous token's word."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    encodings = tokenizer.backend.encode_batch(sentences, add_special_tokens=False)
    result = []
    for text, encoding in zip(sentences, encodings, strict=True):
        word_of_char = np.zeros(len(text) + 1, dtype=np.int64)
        position = 0
        for word_index, word in enumerate(jieba.cut(text)):
            word_of_char[position:position + len(word)] = word_index
            position += len(word)
        starts = np.asarray([start for start, _ in encoding.offsets], dtype=np.int64)
        words = word_of_char[np.minimum(starts, len(text))]
        cont = np.zeros(len(starts), dtype=bool)
        cont[1:] = words[1:] == words[:-1]
        result.append((np.asarray(encoding.ids, dtype=np.int32), cont))
    return result


# -- small file helpers -----------------------------------------------------------------------------
def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
