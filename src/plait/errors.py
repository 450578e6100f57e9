"""Errors that the CLI turns into one clear line and a non-zero exit (never a traceback)."""


class PlaitError(Exception):
    """A user-facing error: bad input, an impossible layout, nothing fits, ..."""


class RunStopped(PlaitError):
    """The run was stopped by a signal (e.g. SIGTERM from a scheduler) after saving what it could."""

    exit_code = 143  # 128 + SIGTERM, what schedulers expect of a terminated job

    def __init__(self, message: str = "", exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code  # 128 + the signal (SIGINT 130, SIGHUP 129)
