"""One typed configuration for every step: data, vocab, model, training and storage.

The CLI flags, the notebooks' ``parameters`` cells and the Python API all use these field names.
Where Google's original BERT scripts had a flag, its name is kept so users of the old tutorials
find their way. Field names are unique across sections, so a flat mapping is unambiguous.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting is unknown, malformed or inconsistent; the message names it and the fix."""


def _f(default, help_text: str, **kwargs):
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help_text, **kwargs})
    return field(default=default, metadata={"help": help_text, **kwargs})


@dataclass
class CorpusConfig:
    """How raw text is read and normalised."""

    input: list[str] = _f([], "Corpus files, globs or folders (.txt, .gz).")
    doc_separator: str = _f("", "A line that separates documents (e.g. '%'); blank lines always do.")
    split_sentences: bool = _f(False, "Split lines holding a paragraph into sentences (English, Chinese).")
    unicode_normalization: str = _f("NFKC", "Unicode normal form: NFKC, NFC or none.", choices=("NFKC", "NFC", "none"))
    strip_control: bool = _f(True, "Remove control characters and ANSI escape sequences.")
    strip_punctuation: bool = _f(False, "Remove punctuation characters (as one of the old tutorials did).")
    dedupe_lines: bool = _f(False, "Drop exact duplicate lines (memory: 8 bytes per distinct line).")
    max_line_length: int = _f(20000, "Lines longer than this many characters are dropped and counted.")


@dataclass
class VocabConfig:
    """How a WordPiece vocab is built from the corpus."""

    vocab_size: int = _f(32000, "Exact size of the vocab.txt to build.")
    num_unused_tokens: int = _f(100, "[unusedN] placeholders reserved for later domain tokens.")
    vocab_sample_lines: int = _f(1_000_000, "Lines sampled at random from the corpus to train SentencePiece.")
    sentencepiece_model_type: str = _f("bpe", "SentencePiece algorithm: bpe or unigram.", choices=("bpe", "unigram"))


@dataclass
class PretrainingDataConfig:
    """How pretraining instances are made (flags of Google's create_pretraining_data.py)."""

    vocab_file: str = _f("", "WordPiece vocab.txt ([PAD] [UNK] [CLS] [SEP] [MASK] required).")
    max_seq_length: int = _f(128, "Tokens per sequence, [CLS] and [SEP]s included.")
    max_predictions_per_seq: int = _f(20, "Most masked positions per sequence.")
    masked_lm_prob: float = _f(0.15, "Fraction of real tokens masked.")
    dupe_factor: int = _f(10, "Times each document is used, with different masks.")
    short_seq_prob: float = _f(0.1, "Probability of a shorter target length (as in BERT).")
    random_seed: int = _f(12345, "Seed for everything random in data creation.")
    do_lower_case: bool = _f(True, "Lower-case and strip accents (uncased models).")
    do_whole_word_mask: bool = _f(False, "Mask all WordPieces of a word together.")
    no_nsp: bool = _f(False, "MLM only (RoBERTa-style): segments are consecutive sentences, no random next.")
    chinese_whole_word: bool = _f(False, "Whole-word masking of Chinese words found by jieba.")
    num_shards: int = _f(0, "Training shards to write; 0 picks one per ~32 MB of text (at least one).")
    eval_fraction: float = _f(0.01, "Fraction of documents held out in separate eval shards.")
    workers: int = _f(0, "Worker processes; 0 uses all cores.")


@dataclass
class ModelConfig:
    """Which BERT to build."""

    model_size: str = _f("", "Named size such as L4-H256 or base; ignored when bert_config_file is set.")
    bert_config_file: str = _f("", "bert_config.json of the model to build.")
    max_position_embeddings: int = _f(512, "Position embeddings of a model built from model_size.")
    init_checkpoint: str = _f("", "Initial weights: a Google TF checkpoint or a Hugging Face BERT folder.")
    hidden_dropout_prob: float = _f(-1.0, "Dropout rate; -1 keeps bert_config's (0.1 for a model_size).")


@dataclass
class TrainConfig:
    """How the model is trained (flags of Google's run_pretraining.py)."""

    train_batch_size: int = _f(32, "Global batch size, over all replicas.")
    learning_rate: float = _f(1e-4, "Peak learning rate.")
    num_train_steps: int = _f(100_000, "Total optimizer steps.")
    num_warmup_steps: int = _f(10_000, "Linear warmup steps.")
    save_checkpoints_steps: int = _f(1000, "Steps between checkpoints.")
    optimizer: str = _f("adamw", "adamw (BERT's Adam with decoupled weight decay) or lamb (large batches).",
                        choices=("adamw", "lamb"))
    weight_decay_rate: float = _f(0.01, "Decoupled weight decay; LayerNorm and bias weights are excluded.")
    adam_beta1: float = _f(0.9, "Adam/LAMB first-moment decay.")
    adam_beta2: float = _f(0.999, "Adam/LAMB second-moment decay.")
    adam_epsilon: float = _f(1e-6, "Adam/LAMB epsilon.")
    lr_decay_power: float = _f(1.0, "Polynomial decay power after warmup (1.0: linear, as in BERT).")
    end_learning_rate: float = _f(0.0, "Learning rate reached at num_train_steps.")
    clip_norm: float = _f(1.0, "Global gradient-norm clipping threshold (0 disables).")
    gradient_accumulation_steps: int = _f(1, "Micro-batches per optimizer step (train_batch_size is split).")
    steps_per_execution: int = _f(0, "Steps per compiled call (iterations_per_loop); 0: auto by accelerator.")
    eval_batch_size: int = _f(0, "Global eval batch size (0: train_batch_size).")
    max_eval_steps: int = _f(100, "Most eval batches per evaluation.")
    eval_every_steps: int = _f(1000, "Steps between evaluations on the eval shards (0: only at the end).")
    log_every_steps: int = _f(100, "Steps between TensorBoard scalars and log lines.")
    dynamic_masking: bool = _f(False, "Re-mask on the fly each time a sequence is read (RoBERTa-style).")
    shuffle_buffer_size: int = _f(10_000, "Records in the shuffle buffer of the training input.")
    train_seed: int = _f(0, "Seed for weight initialisation, data order, dropout and dynamic masks.")
    accelerator: str = _f("auto", "auto, tpu, gpu or cpu.", choices=("auto", "tpu", "gpu", "cpu"))
    tpu_name: str = _f("local", "TPU to use: 'local' on TPU VMs (Colab, Kaggle), or a TPU name/grpc address.")
    mixed_precision: str = _f("auto", "auto (bfloat16 TPU, float16 on capable GPUs, float32 CPU), float32, "
                              "bfloat16 or float16.", choices=("auto", "float32", "bfloat16", "float16"))
    jit_compile: str = _f("auto", "XLA-compile the training step: auto (TPU/GPU), on or off.",
                          choices=("auto", "on", "off"))
    session_hours: float = _f(0.0, "Session length: 0 = the platform's (Colab 12 h, Kaggle 9 h, else none), "
                              "-1 = none; training saves and stops cleanly before it ends.")
    session_margin_minutes: float = _f(10.0, "Stop this long before the session ends (time for the last save).")
    log_example_ids: bool = _f(False, "Append the ids of the examples each step used to logs/example_ids.jsonl.")


@dataclass
class StorageConfig:
    """Where things live."""

    data_dir: str = _f("", "Folder (or gs:// URL) holding the TFRecord shards and manifest.json.")
    output_dir: str = _f("", "Folder (or gs:// URL) this step writes to.")
    keep_checkpoint_max: int = _f(5, "Newest checkpoints kept.")
    mirror_dir: str = _f("", "Drive folder or gs:// URL where the run's checkpoints are mirrored in the background.")
    transfer_workers: int = _f(8, "Parallel file transfers to and from Cloud Storage.")
    transfer_retries: int = _f(5, "Retries per file on transient errors (exponential backoff).")
    resumable_chunk_mb: int = _f(8, "Files at least this large go up in resumable chunks of this many MiB.")
    parallel_threshold_mb: int = _f(150, "Files at least this large move as parallel slices (composite upload, "
                                    "ranged download) when transfer_workers > 1.")
    mount_drive: bool = _f(False, "On Colab, mount Google Drive when a path is under /content/drive.")


SECTIONS: dict[str, type] = {
    "corpus": CorpusConfig,
    "vocab": VocabConfig,
    "data": PretrainingDataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "storage": StorageConfig,
}


@dataclass
class Config:
    """The whole configuration; build it with :meth:`from_kwargs`, :meth:`from_file` or :meth:`load`."""

    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    data: PretrainingDataConfig = field(default_factory=PretrainingDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Config:
        """Flat keyword arguments (``max_seq_length=128``) or section dicts (``data={...}``)."""
        return cls.from_dict(kwargs)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "configuration") -> Config:
        config = cls()
        config.update(values, source=source)
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Config:
        return cls.from_dict(read_config_file(path), source=str(path))

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, **overrides: Any) -> Config:
        """A file's settings (if any), then keyword overrides, validated."""
        config = cls.from_file(path) if path else cls()
        config.update(overrides)
        config.validate()
        return config

    def update(self, values: dict[str, Any], source: str = "configuration") -> None:
        for key, value in values.items():
            if key in SECTIONS and isinstance(value, dict):
                for sub_key, sub_value in value.items():
                    if sub_key not in _FIELD_SECTION or _FIELD_SECTION[sub_key] != key:
                        raise ConfigError(_unknown_key_message(sub_key, source, section=key))
                    self.set(sub_key, sub_value, source)
            else:
                self.set(key, value, source)

    def set(self, key: str, value: Any, source: str = "configuration") -> None:
        section = _FIELD_SECTION.get(key)
        if section is None:
            raise ConfigError(_unknown_key_message(key, source))
        setattr(getattr(self, section), key, _coerce(key, value, source))

    def get(self, key: str) -> Any:
        if key not in _FIELD_SECTION:
            raise ConfigError(_unknown_key_message(key, "configuration"))
        return getattr(getattr(self, _FIELD_SECTION[key]), key)

    # -- output -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def flat(self) -> dict[str, Any]:
        return {key: value for section in self.to_dict().values() for key, value in section.items()}

    def save(self, path: str | os.PathLike) -> None:
        """Write the resolved configuration as JSON (atomically: a reader never sees half a file)."""
        from .storage.local import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> Config:
        """Check consistency between settings; raise :class:`ConfigError` naming setting and fix."""
        d, c, v, m, s = self.data, self.corpus, self.vocab, self.model, self.storage
        _require(d.max_seq_length >= 8, "max_seq_length", d.max_seq_length, "use at least 8 (BERT uses 128 or 512)")
        _require(
            d.max_seq_length <= m.max_position_embeddings,
            "max_seq_length",
            d.max_seq_length,
            f"it is above max_position_embeddings={m.max_position_embeddings}; lower max_seq_length or "
            "raise max_position_embeddings (a released model's limit cannot be raised)",
        )
        _require(0 < d.masked_lm_prob < 1, "masked_lm_prob", d.masked_lm_prob, "use a value in (0, 1), e.g. 0.15")
        _require(d.max_predictions_per_seq >= 1, "max_predictions_per_seq", d.max_predictions_per_seq,
                 "use at least 1")
        budget = masked_budget(d.max_seq_length, d.masked_lm_prob)
        _require(
            d.max_predictions_per_seq <= math.ceil(budget * 1.1) + 1,
            "max_predictions_per_seq",
            d.max_predictions_per_seq,
            f"masking never fills that many: at most {budget} of max_seq_length={d.max_seq_length} tokens "
            f"are masked at masked_lm_prob={d.masked_lm_prob}; set max_predictions_per_seq={budget + 1} "
            "(BERT: 20 for 128, 80 for 512) or raise masked_lm_prob",
        )
        _require(0 <= d.short_seq_prob <= 1, "short_seq_prob", d.short_seq_prob, "use a value in [0, 1]")
        _require(d.dupe_factor >= 1, "dupe_factor", d.dupe_factor, "use at least 1")
        _require(0 <= d.eval_fraction <= 0.5, "eval_fraction", d.eval_fraction, "use a value in [0, 0.5]")
        _require(d.num_shards >= 0, "num_shards", d.num_shards, "use 0 (automatic) or a positive count")
        _require(d.workers >= 0, "workers", d.workers, "use 0 (all cores) or a positive count")
        _require(c.max_line_length >= 1, "max_line_length", c.max_line_length, "use a positive character count")
        _require(v.num_unused_tokens >= 0, "num_unused_tokens", v.num_unused_tokens, "use 0 or more")
        _require(
            v.vocab_size >= 5 + v.num_unused_tokens + 100,
            "vocab_size",
            v.vocab_size,
            f"too small for 5 special tokens, {v.num_unused_tokens} [unusedN] and the characters; use at "
            "least a few thousand (BERT uses 30522; Chinese BERT 21128)",
        )
        _require(v.vocab_sample_lines >= 100, "vocab_sample_lines", v.vocab_sample_lines, "use at least 100")
        _require(s.keep_checkpoint_max >= 1, "keep_checkpoint_max", s.keep_checkpoint_max, "keep at least 1")
        _require(s.transfer_workers >= 1, "transfer_workers", s.transfer_workers, "use at least 1")
        _require(s.transfer_retries >= 0, "transfer_retries", s.transfer_retries, "use 0 or more")
        _require(s.resumable_chunk_mb >= 1, "resumable_chunk_mb", s.resumable_chunk_mb, "use at least 1")
        _require(s.parallel_threshold_mb >= 1, "parallel_threshold_mb", s.parallel_threshold_mb, "use at least 1")
        t = self.train
        _require(t.train_batch_size >= 1, "train_batch_size", t.train_batch_size, "use at least 1")
        _require(t.learning_rate > 0, "learning_rate", t.learning_rate, "use a positive value, e.g. 1e-4")
        _require(t.num_train_steps >= 1, "num_train_steps", t.num_train_steps, "use at least 1")
        _require(
            0 <= t.num_warmup_steps <= t.num_train_steps,
            "num_warmup_steps",
            t.num_warmup_steps,
            f"use a value between 0 and num_train_steps={t.num_train_steps}",
        )
        _require(t.save_checkpoints_steps >= 1, "save_checkpoints_steps", t.save_checkpoints_steps,
                 "use at least 1")
        _require(t.gradient_accumulation_steps >= 1, "gradient_accumulation_steps",
                 t.gradient_accumulation_steps, "use at least 1")
        _require(t.train_batch_size % t.gradient_accumulation_steps == 0, "train_batch_size",
                 t.train_batch_size, f"it must be a multiple of gradient_accumulation_steps="
                 f"{t.gradient_accumulation_steps} (the global batch is split into that many micro-batches)")
        _require(t.steps_per_execution >= 0, "steps_per_execution", t.steps_per_execution,
                 "use 0 (auto) or more")
        _require(t.eval_batch_size >= 0, "eval_batch_size", t.eval_batch_size,
                 "use 0 (train_batch_size) or more")
        _require(t.clip_norm >= 0, "clip_norm", t.clip_norm, "use 0 (off) or a positive norm such as 1.0")
        _require(t.weight_decay_rate >= 0, "weight_decay_rate", t.weight_decay_rate,
                 "use 0 or more, e.g. 0.01")
        _require(t.log_every_steps >= 1, "log_every_steps", t.log_every_steps, "use at least 1")
        _require(t.eval_every_steps >= 0, "eval_every_steps", t.eval_every_steps, "use 0 (end only) or more")
        _require(t.max_eval_steps >= 1, "max_eval_steps", t.max_eval_steps, "use at least 1")
        return self


def masked_budget(max_seq_length: int, masked_lm_prob: float) -> int:
    """The most tokens masking picks in a full sequence ([CLS] and two [SEP]s excluded)."""
    return max(1, int(round((max_seq_length - 3) * masked_lm_prob)))


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Configuration file {path} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as exc:  # yaml and json raise different types; both messages name the line
        raise ConfigError(f"Cannot parse configuration file {path}: {exc}") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"Configuration file {path} must hold a mapping of setting names to values.")
    return values


def all_fields() -> dict[str, dataclasses.Field]:
    """Every setting by name, in section order."""
    return {f.name: f for section in SECTIONS.values() for f in dataclasses.fields(section)}


_FIELD_SECTION: dict[str, str] = {
    f.name: name for name, section in SECTIONS.items() for f in dataclasses.fields(section)
}
assert len(_FIELD_SECTION) == sum(len(dataclasses.fields(s)) for s in SECTIONS.values()), "duplicate names"
_FIELD_TYPES: dict[str, Any] = {
    name: typing.get_type_hints(section)[f.name]
    for section in SECTIONS.values()
    for f in dataclasses.fields(section)
    for name in [f.name]
}


def field_type(key: str) -> Any:
    return _FIELD_TYPES[key]


def _unknown_key_message(key: str, source: str, section: str | None = None) -> str:
    candidates = list(_FIELD_SECTION) + list(SECTIONS)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    where = f" in section '{section}'" if section else ""
    hint = f" Did you mean '{close[0]}'?" if close else " See `tpu-pretrain <step> --help` for the settings."
    return f"Unknown setting '{key}'{where} in {source}.{hint}"


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "t", "y"):
        return True
    if text in ("0", "false", "no", "off", "f", "n"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = _FIELD_TYPES[key]
    meta = all_fields()[key].metadata
    try:
        if kind is bool:
            result = parse_bool(value)
        elif kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("not an integer")
            result = int(value)
        elif kind is float:
            if isinstance(value, bool):
                raise ValueError("not a number")
            result = float(value)
        elif kind is str:
            if not isinstance(value, str | int | float | os.PathLike):
                raise ValueError("not a string")
            result = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        elif typing.get_origin(kind) is list or isinstance(kind, types.GenericAlias):
            if isinstance(value, str | os.PathLike):
                value = [value]
            result = [os.fspath(item) if isinstance(item, os.PathLike) else str(item) for item in value]
        else:  # pragma: no cover - every field has one of the kinds above
            result = value
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"Setting '{key}' in {source} has value {value!r}, which is not a valid "
            f"{getattr(kind, '__name__', kind)} ({exc})."
        ) from None
    choices = meta.get("choices")
    if choices and result not in choices:
        close = difflib.get_close_matches(str(result), choices, n=1, cutoff=0.4)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Setting '{key}' in {source} is {result!r}; choose one of {', '.join(choices)}.{hint}")
    return result


def _require(ok: bool, key: str, value: Any, fix: str) -> None:
    if not ok:
        raise ConfigError(f"Setting {key}={value!r} is invalid: {fix}.")
