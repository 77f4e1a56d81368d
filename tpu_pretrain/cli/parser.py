"""The command line's machinery: subcommand registry, flags from the configuration, parsing, exit codes.

Flags are generated from :mod:`tpu_pretrain.config`, so a flag, a notebook parameter and a Python
keyword argument always share one name, and a subcommand offers exactly the settings tagged with its
step. Booleans accept ``--flag``, ``--flag=false`` (the old absl
style of Google's scripts) and ``--noflag``.

Exit codes (docs/command-line.md lists them too): 0 done; 1 the command ran but something failed (a transfer,
a storage check, a create-data worker that died); 2 bad input or a refusal (the message says why and what to
do); 75 training stopped early (SIGTERM, Ctrl-C, the session's deadline) and the same command continues it; 130
interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence

from ..config import Config, all_fields, field_type
from ..config_checks import parse_bool
from ..errors import CommandFailed, ProcessLost, UserInputError

# Exit codes: see the module docstring (and README.md).
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STOPPED_EARLY, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
EXIT_CODES = (f"exit codes: {EXIT_OK} done; {EXIT_FAILED} something failed (a transfer, a storage check, a "
              "worker process); "
              f"{EXIT_BAD_INPUT} bad input or refused (the message says why); {EXIT_STOPPED_EARLY} training "
              f"stopped early (signal or session deadline): run the same command to continue; "
              f"{EXIT_INTERRUPTED} interrupted.")
_COMMANDS: dict[str, tuple[str, Sequence[str], Callable[[Config, argparse.Namespace], int]]] = {}
# Extra (e.g. positional) arguments of a subcommand, added by a callback on its parser.
_ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def command(name: str, help_text: str, flags: Sequence[str],
            arguments: Callable[[argparse.ArgumentParser], None] | None = None):
    """Register a subcommand whose function takes the validated Config and the parsed arguments.

    ``arguments``, if given, adds arguments that are not configuration settings (such as SRC DEST).
    """

    def register(func):
        _COMMANDS[name] = (help_text, flags, func)
        if arguments is not None:
            _ARGUMENTS[name] = arguments
        return func

    return register


def add_config_arguments(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    fields = all_fields()
    for name in names:
        f = fields[name]
        kind = field_type(name)
        # argparse %-formats help texts: a literal % (doc_separator's example) must be doubled.
        help_text = f"{f.metadata.get('help', '')} (default: {_default_text(f)})".replace("%", "%%")
        if kind is bool:
            parser.add_argument(f"--{name}", nargs="?", const=True, default=None, type=parse_bool,
                                metavar="BOOL", help=help_text)
            parser.add_argument(f"--no{name}", dest=name, action="store_const", const=False,
                                help=argparse.SUPPRESS)
        elif typing.get_origin(kind) is list:
            parser.add_argument(f"--{name}", nargs="+", action="extend", default=None, help=help_text)
        else:
            parser.add_argument(f"--{name}", type=kind, default=None, choices=f.metadata.get("choices"),
                                help=help_text)


def config_from_args(args: argparse.Namespace, names: Sequence[str]) -> Config:
    """The flags given over a ``--config`` file; a run continued (or planned) in its folder reads its own record
    first (:func:`..core.run_folder.continued_config`)."""
    overrides = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    base = getattr(args, "config", None)
    if getattr(args, "command", None) in ("train", "plan"):
        from ..core.run_folder import continued_config

        return continued_config(overrides, base)
    return Config.load(base, **overrides)


class _Parser(argparse.ArgumentParser):
    """An error comes first, with a one-line usage: a subcommand's full usage (train: about 60 lines of flags)
    would push the message, and its did-you-mean, off the screen."""

    def error(self, message: str) -> typing.NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # a mistyped command (or choice): the one meant, if one is close
            close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1, cutoff=0.6)
            message += f" (did you mean {close[0]}?)" if close else ""
        usage = (self.format_usage().strip() if self._subparsers is not None else  # the top level's is short
                 f"usage: {self.prog} [flags]; `{self.prog} --help` lists them.")
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n{usage}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tpu-pretrain",
        description="Pretrain BERT-family masked language models on TPU, GPU or CPU.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="More log output.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, flags, _) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES)
        p.set_defaults(subparser=p)  # for the message about an unknown flag
        p.add_argument("--config", help="JSON or YAML file of settings; flags override it.")
        add_config_arguments(p, flags)
        if name in _ARGUMENTS:
            _ARGUMENTS[name](p)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse, reading ``--flag -1e-4`` as a value, and answering an unknown flag with the flag meant."""
    args, unknown = parser.parse_known_args(_negative_values_attached(argv))
    if unknown:
        hint = _flag_hint(args.subparser, args.command, unknown)
        args.subparser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$", re.IGNORECASE)


def _negative_values_attached(argv: Sequence[str]) -> list[str]:
    """``--learning_rate -1e-4`` as ``--learning_rate=-1e-4``: argparse takes ``-1e-4`` for an option."""
    out: list[str] = []
    for token in argv:
        if out and _NUMBER.match(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _flag_hint(parser: argparse.ArgumentParser, command: str, unknown: Sequence[str]) -> str:
    """A hint for an unknown flag: the flag meant, or the steps that take a setting this step does not."""
    fields = all_fields()
    for token in unknown:
        if not token.startswith("--"):
            continue
        name = token[2:].split("=", 1)[0]
        if name in fields:
            steps = fields[name].metadata["steps"]
            where = f"a setting of {', '.join(steps)}" if steps else "not a command-line setting"
            return f" ({name} is {where}, not of {command})"
        offered = [o for o in parser._option_string_actions if o.startswith("--")]
        close = difflib.get_close_matches(f"--{name}", offered, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def configure_logging(verbose: bool) -> None:
    """Our progress at INFO; other libraries (TensorFlow's save timings, HTTP retries) only when they warn."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("tpu_pretrain").setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:  # the storage layer reports each failure once, saying what was tried
        for name in ("urllib3", "google", "google_auth_httplib2"):
            logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_arguments(parser, sys.argv[1:] if argv is None else argv)
    configure_logging(args.verbose)
    help_text, flags, func = _COMMANDS[args.command]
    try:
        config = config_from_args(args, flags)
        code = int(func(config, args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head -1`) is met here, not in Python's exit
        return code
    except BrokenPipeError:
        _output_dropped()
        return EXIT_FAILED
    except UserInputError as exc:
        print(f"tpu-pretrain {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CommandFailed as exc:
        print(f"tpu-pretrain {args.command}: error: {exc}", file=sys.stderr)
        if isinstance(exc, ProcessLost):  # no interpreter exit: JAX's would wait for the lost process, then abort
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_FAILED)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"tpu-pretrain {args.command}: interrupted. What was complete is kept (files are written whole or "
              "not at all); run the same command again to continue.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _output_dropped() -> None:
    """The reader of our output closed it (``status RUN | head -1``): say nothing more, and let the exit's flush
    write to nowhere instead of printing a BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _default_text(f) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    return repr(f.default_factory())
