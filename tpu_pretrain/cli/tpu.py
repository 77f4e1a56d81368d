"""Subcommands of the TPU stack: tpu-check (the probe) and tpu-env (the TPU environment)."""

from __future__ import annotations

import argparse

from ..config import Config
from .parser import EXIT_OK, command


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
    from ..tpu_env import prepare_tpu_environment

    environment = prepare_tpu_environment(args.venv, python=args.python, extras=args.extras, rebuild=args.rebuild)
    command_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    return environment.run(command_args) if command_args else EXIT_OK
