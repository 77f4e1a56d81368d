"""``train()``: pick the backend, check what it offers, build its trainer, and hand it to the run core's loop.

The one module that knows both backends: the core (:mod:`.core.loop`) drives any trainer that follows
:class:`.core.protocol.Trainer`, and each backend imports only the core. A run continues on the backend
that started it; ``backend=auto`` otherwise asks :func:`.backend.run_backend`. Settings a backend does not
offer are refused here, before any data is read.
"""

from __future__ import annotations

import logging

from .backend import AUTO, TENSORFLOW, check_offered, run_backend
from .config import Config, recipe_settings
from .core.device_decision import is_out_of_memory, out_of_memory_advice
from .core.loop import TrainResult, run_training
from .core.protocol import Trainer
from .core.run_folder import RunFolder, continued_config
from .errors import UserInputError
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
    config = continued_config({**(config.given() if config is not None else {}), **kwargs})
    output_dir = config.storage.output_dir
    if not output_dir:
        raise UserInputError("Set output_dir: the run folder (config, logs and weights go there).")
    RunFolder(output_dir).check_not_past_the_end(config.train.num_train_steps)
    check_writable_folder(output_dir)
    trainer = make_trainer(config)
    try:
        return run_training(trainer, output_dir, progress=progress,
                            set_aside_damaged_checkpoints=set_aside_damaged_checkpoints)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise UserInputError(out_of_memory_advice(trainer.config, exc)) from exc


def make_trainer(config: Config) -> Trainer:
    """The trainer of the configured backend, after checking that it offers every setting asked for and, on
    several machines, that the other workers are up (:mod:`.tf_backend.setup.workers`). A backend asked for by name
    is checked before whether it is installed: it could not train these settings either way."""
    output_dir = config.storage.output_dir
    recorded = RunFolder(output_dir).recorded_backend() if output_dir else None
    set_by = recipe_settings(config)
    if config.train.backend != AUTO:
        check_offered(config.train.backend, config, set_by=set_by)
    backend, reason = run_backend(config.train.backend, recorded, config)
    check_offered(backend, config, set_by=set_by)
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
