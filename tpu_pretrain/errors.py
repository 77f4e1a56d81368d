"""Errors a user can fix; the CLI prints them without a traceback."""


class UserInputError(ValueError):
    """Bad input (a missing file, a malformed vocab, mismatched shards); the message names it and the fix."""


class CommandFailed(RuntimeError):
    """The command ran but something failed that is not the input's fault (exit 1); the message says what and
    what to do."""
