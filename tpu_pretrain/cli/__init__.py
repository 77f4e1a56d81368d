"""The ``tpu-pretrain`` command line: one subcommand per step, flags named as the configuration fields.

Flags are generated from :mod:`tpu_pretrain.config`, so a flag, a notebook parameter and a Python
keyword argument always share one name, and a subcommand offers exactly the settings tagged with its
step. Booleans accept ``--flag``, ``--flag=false`` (the old absl style of Google's scripts) and ``--noflag``.

- ``parser``: the registry, flags, parsing, ``main`` and the exit codes (docs/command-line.md lists them).
- ``pipeline`` (vocab to train), ``trained`` (evaluate, export, probe: on a trained model), ``tpu``: the subcommands,
  registered when this package is imported.
"""

# isort: off
from . import pipeline, trained, tpu  # noqa: F401  (each registers its subcommands, in the order --help lists them)
# isort: on
from .parser import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STOPPED_EARLY,
    build_parser,
    config_from_args,
    main,
)

__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_STOPPED_EARLY",
           "build_parser", "config_from_args", "main"]
