"""Errors a user can fix; the CLI prints them without a traceback."""


class UserInputError(ValueError):
    """Bad input (a missing file, a malformed vocab, mismatched shards); the message names it and the fix."""


class CommandFailed(RuntimeError):
    """The command ran but something failed that is not the input's fault (exit 1); the message says what and
    what to do."""


class ProcessLost(CommandFailed):
    """One of several training processes is gone (killed, preempted, its host lost); the message names it. The
    command line ends at once after saying so: JAX's own exit would wait at a shutdown barrier for the lost process
    and then abort."""
