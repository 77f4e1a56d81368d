"""The checks a configuration must pass: values of the right kind, and settings that agree.

Every error is a :class:`ConfigError` that names the setting, its value and the fix.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import types
import typing
from pathlib import Path
from typing import Any

from .errors import UserInputError
from .models.families import FAMILIES

log = logging.getLogger(__name__)


class ConfigError(UserInputError):
    """A setting is unknown, malformed or inconsistent; the message names it and the fix."""


def check_settings(config) -> None:
    """Check each setting's range and the consistency between settings."""
    check_family_of_checkpoint(config)
    _check_data(config.data, config.model)
    _check_corpus_and_vocab(config.corpus, config.vocab)
    _check_storage(config.storage)
    _check_train(config.train)


def _check_data(d, m) -> None:
    _require(d.random_seed >= 0, "random_seed", d.random_seed, "use 0 or more")
    _require(d.max_seq_length >= 8, "max_seq_length", d.max_seq_length, "use at least 8 (BERT uses 128 or 512)")
    # The data has no position limit: train checks the model's against the data's length (core.resolve).
    _require(m.max_position_embeddings >= 0, "max_position_embeddings", m.max_position_embeddings,
             "use 0 (the model family's own: bert 512, modernbert 8,192) or at least the data's max_seq_length")
    _require(0 < d.masked_lm_prob < 1, "masked_lm_prob", d.masked_lm_prob, "use a value in (0, 1), e.g. 0.15")
    _require(0 < d.eval_masked_lm_prob < 1, "eval_masked_lm_prob", d.eval_masked_lm_prob,
             "use a value in (0, 1), e.g. 0.15")
    _require(d.max_predictions_per_seq >= 0, "max_predictions_per_seq", d.max_predictions_per_seq,
             "use 0 (enough for masked_lm_prob) or at least 1")
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
    _require(m.hidden_dropout_prob == -1 or 0 <= m.hidden_dropout_prob < 1, "hidden_dropout_prob",
             m.hidden_dropout_prob, "use a rate in [0, 1), e.g. 0.1, or -1 for the model's own")


def _check_corpus_and_vocab(c, v) -> None:
    _require(c.max_line_length >= 1, "max_line_length", c.max_line_length, "use a positive character count")
    _require(c.max_documents >= 0, "max_documents", c.max_documents, "use 0 (all) or a positive count")
    _require(c.max_bytes >= 0, "max_bytes", c.max_bytes, "use 0 (no limit) or a positive byte count")
    try:
        ascii_compatible = "\n".encode(c.encoding) == b"\n"
    except LookupError:
        raise ConfigError(f"Setting encoding={c.encoding!r} is invalid: it is not an encoding Python knows "
                          "(e.g. utf-8, latin-1, cp1252, gbk, shift_jis).") from None
    _require(ascii_compatible, "encoding", c.encoding, "the corpus is read line by line, which needs an "
             "ASCII-compatible encoding; convert the files to UTF-8 first (iconv -t UTF-8)")
    _require(v.num_unused_tokens >= 0, "num_unused_tokens", v.num_unused_tokens, "use 0 or more")
    _require(
        v.vocab_size >= 5 + v.num_unused_tokens + 100,
        "vocab_size",
        v.vocab_size,
        f"too small for 5 special tokens, {v.num_unused_tokens} [unusedN] and the characters; use at "
        "least a few thousand (BERT uses 30522; Chinese BERT 21128)",
    )
    _require(v.vocab_sample_lines >= 100, "vocab_sample_lines", v.vocab_sample_lines, "use at least 100")


def _check_storage(s) -> None:
    from .storage.errors import StorageError
    from .storage.gcs import check_location

    for key in ("data_dir", "output_dir", "mirror_dir"):
        try:
            check_location(getattr(s, key))
        except StorageError as exc:
            raise ConfigError(f"Setting {key}: {exc}") from None
    _check_mirror_outside_run(s)
    _require(s.keep_checkpoint_max >= 1, "keep_checkpoint_max", s.keep_checkpoint_max, "keep at least 1")
    _require(s.mirror_keep >= 1, "mirror_keep", s.mirror_keep, "keep at least 1")
    _require(s.mirror_max_lag >= 1, "mirror_max_lag", s.mirror_max_lag, "use at least 1")
    _require(s.transfer_workers >= 1, "transfer_workers", s.transfer_workers, "use at least 1")
    _require(s.transfer_retries >= 0, "transfer_retries", s.transfer_retries, "use 0 or more")
    _require(s.resumable_chunk_mb >= 1, "resumable_chunk_mb", s.resumable_chunk_mb, "use at least 1")
    _require(s.parallel_threshold_mb >= 1, "parallel_threshold_mb", s.parallel_threshold_mb, "use at least 1")


def _check_mirror_outside_run(s) -> None:
    """A mirror inside the run folder copies its own copies (under checkpoints/ without end) and survives nothing."""
    if not s.mirror_dir or not s.output_dir or "://" in s.mirror_dir or "://" in s.output_dir:
        return
    mirror, run = os.path.realpath(s.mirror_dir), os.path.realpath(s.output_dir)
    _require(mirror != run and not mirror.startswith(run + os.sep), "mirror_dir", s.mirror_dir,
             f"it is inside output_dir={s.output_dir!r}, the run folder it copies, so the copies would be copied "
             "again into themselves and be lost with it; mirror to a Drive folder or gs:// URL outside the run folder")


def _check_train(t) -> None:
    _require(t.train_batch_size >= 1, "train_batch_size", t.train_batch_size, "use at least 1")
    _require(t.learning_rate > 0, "learning_rate", t.learning_rate, "use a positive value, e.g. 1e-4")
    _require(t.num_train_steps >= 1, "num_train_steps", t.num_train_steps, "use at least 1")
    _require(
        -1 <= t.num_warmup_steps <= t.num_train_steps,
        "num_warmup_steps",
        t.num_warmup_steps,
        f"use -1 (10% of the run) or a value between 0 and num_train_steps={t.num_train_steps}",
    )
    _require(t.num_cooldown_steps >= 0, "num_cooldown_steps", t.num_cooldown_steps,
             "use 0 (20% of num_train_steps) or a positive count")
    _require(t.rewarm_steps >= 0, "rewarm_steps", t.rewarm_steps,
             "use 0 (no new warmup) or a positive count of steps, e.g. 100")
    for key in ("train_seed", "shuffle_buffer_size", "task_index"):
        _require(getattr(t, key) >= 0, key, getattr(t, key), "use 0 or more")
    _check_processes(t)
    _require(t.save_checkpoints_steps >= 0, "save_checkpoints_steps", t.save_checkpoints_steps,
             "use 0 (by time alone) or more")
    _require(t.save_checkpoints_minutes >= 0, "save_checkpoints_minutes", t.save_checkpoints_minutes,
             "use 0 (by steps alone) or more, e.g. 20")
    _require(t.save_checkpoints_steps or t.save_checkpoints_minutes, "save_checkpoints_steps",
             t.save_checkpoints_steps, "set it or save_checkpoints_minutes (or both): checkpoints are what resumes")
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
    _require(t.peak_tflops >= 0, "peak_tflops", t.peak_tflops, "use 0 (the published peak) or more, e.g. 197")
    _require(t.eval_every_steps >= -1, "eval_every_steps", t.eval_every_steps,
             "use 0 (end only), a number of steps, or -1 (about ten evaluations over the run)")
    _require(t.max_eval_steps >= 1, "max_eval_steps", t.max_eval_steps, "use at least 1")
    _check_optimizer(t)


def _check_optimizer(t) -> None:
    for key in ("adam_beta1", "adam_beta2"):
        _require(0 <= getattr(t, key) < 1, key, getattr(t, key), "use a value in [0, 1), e.g. 0.9 or 0.999")
    _require(t.adam_epsilon > 0, "adam_epsilon", t.adam_epsilon, "use a small positive value, e.g. 1e-6")
    _require(t.lr_decay_power > 0, "lr_decay_power", t.lr_decay_power, "use a positive power (1.0: linear)")
    _require(0 <= t.end_learning_rate <= t.learning_rate, "end_learning_rate", t.end_learning_rate,
             f"use a value between 0 and learning_rate={t.learning_rate}")
    _require(t.session_margin_minutes >= 0, "session_margin_minutes", t.session_margin_minutes, "use 0 or more")
    _require(t.session_hours <= 0 or t.session_hours * 60 > t.session_margin_minutes, "session_hours",
             t.session_hours, f"a session of {t.session_hours * 60:g} min ends within the last "
             f"session_margin_minutes={t.session_margin_minutes:g} kept for the final save, so every start would train "
             "one step and stop; give a longer session_hours (it counts from the start of train), a smaller "
             "session_margin_minutes, or session_hours -1 for no limit")
    _require(t.worker_wait_minutes > 0, "worker_wait_minutes", t.worker_wait_minutes, "use a positive number of "
             "minutes, e.g. 10")




def check_family_of_checkpoint(config) -> None:
    """Refuse a ``model_family`` given by name that contradicts what ``init_checkpoint`` (or ``bert_config_file``) is,
    by its config.json's model_type (given by neither, the checkpoint decides it: :meth:`.config.Config.set`)."""
    m = config.model
    for setting in ("init_checkpoint", "bert_config_file"):
        family = checkpoint_family(getattr(m, setting))
        if family is not None and family != m.model_family:
            raise ConfigError(
                f"Setting model_family={m.model_family} contradicts {setting} {getattr(m, setting)}, whose config.json "
                f"describes a {family} (model_type {family}): leave --model_family out (the checkpoint decides it), "
                f"or give a {m.model_family} {setting}.")


def checkpoint_family(path: str) -> str | None:
    """The model family a local model folder's (or config file's) config.json names; None where it names none."""
    if not path or "://" in path:
        return None
    config = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        model_type = json.loads(config.read_text()).get("model_type") if config.suffix == ".json" else None
    except (OSError, ValueError, AttributeError):
        return None
    return next((f.name for f in FAMILIES.values() if f.model_type == model_type), None)


def masked_budget(max_seq_length: int, masked_lm_prob: float) -> int:
    """The most tokens masking picks in a full sequence ([CLS] and two [SEP]s excluded)."""
    return max(1, int(round((max_seq_length - 3) * masked_lm_prob)))


def max_predictions(max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float) -> int:
    """``max_predictions_per_seq``, with 0 resolved to what masking fills (20 for 128 at 0.15, as BERT)."""
    return max_predictions_per_seq or masked_budget(max_seq_length + 1, masked_lm_prob) + 1


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


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "t", "y"):
        return True
    if text in ("0", "false", "no", "off", "f", "n"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def coerce(key: str, value: Any, kind: Any, choices, source: str) -> Any:
    """``value`` (from a flag, a file or a keyword) as setting ``key`` of type ``kind``, or a ConfigError."""
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
            if not math.isfinite(result):
                raise ValueError("not a finite number")
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
    if choices and result not in choices:
        close = difflib.get_close_matches(str(result), choices, n=1, cutoff=0.4)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Setting '{key}' in {source} is {result!r}; choose one of {', '.join(choices)}.{hint}")
    return result


def _check_processes(t) -> None:
    """JAX's several processes: all three settings together, or none (one process, or what JAX finds itself)."""
    _require(t.num_processes >= 0, "num_processes", t.num_processes, "use 0 (one, or what JAX finds) or more")
    _require(t.process_index == 0 or t.num_processes > 1, "process_index", t.process_index,
             "give --coordinator_address HOST:PORT and --num_processes N (2 or more) with --process_index I, "
             "together on every process (or none of them: one process, or a TPU VM pod)")
    _require(0 <= t.process_index < max(t.num_processes, 1), "process_index", t.process_index,
             f"use 0 to {max(t.num_processes, 1) - 1}: this process's place among num_processes={t.num_processes}")
    address = t.coordinator_address
    host, _, port = address.rpartition(":")
    _require(not address or "/" not in address, "coordinator_address", address,
             "give process 0's HOST:PORT alone, no scheme or path, e.g. 10.0.0.2:8476 (the same on every process)")
    _require(not address or (host and port.isdigit() and 0 < int(port) < 65536), "coordinator_address", address,
             "give process 0's HOST:PORT, e.g. 10.0.0.2:8476 (the same on every process)")
    _require(bool(address) == (t.num_processes > 1), "coordinator_address" if address else "num_processes",
             address or t.num_processes, "give --coordinator_address HOST:PORT, --num_processes N (2 or more) and "
             "--process_index I together on every process (or none of them: one process, or a TPU VM pod)")


def _require(ok: bool, key: str, value: Any, fix: str) -> None:
    if not ok:
        raise ConfigError(f"Setting {key}={value!r} is invalid: {fix}.")
