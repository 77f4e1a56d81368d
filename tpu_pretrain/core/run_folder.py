"""The contract of a run folder: every file a training run keeps, named, written and read here alone.

A run folder (train's ``output_dir``) holds:

- ``config.json``: the resolved configuration (with the data's shapes);
- ``train.lock``: held by the one training process at work here (:mod:`.run_lock`);
- ``run.json``: the run's identity (model, data, the settings that pin it), recorded at the first start
  and compared at every later one;
- ``bert_config.json`` (``model_family`` bert) or ``modernbert_config.json`` (modernbert: transformers' config.json
  of ``ModernBertForMaskedLM``): the model's shape; ``vocab.txt`` (or ``tokenizer.json``): its vocab;
- ``checkpoints/``: the checkpoints; ``logs/``: TensorBoard scalars and ``example_ids.jsonl``;
- ``train_summary.json``, ``evaluation.json``, ``probe.json``, ``plots/``, ``export/hf`` and ``export/tf``;
- ``mirror.json``: where the durable copy stands, as the training process last saw it (for ``status``).

Starting ``train`` again in the same folder resumes, which is only correct when the model, the vocab,
the data and the way batches are drawn are unchanged: :meth:`RunFolder.check_can_resume` refuses
otherwise, naming the differences. Safe changes (total steps, the end learning rate, logging and
evaluation cadence, where checkpoints are mirrored, the wsd cool-down) are allowed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import storage
from ..backend import AUTO
from ..config import RUN, Config, all_fields, pinned_settings
from ..data.data_folder import data_vocab_file
from ..data.tokenizer_json import TOKENIZER_JSON as TOKENIZER  # a run's vocab when its data used a tokenizer.json
from ..data.vocab import Vocab
from ..errors import UserInputError
from ..models.bert_config import BertConfig
from ..models.families import BERT, FAMILIES, ModelFamily, family_named, family_of
from ..models.modernbert_config import ModernBertConfig
from ..storage.local import atomic_open, write_text_atomic
from .checkpoints import list_checkpoints

CONFIG = "config.json"
LOCK = "train.lock"
IDENTITY = "run.json"
VOCAB = "vocab.txt"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
EXAMPLE_IDS = "example_ids.jsonl"
SUMMARY = "train_summary.json"
EVALUATION = "evaluation.json"
PROBE = "probe.json"
MIRROR_STATE = "mirror.json"
PLOTS = "plots"
EXPORT = "export"
# What a fresh runtime needs beside the checkpoints to resume, evaluate and export (the mirror carries it).
MIRRORED = (CONFIG, IDENTITY, *(f.shape_file for f in FAMILIES.values()), VOCAB, TOKENIZER, LOGS, SUMMARY, EVALUATION)
# Model fields a run may change between sessions (dropout does not change the weights' shapes).
UNPINNED_MODEL_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "embedding_dropout",
                         "attention_dropout", "mlp_dropout")


def config_file_at(place: str | os.PathLike) -> str:
    """A run's ``config.json`` at any place, a durable copy's too (a local or Drive folder, ``gs://...``): the file
    whose presence says a run is there, and whose settings name its backend."""
    return storage.join(place, CONFIG)


class RunFolder:
    """The files of one run folder (local, or a mounted Drive folder)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK

    @property
    def identity_file(self) -> Path:
        return self.path / IDENTITY

    def shape_file(self, family: ModelFamily) -> Path:
        return self.path / family.shape_file

    @property
    def model_config_file(self) -> Path:
        """The model's shape: the file of the family whose file is here (``bert_config.json`` where none is)."""
        return self.shape_file(self._family_on_disk())

    def _family_on_disk(self) -> ModelFamily:
        return next((f for f in FAMILIES.values() if f is not BERT and self.shape_file(f).is_file()), BERT)

    @property
    def vocab_file(self) -> Path:
        """The run's copy of its vocab: ``vocab.txt``, or ``tokenizer.json`` where that is what it has."""
        tokenizer = self.path / TOKENIZER
        return tokenizer if tokenizer.is_file() and not (self.path / VOCAB).is_file() else self.path / VOCAB

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def example_ids(self) -> Path:
        return self.logs / EXAMPLE_IDS

    @property
    def summary_file(self) -> Path:
        return self.path / SUMMARY

    @property
    def evaluation_file(self) -> Path:
        return self.path / EVALUATION

    @property
    def probe_file(self) -> Path:
        return self.path / PROBE

    @property
    def mirror_state_file(self) -> Path:
        return self.path / MIRROR_STATE

    @property
    def curves_file(self) -> Path:
        return self.path / PLOTS / "curves.png"

    def export_dir(self, format: str) -> Path:
        return self.path / EXPORT / format

    # -- what makes a folder a run ---------------------------------------------------------------
    def is_run(self) -> bool:
        """A training run folder: our config.json (sections) next to bert_config.json (modernbert_config.json)."""
        if not self.config_file.is_file() or not self.model_config_file.is_file():
            return False
        try:
            return "storage" in json.loads(self.config_file.read_text())
        except json.JSONDecodeError:
            return False

    def holds_a_run(self) -> bool:
        """Any sign of a training run here (its config, checkpoints or identity), whole or not."""
        return self.is_run() or self.checkpoints.is_dir() or self.identity_file.is_file()

    def check_not_damaged(self) -> None:
        """Refuse a folder that holds a run's checkpoints but lost its config.json or bert_config.json, naming the
        missing file (evaluate and export would otherwise take it for some other kind of folder)."""
        if self.is_run() or not self.holds_a_run():
            return
        shape = family_named(self._recorded_family()).shape_file
        missing = [name for name in (CONFIG, shape) if not (self.path / name).is_file()]
        what = " and ".join(missing) or f"a readable {CONFIG} (the one there is not a run's)"
        present = ", ".join(n for n in (f"{CHECKPOINTS}/", IDENTITY) if (self.path / n.rstrip("/")).exists())
        raise UserInputError(
            f"{self.path} holds a training run ({present}) but not its {what}. Copy it back from "
            f"the run's mirror (mirror_dir keeps {CONFIG} and {shape} beside the checkpoints) or a backup; or "
            f"run `tpu-pretrain train --output_dir {self.path}` with the settings the run was started with ({IDENTITY} "
            "records those it pins): it writes them again before it continues.")

    def _recorded_family(self) -> str:
        """The model family the run's identity (else its config.json) records: what its shape file is named for."""
        for path, section in ((self.identity_file, "settings"), (self.config_file, "model")):
            try:
                return json.loads(path.read_text())[section]["model_family"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return self._family_on_disk().name

    def recorded_settings(self) -> dict | None:
        """The run's config.json as written (a setting newer than the run is absent), or None where there is none
        readable: what says which settings a run started before they existed."""
        try:
            return json.loads(self.config_file.read_text())
        except (OSError, ValueError):
            return None

    def recorded_backend(self) -> str | None:
        """The backend the run here was started with (runs from before the setting: TensorFlow), or None where
        there is no run or its record leaves the choice to ``auto``."""
        settings = self.recorded_settings()
        return backend_in_settings(settings) if settings is not None else None

    def check_not_past_the_end(self, num_train_steps: int) -> None:
        """Refuse a num_train_steps below the step the run has reached (before its config.json records it)."""
        newest = next(iter(list_checkpoints(self.checkpoints)), None)
        if newest is not None and newest.step > num_train_steps:
            raise UserInputError(
                f"The run in {self.path} is at step {newest.step} ({newest.name}), past num_train_steps="
                f"{num_train_steps}: there is nothing to train. To train on, give a num_train_steps above "
                f"{newest.step} (with --rewarm_steps if its learning rate has decayed); to use the weights as they "
                "are, `tpu-pretrain evaluate` or `export` the run. Nothing was changed.")

    def read_config(self) -> Config:
        if not self.config_file.is_file():
            raise UserInputError(f"{self.path} is not a run folder (no {CONFIG}): start it with `tpu-pretrain train`.")
        return Config.from_file(self.config_file)

    def read_model_config(self) -> BertConfig | ModernBertConfig:
        """The model's shape, of the run's family (its config class)."""
        family = self._family_on_disk()
        return family.config_class.from_json_file(self.shape_file(family))

    def write_run_files(self, config: Config, model_config: BertConfig | ModernBertConfig,
                        vocab: Vocab | None) -> None:
        """The resolved configuration, the model's shape and the vocab: what the weights need to be used."""
        self.path.mkdir(parents=True, exist_ok=True)
        config.save(self.config_file)
        model_config.to_json_file(self.shape_file(family_of(model_config)))
        copy = self.path / vocab.copy_name if vocab else None
        if vocab and vocab.source.resolve() != copy.resolve():
            with open(vocab.source, "rb") as src, atomic_open(copy) as dst:
                shutil.copyfileobj(src, dst)

    def write_summary(self, summary: dict) -> None:
        write_text_atomic(self.summary_file, json.dumps(summary, indent=2) + "\n")

    # -- identity: may a new start continue this run? -------------------------------------------
    def check_can_resume(self, identity: dict) -> None:
        """Refuse, naming every differing setting, when the run folder was made for something else."""
        if not self.identity_file.is_file():
            return
        differences = identity_differences(json.loads(self.identity_file.read_text()), identity)
        if differences:
            raise UserInputError(
                f"Cannot continue the run in {self.path}: its checkpoints were made with other settings "
                f"({'; '.join(differences)}). Restore those settings to continue, or use a new output_dir to "
                "start another run (an init_checkpoint can start it from this run's weights).")

    def check_same_family(self, family: str) -> None:
        """Refuse, before the model is resolved, to continue a run as another model family: its checkpoints hold
        another model's weights (whatever else would be said about the vocab or the data first)."""
        recorded = (self.read_identity() or {}).get("settings", {}).get("model_family")
        if recorded and recorded != family:
            raise UserInputError(
                f"The run in {self.path} is a {recorded} run (model_family {recorded}, {IDENTITY}): a run cannot "
                f"change family, its checkpoints hold a {recorded} model's weights. Continue it with --model_family "
                f"{recorded}, or start the {family} run in a new output_dir.")

    def record_identity(self, identity: dict) -> None:
        """Record a new run's identity, with an id of its own: what its durable copy is claimed by."""
        if not self.identity_file.is_file():
            self.adopt_identity({**identity, "created": time.time(), "run_id": uuid.uuid4().hex})

    def adopt_identity(self, record: dict) -> None:
        """Continue the run ``record`` names (its run.json as its durable copy holds it) in this folder."""
        write_text_atomic(self.identity_file, json.dumps(record, indent=2, sort_keys=True) + "\n")

    def read_identity(self) -> dict | None:
        """The run's recorded identity (run.json), or None for a folder no run has started in."""
        try:
            return json.loads(self.identity_file.read_text())
        except FileNotFoundError:
            return None


def continued_config(given: dict[str, Any], config_file: str | None = None) -> Config:
    """The settings of a run, read one way by the command line, the notebooks (through it) and ``train()``: a
    ``config_file`` when one is given; else, when ``output_dir`` holds a run, the run's recorded settings (its
    config.json), so it continues as it started; then the settings ``given`` by name over them. Which process this
    is (a ``launch`` setting) belongs to this launch alone, never to the record."""
    given = dict(given)
    saved = RunFolder(given.get("output_dir") or "").config_file
    if config_file is None and given.get("output_dir") and saved.is_file():
        config_file = str(saved)
        for name, f in all_fields().items():
            if f.metadata.get("launch"):
                given.setdefault(name, f.default)
        recorded = Config.from_file(saved).explicit
        for name in RECORDED_SINCE:  # a run from before the setting: what it trained with, not the recipe's value
            if name not in recorded:
                given.setdefault(name, SETTINGS_BEFORE_THEY_EXISTED[name])
    return Config.load(config_file, **given)


def run_identity(config: Config, model_config: BertConfig | ModernBertConfig, data_info) -> dict:
    """The facts a checkpoint of this run depends on (``config`` holds the data's shapes)."""
    model = {k: v for k, v in asdict(model_config).items() if k not in UNPINNED_MODEL_FIELDS}
    data = {"train_instances": data_info.train_instances,
            "train_files": [os.path.basename(f) for f in data_info.train_files]}
    if data_info.vocab_sha256:
        data["vocab_sha256"] = data_info.vocab_sha256
        data["train_sha256"] = data_info.train_sha256
    return {"model": model, "data": data, "settings": {k: config.get(k) for k in pinned_settings(RUN)}}


def same_run(a: dict, b: dict) -> bool:
    """Whether two run.json records are one run's (runs from before the run id: the same start time)."""
    return (a.get("run_id"), a.get("created")) == (b.get("run_id"), b.get("created"))


def describe_run(record: dict) -> str:
    """A run as a person recognises it: when it started, and its id."""
    created = record.get("created")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) if isinstance(created, (int, float)) else "?"
    return f"run {str(record.get('run_id') or '(no id)')[:8]} started {when}"


# Settings whose default changed after they were added: the value a run that did not record them trained with.
SETTINGS_BEFORE_THEY_EXISTED = {"backend": "tensorflow", "document_masks": "off", "hidden_act": "gelu"}
# Of those, the ones a continued run takes from here where its config.json lacks them (the others' ``auto`` decides)
RECORDED_SINCE = ("hidden_act",)


def backend_in_settings(settings: dict) -> str | None:
    """The backend a run's recorded settings (its config.json) name, or None where they leave it to ``auto``."""
    backend = settings.get("train", {}).get("backend") or SETTINGS_BEFORE_THEY_EXISTED["backend"]
    return backend if backend != AUTO else None


def identity_differences(previous: dict, identity: dict) -> list[str]:
    differences = []
    fields = all_fields()
    for key, value in identity["settings"].items():
        # A setting newer than the run: what runs used before it (its default, unless that changed since).
        before = previous["settings"].get(key, SETTINGS_BEFORE_THEY_EXISTED.get(key, fields[key].default))
        if before != value:
            differences.append(f"{key}: {before!r} in the run, {value!r} now")
    family = previous["settings"].get("model_family", BERT.name) != identity["settings"].get("model_family", BERT.name)
    for key, value in identity["model"].items():
        if not family and previous["model"].get(key) != value:  # another family: other fields altogether
            differences.append(f"model {key}: {previous['model'].get(key)!r} in the run, {value!r} now")
    old_data, new_data = previous["data"], identity["data"]
    if old_data.get("vocab_sha256") != new_data.get("vocab_sha256"):
        differences.append("vocab: the data was made with a different vocab")
    if (old_data.get("train_sha256") != new_data.get("train_sha256")
            or old_data.get("train_instances") != new_data.get("train_instances")):
        differences.append("data_dir: different training shards")
    return differences


def trained_vocab_file(run: RunFolder, config: Config) -> str:
    """The vocab a run trained with: the run's own copy (older runs: the configured file, else the data's), checked
    against the model's vocab_size, so that an export never pairs the model with another vocab."""
    candidates = [run.vocab_file]
    if config.data.vocab_file:
        try:
            candidates.append(Vocab.read(config.data.vocab_file).source)
        except UserInputError:  # gone or unreadable here: the run's or the data's copy then
            pass
    if config.storage.data_dir:
        candidates.append(Path(data_vocab_file(config.storage.data_dir) or Path(config.storage.data_dir) / VOCAB))
    for path in candidates:
        if path.is_file():
            _check_vocab_fits_model(run, path)
            return str(path)
    raise UserInputError(f"No vocab.txt or tokenizer.json for run {run.path}: looked at "
                         f"{', '.join(map(str, candidates))}.")


def _check_vocab_fits_model(run: RunFolder, vocab_file: Path) -> None:
    if not run.model_config_file.is_file():
        return
    vocab = Vocab.read(vocab_file)
    tokens, model = len(vocab), run.read_model_config().vocab_size
    if tokens > model or (tokens != model and not vocab.is_tokenizer_json):  # a tokenizer's model may pad
        raise UserInputError(
            f"{vocab_file} has {tokens} tokens but the model of run {run.path} has vocab_size {model}: it is not the "
            "vocab the model was trained with, and the pair would give wrong words. Put that vocab back (the data "
            "folder's vocab.txt, or the --vocab_file the run was trained with) as "
            f"{run.vocab_file}.")
