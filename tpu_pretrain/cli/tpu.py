"""Subcommands of the TPU stack: tpu-check (the probe) and tpu-env (the TPU environment)."""

from __future__ import annotations

import argparse

from ..config import Config
from .parser import EXIT_OK, command


# -- TPU ---------------------------------------------------------------------------------------------------
def _tpu_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", action="store_true", help="Without a TPU, run the probe's training steps and "
                        "checkpoint on two logical CPU devices instead (checks everything but the TPU itself).")
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds before the probe is stopped "
                        "(default: 900; compiling for a TPU takes a minute or two).")


@command("tpu-check", "Probe the TPU in a subprocess: initialise it, report type/chips/cores, run two training "
         "steps of a tiny BERT, save and restore a checkpoint, release it; one verdict line, the diagnosis on "
         "failure.", (), arguments=_tpu_check_arguments)
def _tpu_check(config: Config, args: argparse.Namespace) -> int:
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
