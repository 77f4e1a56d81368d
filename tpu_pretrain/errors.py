"""Errors a user can fix; the CLI prints them without a traceback."""


class UserInputError(ValueError):
    """Bad input (a missing file, a malformed vocab, mismatched shards); the message names it and the fix."""


# Exit codes of the ``tpu-pretrain`` command besides 0 (done) and 1 (failed); README.md lists them.
EXIT_USER_ERROR = 2  # bad input: the message says what to change
EXIT_STOPPED = 75  # stopped before the end (session deadline, SIGTERM, Ctrl-C): run the same command to continue
