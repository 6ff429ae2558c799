"""Exceptions raised by stitch, one type per place where recovery happens.

Every exception carries the core's one-line message and its status code name
(``code``, e.g. ``"ABORTED"``).

The original Python Stitch's error names are here too, as the same classes:
``PointerRewind`` and ``PointerConflict`` (``stitch.types`` in the original;
they accept its constructor arguments and carry its attributes), and
``UnrecoverableSidecarError`` / ``UnrecoverableEngineError``.
"""

from __future__ import annotations

from typing import Any


class StitchError(Exception):
    """Base class of every error stitch raises."""

    def __init__(self, message: str, code: str = "UNKNOWN", **details: Any) -> None:
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


def _identity(ref: Any) -> str:
    return "<unset>" if ref is None else str(ref)


def _version_ref(value: Any) -> Any:
    """A VersionRef from the core's identity text ("" or None: unset)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        from stitch._stitch import VersionRef  # noqa: PLC0415 - errors load before the extension

        return VersionRef.parse(value)
    return value


class PointerRewind(StoreError):
    """The pointer would move to a lower or equal version of the same run.

    ``current`` and ``proposed`` are the two versions (VersionRef) when
    known, else None. Also raised as the original's
    ``PointerRewind(current, proposed)``."""

    current: Any = None
    proposed: Any = None

    def __init__(self, *args: Any, **details: Any) -> None:
        if args and not isinstance(args[0], str):
            current, proposed = args[0], args[1]
            super().__init__(
                f"latest is {_identity(current)!r}; refusing to rewind to {_identity(proposed)!r}",
                "FAILED_PRECONDITION", current=current, proposed=proposed)
            return
        super().__init__(*args, **details)


class PointerConflict(StoreError):
    """The pointer changed between read and compare-and-swap (another writer).

    ``expected``, ``actual`` and ``proposed`` hold the three pointer values
    (VersionRef, None when unset). Re-read the pointer and decide again.
    Also raised as the original's ``PointerConflict(expected, actual,
    proposed)``."""

    expected: Any = None
    actual: Any = None
    proposed: Any = None

    def __init__(self, *args: Any, **details: Any) -> None:
        if args and not isinstance(args[0], str):
            expected, actual, proposed = args[0], args[1], args[2]
            super().__init__(
                f"latest changed while publishing {_identity(proposed)!r}: "
                f"expected {_identity(expected)!r}, found {_identity(actual)!r}; "
                "re-read the pointer and retry",
                "ABORTED", expected=expected, actual=actual, proposed=proposed)
            return
        for key in ("expected", "actual", "proposed"):
            if key in details:
                details[key] = _version_ref(details[key])
        super().__init__(*args, **details)


class ChecksumMismatch(StitchError):
    """Bytes do not hash to what was recorded, or a frame is corrupt: refetch."""


class VersionNotReady(StitchError):
    """A request's version constraint is not met yet (HTTP 409)."""


class UnrecoverableSidecarError(StitchError, RuntimeError):
    """A failure that needs the replica replaced rather than retried (the
    original's name; Stitch's sidecar ends its process instead of raising)."""

    def __init__(self, message: str = "", code: str = "INTERNAL", **details: Any) -> None:
        super().__init__(message, code, **details)


class UnrecoverableEngineError(UnrecoverableSidecarError):
    """The inference engine cannot recover inside this replica."""


__all__ = [
    "StitchError",
    "InvalidArgument",
    "NotFound",
    "StoreError",
    "PointerRewind",
    "PointerConflict",
    "ChecksumMismatch",
    "VersionNotReady",
    "UnrecoverableSidecarError",
    "UnrecoverableEngineError",
]
