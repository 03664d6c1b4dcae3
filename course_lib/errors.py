"""The errors a learner can cause, in one module that imports nothing heavy (no torch).

Each message says what happened and the one thing to do about it. ``python -m course_lib`` catches
``USER_ERRORS`` by type and prints the message alone; anything else is a bug and shows its traceback.
"""
from __future__ import annotations


class DataError(RuntimeError):
    """MNIST could not be made ready; the message says what to do."""


class LaunchConfigError(ValueError):
    """A process count or backend that cannot work here; the message names the fix."""


class LaunchError(RuntimeError):
    """The launched job failed; ``.result`` holds everything it printed (``.results``: every node's)."""

    def __init__(self, message: str, result=None, results=None):
        super().__init__(message)
        self.result = result
        self.results = results if results is not None else ([result] if result is not None else [])


class LaunchTimeout(LaunchError):
    """The job ran past its ``timeout`` and was stopped."""


class MarkerError(ValueError):
    """A solution notebook's markers do not pair up; the message names the notebook, cell and line."""


#: Errors whose message is the whole story: the command line prints it without a traceback.
USER_ERRORS = (DataError, LaunchConfigError, MarkerError)
