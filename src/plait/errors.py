"""Errors that the CLI turns into one clear line and a non-zero exit (never a traceback)."""


class PlaitError(Exception):
    """A user-facing error: bad input, an impossible layout, nothing fits, ..."""
