"""The error type for a user's own mistakes.

Every problem a user can fix themselves (a malformed task file, an unknown model, an artifact
made with other settings in the way, an invalid option) raises a subclass of :class:`UserError`
whose message names the file or option and the fix. The commands print such an error as one
line and exit with status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input; the message says which input and how to fix it."""


class ConfigError(UserError, ValueError):
    """A setting outside its valid range (e.g. ``steps=0``); raised where the config is built."""


class TrainingDivergedError(UserError, FloatingPointError):
    """A loss became NaN or infinite; the message names the task and the setting to change."""


__all__ = ["ConfigError", "TrainingDivergedError", "UserError"]
