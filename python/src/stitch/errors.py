"""Exceptions raised by stitch, one type per place where recovery happens.

Every exception carries the core's one-line message and its status code name
(``code``, e.g. ``"ABORTED"``).
"""

from __future__ import annotations


class StitchError(Exception):
    """Base class of every error stitch raises."""

    def __init__(self, message: str, code: str = "UNKNOWN", **details: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        for key, value in details.items():
            setattr(self, key, value)


class InvalidArgument(StitchError, ValueError):
    """Bad input from the caller: fix the call, retrying will not help."""


class NotFound(StitchError, FileNotFoundError):
    """A missing version, directory or file."""


class StoreError(StitchError):
    """The store refused or failed an operation (retry if transient)."""


class PointerRewind(StoreError):
    """The pointer would move to a lower or equal version of the same run."""


class PointerConflict(StoreError):
    """The pointer changed between read and compare-and-swap (another writer).

    ``expected``, ``actual`` and ``proposed`` hold the three pointer values
    ("" when unset). Re-read the pointer and decide again.
    """

    expected: str = ""
    actual: str = ""
    proposed: str = ""


class ChecksumMismatch(StitchError):
    """Bytes do not hash to what was recorded, or a frame is corrupt: refetch."""


class VersionNotReady(StitchError):
    """A request's version constraint is not met yet (HTTP 409)."""


__all__ = [
    "StitchError",
    "InvalidArgument",
    "NotFound",
    "StoreError",
    "PointerRewind",
    "PointerConflict",
    "ChecksumMismatch",
    "VersionNotReady",
]
