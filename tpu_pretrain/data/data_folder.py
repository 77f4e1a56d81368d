"""The contract of a data folder: what ``create-data`` writes and every reader relies on.

A data folder holds shards named ``train-00000-of-00004.tfrecord`` (and ``eval-...``) in the original
BERT schema, the ``vocab.txt`` (or ``tokenizer.json``) the data was made with, and ``manifest.json``: the
settings, the vocab's hash, and per shard its documents, tokens, instances, masked tokens, bytes and sha256.
This module is the one place that names those files, describes the features and parses the manifest;
training, evaluation and the notebooks ask it rather than reading the files themselves.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import UserInputError
from ..folder_lock import FolderLock
from .tfrecord import CorruptRecord, decode_example, read_records
from .tokenizer_json import TOKENIZER_JSON as TOKENIZER  # the vocab of data made with a tokenizer.json

MANIFEST = "manifest.json"
VOCAB = "vocab.txt"
IDENTITY = ".identity.json"  # the settings a folder's shards are being made with (before the manifest exists)
WORK_DIR = ".work"
LOCK = "create-data.lock"  # held by the one create-data process writing the folder
FORMAT = "tpu_pretrain.pretraining_data/1"
TRAIN, EVAL = "train", "eval"
LOW_FILL = 0.6  # below this share of real tokens, the summary suggests packing

# The original BERT pretraining features: name -> (dtype, length kind); zero padded.
FEATURES = {
    "input_ids": ("int64", "seq"),
    "input_mask": ("int64", "seq"),
    "segment_ids": ("int64", "seq"),
    "masked_lm_positions": ("int64", "pred"),
    "masked_lm_ids": ("int64", "pred"),
    "masked_lm_weights": ("float32", "pred"),
    "next_sentence_labels": ("int64", "one"),
}


FEW_EVAL_SEQUENCES = 300  # a held-out split smaller than this gives figures too noisy to compare runs by
MOST_EVAL_FRACTION = 0.25  # beyond it, held-out text is training text a small corpus cannot spare


def feature_shapes(max_seq_length: int, max_predictions_per_seq: int) -> dict[str, tuple[str, int]]:
    """``{feature: (dtype, length)}`` for records of these shapes (readers build their parse spec from it)."""
    lengths = {"seq": max_seq_length, "pred": max_predictions_per_seq, "one": 1}
    return {name: (dtype, lengths[kind]) for name, (dtype, kind) in FEATURES.items()}


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def shard_stats_name(shard: str) -> str:
    """The file holding a finished shard's statistics until the manifest takes them over."""
    return shard + ".json"


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
    vocab_name: str = ""  # the folder's copy of the vocab: vocab.txt or tokenizer.json (empty: data made before)

    def totals(self, split: str) -> dict:
        keys = ("documents", "sentences", "tokens", "instances", "masked_tokens", "real_tokens", "random_next", "bytes")
        return {k: sum(getattr(s, k) for s in self.shards if s.split == split) for k in keys}

    def files(self, split: str) -> list[str]:
        return [s.file for s in self.shards if s.split == split]

    def fill(self, split: str = TRAIN) -> float | None:
        """Real tokens / (instances x max_seq_length): the share of compute that is not padding or [CLS]/[SEP]
        (None when unknown: no instances, or a manifest without the sequence length)."""
        t, length = self.totals(split), int(self.settings.get("max_seq_length") or 0)
        return t["real_tokens"] / (t["instances"] * length) if t["instances"] and length else None

    def to_json(self) -> dict:
        data = asdict(self)
        data["totals"] = {split: self.totals(split) | {"fill": self.fill(split) and round(self.fill(split), 4)}
                          for split in (TRAIN, EVAL)}
        return data

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        data = dict(data)
        data.pop("totals", None)
        shards = [ShardStats(**s) for s in data.pop("shards")]
        return cls(shards=shards, **data)

    def summary(self) -> str:
        lines = []
        for split in (TRAIN, EVAL):
            t = self.totals(split)
            if not self.files(split):
                continue
            share = t["masked_tokens"] / max(t["real_tokens"], 1)
            nsp = t["random_next"] / max(t["instances"], 1)
            nsp = "" if self.settings.get("no_nsp") else f", random next {nsp:.1%}"  # MLM only: no such pairs
            packed = "packed, " if self.settings.get("pack_sequences") else ""
            fill = f" ({packed}fill {self.fill(split):.2f})" if self.fill(split) is not None else ""
            lines.append(
                f"{split}: {len(self.files(split))} shard(s), {t['documents']} documents, {t['tokens']} tokens, "
                f"{t['instances']} instances{fill}, {t['masked_tokens']} masked ({share:.1%} of real tokens){nsp}"
            )
        lines.append(f"corpus: {self.corpus_report}")
        lines.append(f"time: {self.seconds:.1f} s")
        lines += [f"warning: {w}" for w in self.warnings()]
        return "\n".join(lines)

    def warnings(self) -> list[str]:
        """What makes this data worse than its settings promise, each with the fix."""
        train, found = self.totals(TRAIN), []
        instances, documents, shards = train["instances"], train["documents"], len(self.files(TRAIN))
        doc_fix = "separate documents with blank lines (or --doc_separator lines)"
        if not instances:
            found.append(f"no training instances (from {documents} documents): train refuses this data. "
                         "Give more text, or lower --max_seq_length.")
        fill = self.fill()
        if fill is not None and fill < LOW_FILL and not self.settings.get("pack_sequences"):
            found.append(
                f"fill {fill:.2f}: only {fill:.0%} of each {self.settings['max_seq_length']}-token sequence is text, "
                "the rest padding that costs compute all the same (the documents are short). Pack them with "
                "--pack_sequences (or --recipe modern), or lower --max_seq_length.")
        nsp = not self.settings.get("no_nsp") and instances
        if nsp and train["random_next"] > 0.7 * instances:
            found.append(
                f"{train['random_next'] / instances:.0%} of instances have a random next segment (about 50% is "
                "the aim): most documents hold one sentence, so next-sentence prediction learns little. Use "
                "--split_sentences for a paragraph-per-line corpus, blank lines or --doc_separator between "
                "documents, or --no_nsp.")
        elif nsp and train["random_next"] < 0.3 * instances:
            found.append(
                f"only {train['random_next'] / instances:.0%} of instances have a random next segment (about 50% "
                f"is the aim): a random next segment comes from another document of the same shard, and the "
                f"{shards} shard(s) hold {documents} document(s). {doc_fix.capitalize()}, use fewer --num_shards "
                "than documents, or --no_nsp.")
        found += self._masking_warnings()
        held_out = self.totals(EVAL)
        if self.files(EVAL) and not held_out["instances"]:
            found.append(f"the held-out split is empty: its {held_out['documents']} document(s) gave no instance, so "
                         "train skips evaluation. Raise --eval_fraction (now "
                         f"{self.settings.get('eval_fraction')}), or give a larger corpus.")
        elif 0 < held_out["instances"] < FEW_EVAL_SEQUENCES:
            fraction = self.settings.get("eval_fraction") or 0
            enough = fraction * FEW_EVAL_SEQUENCES / held_out["instances"]  # about, documents being of all sizes
            fix = (f"Raise --eval_fraction (now {fraction}) to about {enough:.2g} for {FEW_EVAL_SEQUENCES} or more, or "
                   "give a larger corpus" if enough <= MOST_EVAL_FRACTION else "Give a larger corpus (--eval_fraction, "
                   f"now {fraction}, would have to hold out more than {MOST_EVAL_FRACTION:.0%} of it)")
            found.append(f"the held-out split has only {held_out['instances']} sequences ({held_out['documents']} "
                         f"documents): its figures would move by chance more than by training. {fix}.")
        if self.settings.get("eval_fraction") and not self.files(EVAL):
            found.append(f"no eval shard: {documents} document(s) are too few to hold any out "
                         f"(eval_fraction={self.settings['eval_fraction']}); {doc_fix}.")
        return found


    def _masking_warnings(self) -> list[str]:
        """A masking rate reached far below the one asked for (whole words longer than a sequence's budget are
        never masked: long words of a byte-level BPE)."""
        found = []
        for split, key in ((TRAIN, "masked_lm_prob"), (EVAL, "eval_masked_lm_prob")):
            t, wanted = self.totals(split), self.settings.get(key)
            if not wanted or not t["real_tokens"] or t["masked_tokens"] >= 0.5 * wanted * t["real_tokens"]:
                continue
            whole = self.settings.get("do_whole_word_mask") or self.settings.get("chinese_whole_word")
            why = (" with whole-word masking: a word of more tokens than a sequence's masking budget "
                   f"(max_predictions_per_seq={self.settings.get('max_predictions_per_seq')}) is never masked, and "
                   "these words are long. Leave out --do_whole_word_mask, or mask more per sequence "
                   "(--max_predictions_per_seq, --max_seq_length)" if whole else
                   ": the masking budget per sequence is too small (raise --max_predictions_per_seq, or set it to 0 "
                   "to size it for the rate)")
            found.append(f"{split}: {t['masked_tokens'] / t['real_tokens']:.1%} of tokens are masked, far below "
                         f"{key}={wanted}{why}.")
        return found


def read_manifest(data_dir: str | os.PathLike) -> Manifest | None:
    """The folder's manifest, or None when it has none (data made by another tool)."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return Manifest.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserInputError(f"{path} is not a manifest this tool can read ({exc}); run create-data again.") from None


def load_manifest(data_dir: str | os.PathLike) -> Manifest:
    manifest = read_manifest(data_dir)
    if manifest is None:
        raise UserInputError(f"No {MANIFEST} in '{data_dir}': make the data with `tpu-pretrain create-data` first.")
    return manifest


@dataclass
class DataInfo:
    """The shards and shapes of a data folder (from manifest.json, or from the files themselves)."""

    data_dir: str
    train_files: list[str]
    eval_files: list[str]
    max_seq_length: int
    max_predictions_per_seq: int
    vocab_size: int | None = None
    vocab_sha256: str | None = None
    train_instances: int | None = None
    eval_instances: int | None = None
    settings: dict = field(default_factory=dict)
    train_sha256: list[str] = field(default_factory=list)
    lost_vocab: str = ""  # the vocab file the manifest records and the folder no longer holds

    @property
    def vocab_file(self) -> str | None:
        """The data's own vocab.txt or tokenizer.json (create-data puts a copy there), if present."""
        return data_vocab_file(self.data_dir)


def data_vocab_file(data_dir: str | os.PathLike) -> str | None:
    """The vocab a data folder keeps, ``vocab.txt`` or (data made with a tokenizer.json) ``tokenizer.json``; None
    without a folder (a run planned before its data exists)."""
    for name in (VOCAB, TOKENIZER) if data_dir else ():
        if os.path.isfile(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    return None


def read_data_info(data_dir: str, splits: tuple[str, ...] = (TRAIN, EVAL)) -> DataInfo:
    """Find the train/eval shards; read their shapes from the manifest, or from the first record.

    ``splits``: the shards that must be present (evaluation needs only the eval shards and the manifest)."""
    if not data_dir:
        raise UserInputError("Set data_dir: the folder written by `tpu-pretrain create-data`.")
    if not os.path.isdir(data_dir):
        raise UserInputError(f"data_dir {data_dir} does not exist (run `tpu-pretrain create-data` first).")
    manifest = read_manifest(data_dir)
    if manifest is not None:
        info = _info_from_manifest(data_dir, manifest, splits)
    else:
        check_not_unfinished(data_dir)
        info = DataInfo(data_dir, sorted(glob.glob(os.path.join(data_dir, "train-*.tfrecord"))),
                        sorted(glob.glob(os.path.join(data_dir, "eval-*.tfrecord"))), 0, 0)
    if not info.train_files and TRAIN in splits:
        raise UserInputError(f"No training shards (train-*.tfrecord) in {data_dir}.")
    if not info.max_seq_length or not info.max_predictions_per_seq:
        info.max_seq_length, info.max_predictions_per_seq = record_shapes((info.train_files or info.eval_files)[0])
    return info


def _info_from_manifest(data_dir: str, manifest: Manifest, splits: tuple[str, ...]) -> DataInfo:
    train = [os.path.join(data_dir, f) for f in manifest.files(TRAIN)]
    evals = [os.path.join(data_dir, f) for f in manifest.files(EVAL)]
    missing = [os.path.join(data_dir, f) for split in splits for f in manifest.files(split)
               if not os.path.isfile(os.path.join(data_dir, f))]
    if missing:
        raise UserInputError(f"{os.path.join(data_dir, MANIFEST)} lists shards that are missing: "
                             f"{', '.join(missing[:3])}; copy the whole data folder or run create-data again.")
    resized = [f"{s.file} ({os.path.getsize(os.path.join(data_dir, s.file))} bytes, the manifest says {s.bytes})"
               for s in manifest.shards if s.split in splits and s.bytes
               and os.path.getsize(os.path.join(data_dir, s.file)) != s.bytes]
    if resized:
        raise UserInputError(f"Shards in {data_dir} are truncated or were replaced: {'; '.join(resized[:3])}. Copy "
                             "the data folder again, or run create-data again (it rewrites what does not match).")
    vocab = data_vocab_file(data_dir)
    if manifest.vocab_sha256 and vocab and sha256_file(vocab) != manifest.vocab_sha256:
        raise UserInputError(
            f"{vocab} is not the vocab the data in {data_dir} was made with (its sha256 differs from the one "
            f"{MANIFEST} records): its token ids would mean other words. Put back the vocab given to create-data "
            "(--vocab_file), or run create-data again with this one.")
    settings = manifest.settings
    lost = "" if vocab or not manifest.vocab_sha256 else manifest.vocab_name or f"{VOCAB} or {TOKENIZER}"
    return DataInfo(data_dir, train, evals, int(settings.get("max_seq_length") or 0),
                    int(settings.get("max_predictions_per_seq") or 0), manifest.vocab_size, manifest.vocab_sha256,
                    manifest.totals(TRAIN)["instances"], manifest.totals(EVAL)["instances"], settings,
                    [s.sha256 for s in manifest.shards if s.split == TRAIN], lost)


def data_folder_lock(folder: str | os.PathLike) -> FolderLock:
    """``with data_folder_lock(out):`` one create-data process at a time writes the data folder ``out``."""
    return FolderLock(Path(folder) / LOCK, "create-data process", "data folder",
                      "Two create-data runs in one output_dir would write and remove each other's files", "output_dir")


def check_not_unfinished(data_dir: str | os.PathLike) -> None:
    """Refuse a folder whose create-data stopped before its manifest: its shards are part of the corpus only."""
    folder = Path(data_dir)
    if not (folder / IDENTITY).is_file() and not (folder / WORK_DIR).is_dir():
        return
    done = len(list(folder.glob(shard_stats_name("*-of-*.tfrecord"))))
    try:
        total = sum(json.loads((folder / WORK_DIR / "partition.json").read_text())["shard_counts"].values())
        count = f"{done} of {total} shards are complete"
    except (OSError, ValueError, KeyError, AttributeError):
        count = f"{done} shard(s) are complete"
    raise UserInputError(
        f"The data in {data_dir} is unfinished: create-data stopped before it wrote {MANIFEST} ({count}). Run the "
        "same create-data command again (same --input, --vocab_file, --output_dir and settings) to finish it: the "
        "complete shards are kept. Training on part of the shards would train on part of the corpus.")


def damaged_shards(data_dir: str | os.PathLike) -> list[str]:
    """The shards whose sha256 differs from the manifest's (a full read of every shard: for after a failure)."""
    manifest = read_manifest(data_dir)
    if manifest is None:
        return []
    return [s.file for s in manifest.shards if s.sha256 and sha256_file(Path(data_dir) / s.file) != s.sha256]


def corrupt_shard_error(data_dir: str | os.PathLike, problem: object) -> UserInputError:
    """The one message every reader of shards gives for a damaged one (``problem``: what the read found): which
    shards no longer match the manifest, and what to do."""
    damaged = damaged_shards(data_dir)
    which = (f"{', '.join(damaged)} no longer match(es) the checksums in the manifest" if damaged
             else "no shard differs from its manifest checksum, so the copy being read may be failing")
    return UserInputError(
        f"A shard in {data_dir} is corrupt ({str(problem).splitlines()[0]}): {which}. Copy the data folder again (or "
        "run create-data again: it rewrites what does not match), then run the same command again (train resumes).")


def sha256_file(path: str | os.PathLike) -> str:
    """A shard's checksum as the manifest records it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_shapes(path: str) -> tuple[int, int]:
    """(max_seq_length, max_predictions_per_seq) of the first record of a shard."""
    try:
        first = next(iter(read_records(path)), None)
    except CorruptRecord as exc:
        raise corrupt_shard_error(os.path.dirname(path), exc) from None
    if first is None:
        raise UserInputError(f"{path} holds no records.")
    example = decode_example(first)
    try:
        return len(example["input_ids"]), len(example["masked_lm_positions"])
    except KeyError as exc:
        raise UserInputError(f"{path} is not in the BERT pretraining schema (no {exc}).") from None


def check_token_ids(info: DataInfo, vocab_size: int, records_per_shard: int = 64, max_shards: int = 64) -> None:
    """Refuse data whose token ids reach ``vocab_size``, from the first records of (up to) ``max_shards`` shards.

    Why on the host, before training: on a TPU the embedding lookup is an XLA gather, which clamps an
    out-of-range id to the last row without an error, so a vocab mismatch would train silently on wrong tokens.
    The manifest's vocab size is compared by whoever builds the model; this reads the records themselves (data
    from other tools has no manifest), a few per shard, so it costs well under a second.
    """
    files = info.train_files + info.eval_files
    step = max(1, len(files) // max_shards)
    for path in files[::step]:
        try:
            _check_ids_of_shard(path, vocab_size, records_per_shard)
        except CorruptRecord as exc:
            raise corrupt_shard_error(info.data_dir, exc) from None


def _check_ids_of_shard(path: str, vocab_size: int, records_per_shard: int) -> None:
    for index, record in enumerate(read_records(path)):
        if index == records_per_shard:
            break
        example = decode_example(record)
        for feature in ("input_ids", "masked_lm_ids"):
            values = example.get(feature)
            if values is not None and len(values) and int(values.max()) >= vocab_size:
                raise UserInputError(
                    f"{path}, record {index}: {feature} holds the id {int(values.max())} but the model's vocab has "
                    f"{vocab_size} tokens (ids 0-{vocab_size - 1}). On a TPU such an id is silently clamped to "
                    "the last one. Make the data with the model's vocab.txt, or use the vocab (and a "
                    "bert_config_file) the data was made with.")

