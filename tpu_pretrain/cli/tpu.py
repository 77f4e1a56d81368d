"""Subcommands of the TPU stack: tpu-check (the probe) and tpu-env (the TPU environment)."""

from __future__ import annotations

import argparse
import os

from ..config import TRAIN, Config, step_settings
from .parser import EXIT_FAILED, EXIT_OK, command

# What shapes a step beyond train's settings: what create-data would write (a data_dir, when given, decides them).
PLAN_SHAPES = tuple(name for name in ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "no_nsp",
                                      "vocab_size") if name not in step_settings(TRAIN))


# -- TPU ---------------------------------------------------------------------------------------------------
def _tpu_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", choices=("auto", "tensorflow", "jax"), help="The backend to "
                        "check (auto: the one training would pick here: JAX on a TPU VM without tensorflow-tpu).")
    parser.add_argument("--cpu", action="store_true", help="Without a TPU, run the probe's training steps and "
                        "checkpoint on two logical CPU devices instead (checks everything but the TPU itself).")
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds before the probe is stopped "
                        "(default: 900; compiling for a TPU takes a minute or two).")
    jax = parser.add_argument_group("with the JAX backend: the run's own shape, measured")
    jax.add_argument("--model_size", default="L12-H768", help="Model size to measure (default: BERT-base).")
    jax.add_argument("--train_batch_size", type=int, default=128, help="Sequences per step (default: 128).")
    jax.add_argument("--steps", type=int, default=10, help="Steps timed after the first (default: 10).")
    jax.add_argument("--save", default="", help="Also write the figures as JSON here (a local path or gs:// URL).")


@command("tpu-check", "Probe the accelerator in a subprocess. TensorFlow: initialise the TPU, report type/chips/"
         "cores, run two training steps of a tiny BERT, save and restore a checkpoint; JAX: the run's model size "
         "and batch on JAX's devices, sequences/s and MFU measured, a checkpoint saved and restored. One verdict "
         "line, the diagnosis on failure.", (), arguments=_tpu_check_arguments)
def _tpu_check(config: Config, args: argparse.Namespace) -> int:
    from ..backend import JAX, choose_backend

    backend, _ = choose_backend(args.backend)
    if backend == JAX:
        from ..jax_backend.accelerator_check import check_accelerator

        return check_accelerator(args.model_size, args.train_batch_size, args.steps, args.save, args.timeout)
    from ..tf_backend.tpu_probe import check_tpu

    return check_tpu(cpu=args.cpu, timeout=args.timeout)


def _tpu_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--venv", help="Where the environment lives (default: ~/.cache/tpu_pretrain/tpu-venv).")
    parser.add_argument("--python", help="Interpreter to build it from (default: an existing Python 3.12, 3.11 or "
                        "3.10, else a Python 3.12 from uv).")
    parser.add_argument("--extras", nargs="*", default=[], help="Extras of tpu_pretrain to install there as well "
                        "(test: what the test suite needs).")
    parser.add_argument("--rebuild", action="store_true", help="Make it again even if it is complete.")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="A tpu-pretrain command to run in it, after -- (for example: -- train --data_dir ...).")


@command("tpu-env", "Build (or reuse) the TPU environment: Python 3.12 with the pinned tensorflow-tpu, libtpu and "
         "tf-keras, checked file by file; optionally run a tpu-pretrain command in it.", (),
         arguments=_tpu_env_arguments)
def _tpu_env(config: Config, args: argparse.Namespace) -> int:
    from ..tf_backend.setup.tpu_env import prepare_tpu_environment

    environment = prepare_tpu_environment(args.venv, python=args.python, extras=args.extras, rebuild=args.rebuild)
    command_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    return environment.run(command_args) if command_args else EXIT_OK


def default_target() -> str:
    """What ``plan`` compiles for when not told: the chips here (``local``), the TPU a runtime declares, else v5e-1."""
    from ..core.tpu_targets import target_of_accelerator_type
    from ..runtime import tpu_chips_present

    if tpu_chips_present():
        return "local"
    return target_of_accelerator_type(os.environ.get("TPU_ACCELERATOR_TYPE", "")) or "v5e-1"


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tpu", default="", help="The TPU to compile for: v5e-1 (Colab's free TPU), v5e-8 "
                        "(Kaggle's), v6e-1, v5e-4, v6e-8, v5p-8, v3-8, v2-8, v5e-16, v5e-32; local: the chips here "
                        "(default: the chips here, else the TPU the runtime names, else v5e-1); cpu: this machine's "
                        "CPU devices and XLA's CPU compiler (no TPU compiler needed: a check of the settings).")
    parser.add_argument("--hbm_gib", type=float, default=0.0, help="Memory per device to plan for, GiB (default: "
                        "the chip's published HBM).")
    parser.add_argument("--no_search", action="store_true", help="Only the step asked for: when it does not fit, "
                        "do not compile again to find the largest batch that does.")
    parser.add_argument("--save", default="", help="Also write the plan as JSON here (a local path or gs:// URL).")


@command("plan", "Compile the training step that `train` would run (the same settings; the data folder optional) "
         "for a TPU, without one: memory per chip against its capacity, XLA's FLOPs beside the MFU formula, "
         "sequences/s and hours at a stated MFU range; when it does not fit, the largest batch (or the gradient "
         "accumulation) that does, found by compiling. Needs the TPU compiler: pip install 'jax[tpu]'.",
         step_settings(TRAIN) + PLAN_SHAPES, arguments=_plan_arguments)
def _plan(config: Config, args: argparse.Namespace) -> int:
    import json

    tpu = args.tpu or default_target()
    if tpu != "local":  # the model is built here on the CPU and the TPU is described: no chip for libtpu to guard
        for name, value in (("JAX_PLATFORMS", "cpu"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
                            ("TPU_STDERR_LOG_LEVEL", "3"), ("TPU_MIN_LOG_LEVEL", "3")):
            os.environ.setdefault(name, value)
    from ..jax_backend.plan import check_request, plan
    from ..jax_backend.plan_report import report

    check_request(tpu, args.hbm_gib)
    if args.save:
        _check_save(args.save)
    print(f"Compiling for {tpu}: a few minutes on a laptop's CPU (longer for a large model)...", flush=True)
    result = plan(config, tpu, search=not args.no_search, hbm_gib=args.hbm_gib)
    print(report(result), flush=True)
    if args.save:
        _save_plan(args.save, json.dumps(result.to_json(), indent=2) + "\n")
        print(f"Saved to {args.save}.", flush=True)
    return EXIT_OK if result.fits else EXIT_FAILED


def _check_save(path: str) -> None:
    """``--save``'s place checked before the minutes of compiling: a folder, a file's parent that is a file, a
    read-only place."""
    if "://" in path:
        return
    from pathlib import Path

    from ..errors import UserInputError
    from ..storage.local import check_writable_folder

    if Path(path).is_dir():
        raise UserInputError(f"--save {path} is a folder: give the file to write the plan to "
                             f"({Path(path) / 'plan.json'}).")
    above = Path(path).parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise UserInputError(f"--save {path}: {above} is a file, so nothing can be written under it; choose another "
                             "--save.")
    check_writable_folder(Path(path).parent, "--save")


def _save_plan(path: str, text: str) -> None:
    """The plan written, or one line on why not (a full disk is found only by writing): the report stands above."""
    from .. import storage
    from ..errors import UserInputError

    try:
        storage.write_text(path, text)
    except OSError as exc:
        raise UserInputError(f"--save {path}: the plan was not written ({exc.strerror or exc}); free space there or "
                             "choose another --save. The plan is printed above.") from None
