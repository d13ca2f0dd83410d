"""One exception root for everything lensopt raises on purpose.

User mistakes (bad space files, traces, CLI arguments) are ``UserError`` subclasses: the CLI
prints their message on one line and exits 2. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class LensoptError(Exception):
    """Root of every error lensopt raises deliberately."""

    exit_code = 1


class UserError(LensoptError):
    """A mistake in user input: message names the file, the field and the fix."""

    exit_code = 2


class SpaceError(UserError):
    """A space file (TOML) is malformed or inconsistent."""


class TraceError(UserError):
    """A workload trace file has a bad header or bad rows."""


class CacheError(LensoptError):
    """The profile cache is unusable (foreign file, corrupt, unknown schema)."""

    exit_code = 2


class MissingProfiles(LensoptError):
    """A prediction needs bucket profiles the cache does not hold."""

    exit_code = 3

    def __init__(self, message: str, *, missing: dict | None = None):
        super().__init__(message)
        self.missing = missing or {}


class RunnerError(LensoptError):
    """A runner failed to compile or measure (hardware, SDK or program failure)."""


class UnitCannotRun(RunnerError):
    """The unit cannot run on this target however often it is tried: never retried, and the
    profile cache remembers it so that later searches skip it."""


class DeviceOutOfMemory(UnitCannotRun):
    """The unit does not fit the device's memory: deterministic, so never worth a retry."""


class UnitRefused(UnitCannotRun):
    """The runner refuses the unit or candidate for good (a shape or setting it cannot run)."""


class RunnerUnavailable(UserError):
    """A runner was chosen whose optional dependency is not installed."""


def one_line(exc: BaseException, limit: int = 2000) -> str:
    """``"Class: message"`` on one line (a runner's message may carry a stderr tail), at most ``limit`` characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]
