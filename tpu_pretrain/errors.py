"""Errors a user can fix; the CLI prints them without a traceback."""


class UserInputError(ValueError):
    """Bad input (a missing file, a malformed vocab, mismatched shards); the message names it and the fix."""

