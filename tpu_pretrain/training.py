"""``train()``: pick the backend, check what it offers, build its trainer, and hand it to the run core's loop.

The one module that knows both backends: the core (:mod:`.core.loop`) drives any trainer that follows
:class:`.core.protocol.Trainer`, and each backend imports only the core. A run continues on the backend
that started it; ``backend=auto`` otherwise asks :func:`.backend.choose_backend`. Settings a backend does not
offer are refused here, before any data is read.
"""

from __future__ import annotations

import logging
import re

from .backend import AUTO, TENSORFLOW, check_offered, choose_backend, required_backend
from .config import MODERN_RECIPE, Config
from .core.checkpoints import list_checkpoints
from .core.loop import TrainResult, run_training
from .core.protocol import Trainer
from .core.run_folder import SETTINGS_BEFORE_THEY_EXISTED, RunFolder, continued_config, given_settings
from .errors import UserInputError
from .models.families import MODERNBERT, family_named
from .storage.local import check_writable_folder
from .tf_backend.setup.workers import find_workers, wait_for_workers

log = logging.getLogger(__name__)


def train(config: Config | None = None, *, progress: bool | None = None, set_aside_damaged_checkpoints: bool = False,
          **kwargs) -> TrainResult:
    """Pretrain (or continue pretraining) BERT as configured: ``train(data_dir=..., output_dir=..., ...)``.

    The caller's ``config`` is not changed: keyword settings and the data's own settings go into a copy. A run
    already in ``output_dir`` continues with its recorded settings, those given here over them, as the command line
    continues it (:func:`.core.run_folder.continued_config`). ``set_aside_damaged_checkpoints``: when every
    checkpoint of the run is damaged, move them to ``checkpoints/damaged/`` and start from step 0 (otherwise that is
    refused).
    """
    config = continued_config({**(given_settings(config) if config is not None else {}), **kwargs})
    output_dir = config.storage.output_dir
    if not output_dir:
        raise UserInputError("Set output_dir: the run folder (config, logs and weights go there).")
    check_writable_folder(output_dir)
    check_not_past_the_end(output_dir, config.train.num_train_steps)
    trainer = make_trainer(config)
    try:
        return run_training(trainer, output_dir, progress=progress,
                            set_aside_damaged_checkpoints=set_aside_damaged_checkpoints)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise UserInputError(out_of_memory_advice(trainer.config, exc)) from exc


def is_out_of_memory(exc: BaseException) -> bool:
    """The device (or, on a CPU, the machine) refused the step's memory: JAX's ``RESOURCE_EXHAUSTED: Out of memory``,
    TensorFlow's ``OOM when allocating`` (not its ResourceExhaustedError for a full disk)."""
    return bool(re.search(r"out of memory|OOM when allocating", str(exc), re.IGNORECASE))


def out_of_memory_advice(config: Config, exc: BaseException) -> str:
    """What to change when the step does not fit, naming the settings that decide its memory."""
    t, m = config.train, config.model
    model = f"{family_named(m.model_family).title} {m.model_size or 'of ' + (m.bert_config_file or m.init_checkpoint)}"
    first_line = str(exc).strip().splitlines()[0][:200]
    return (f"The training step does not fit in memory: {model} at train_batch_size {t.train_batch_size} in "
            f"{t.gradient_accumulation_steps} micro-batch(es) of max_seq_length {config.data.max_seq_length} "
            f"({first_line}). Lower --train_batch_size, or keep it and raise --gradient_accumulation_steps (the same "
            "batch in smaller micro-batches), or train a smaller --model_size; `tpu-pretrain plan` finds the largest "
            "batch that fits a TPU without one. The checkpoints already saved are kept.")


def check_not_past_the_end(output_dir: str, num_train_steps: int) -> None:
    """Refuse a num_train_steps below the step the run has reached (before its config.json records it)."""
    newest = next(iter(list_checkpoints(RunFolder(output_dir).checkpoints)), None)
    if newest is not None and newest.step > num_train_steps:
        raise UserInputError(
            f"The run in {output_dir} is at step {newest.step} ({newest.name}), past num_train_steps="
            f"{num_train_steps}: there is nothing to train. To train on, give a num_train_steps above {newest.step} "
            "(with --rewarm_steps if its learning rate has decayed); to use the weights as they are, "
            "`tpu-pretrain evaluate` or `export` the run. Nothing was changed.")


def recorded_backend(output_dir: str) -> str | None:
    """The backend a run folder's run was started with (runs from before the setting: TensorFlow), or None."""
    settings = RunFolder(output_dir).recorded_settings()
    return backend_in_settings(settings) if settings is not None else None


def backend_in_settings(settings: dict) -> str | None:
    """The backend a run's recorded settings (its config.json) name, or None where they leave it to ``auto``."""
    backend = settings.get("train", {}).get("backend") or SETTINGS_BEFORE_THEY_EXISTED["backend"]
    return backend if backend != AUTO else None


def resolve_backend(requested: str, output_dir: str = "", config: Config | None = None) -> tuple[str, str]:
    """``(backend, why)``: with ``auto`` (or that same backend, read back from the run's config.json on resume), the
    backend a run in ``output_dir`` started with; with ``auto`` and no run, the one backend
    that offers what ``config`` asks for (:func:`.backend.required_backend`), else the machine's."""
    recorded = recorded_backend(output_dir) if output_dir else None
    if recorded and requested in (AUTO, recorded):  # a resumed run's config.json names it: nobody asked anew
        choose_backend(recorded)  # installed here?
        return recorded, "the backend this run was started with"
    required = required_backend(config) if requested == AUTO and config is not None else None
    if required:
        choose_backend(required[0])  # installed here?
        return required
    return choose_backend(requested)


def make_trainer(config: Config) -> Trainer:
    """The trainer of the configured backend, after checking that it offers every setting asked for and, on
    several machines, that the other workers are up (:mod:`.tf_backend.setup.workers`). A backend asked for by name
    is checked before whether it is installed: it could not train these settings either way."""
    if config.train.backend != AUTO:
        check_offered(config.train.backend, config, set_by=recipe_settings(config))
    backend, reason = resolve_backend(config.train.backend, config.storage.output_dir, config)
    check_offered(backend, config, set_by=recipe_settings(config))
    workers = find_workers(config.train.worker_hosts, config.train.task_index)
    if workers is not None and backend != TENSORFLOW:
        raise UserInputError(f"{workers.source} describes {len(workers.addresses)} machines, but the {backend} backend "
                             "does not read TensorFlow's workers (it trains on several processes with JAX's runtime: "
                             "--coordinator_address, --num_processes, --process_index, or a TPU pod's own): unset "
                             "TF_CONFIG, or train with --backend tensorflow.")
    log.info("Training backend: %s (%s).", backend, reason)
    if backend == "jax":
        from .jax_backend.processes import join_processes
        from .jax_backend.trainer import JaxTrainer

        join_processes(config)  # several processes meet, join JAX's runtime and agree on the settings, or are refused
        return JaxTrainer(config)
    if workers is not None:
        wait_for_workers(workers, config.train.worker_wait_minutes * 60)
    from .tf_backend.trainer import Trainer as TensorFlowTrainer

    return TensorFlowTrainer(config)


def recipe_settings(config: Config) -> dict[str, str]:
    """The settings a recipe set (not given by name), with where they came from, for messages about them."""
    if config.data.recipe != "modern":
        return {}
    source = ("--recipe modern" if "recipe" in config.explicit else "--model_family modernbert"
              if family_named(config.model.model_family) is MODERNBERT else "the default recipe, modern")
    return {key: source for key in MODERN_RECIPE if key not in config.explicit}
