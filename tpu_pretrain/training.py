"""``train()``: pick the backend, check what it offers, build its trainer, and hand it to the run core's loop.

The one module that knows both backends: the core (:mod:`.core.loop`) drives any trainer that follows
:class:`.core.protocol.Trainer`, and each backend imports only the core. A run continues on the backend
that started it; ``backend=auto`` otherwise asks :func:`.backend.choose_backend`. Settings a backend does not
offer are refused here, before any data is read.
"""

from __future__ import annotations

import copy
import json
import logging

from .backend import AUTO, check_offered, choose_backend
from .config import Config
from .core.loop import TrainResult, run_training
from .core.protocol import Trainer
from .core.run_folder import SETTINGS_BEFORE_THEY_EXISTED, RunFolder
from .errors import UserInputError
from .storage.local import check_writable_folder

log = logging.getLogger(__name__)


def train(config: Config | None = None, *, progress: bool | None = None, set_aside_damaged_checkpoints: bool = False,
          **kwargs) -> TrainResult:
    """Pretrain (or continue pretraining) BERT as configured: ``train(data_dir=..., output_dir=..., ...)``.

    The caller's ``config`` is not changed: keyword settings and the data's own settings go into a copy.
    ``set_aside_damaged_checkpoints``: when every checkpoint of the run is damaged, move them to
    ``checkpoints/damaged/`` and start from step 0 (otherwise that is refused).
    """
    config = copy.deepcopy(config) if config is not None else Config()
    config.update(kwargs)
    config.validate()
    output_dir = config.storage.output_dir
    if not output_dir:
        raise UserInputError("Set output_dir: the run folder (config, logs and weights go there).")
    check_writable_folder(output_dir)
    return run_training(make_trainer(config), output_dir, progress=progress,
                        set_aside_damaged_checkpoints=set_aside_damaged_checkpoints)


def recorded_backend(output_dir: str) -> str | None:
    """The backend a run folder's run was started with (runs from before the setting: TensorFlow), or None."""
    run = RunFolder(output_dir)
    if not run.config_file.is_file():
        return None
    backend = json.loads(run.config_file.read_text()).get("train", {}).get("backend")
    backend = backend or SETTINGS_BEFORE_THEY_EXISTED["backend"]
    return backend if backend != AUTO else None


def resolve_backend(requested: str, output_dir: str = "") -> tuple[str, str]:
    """``(backend, why)``: with ``auto``, the backend a run in ``output_dir`` started with, else the machine's."""
    recorded = recorded_backend(output_dir) if requested == AUTO and output_dir else None
    if recorded:
        choose_backend(recorded)  # installed here?
        return recorded, "the backend this run was started with"
    return choose_backend(requested)


def make_trainer(config: Config) -> Trainer:
    """The trainer of the configured backend, after checking that it offers every setting asked for."""
    backend, reason = resolve_backend(config.train.backend, config.storage.output_dir)
    check_offered(backend, config.train)
    log.info("Training backend: %s (%s).", backend, reason)
    config.train.backend = backend  # the run records the backend it was trained with
    if backend == "jax":
        from .jax_backend.trainer import JaxTrainer

        return JaxTrainer(config)
    from .tf_backend.trainer import Trainer as TensorFlowTrainer

    return TensorFlowTrainer(config)
