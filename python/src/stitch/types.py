"""The original Python Stitch's ``stitch.types``, over Stitch's core.

``VersionRef`` and ``VersionConstraint`` are the core's classes (the ones
``stitch.VersionRef`` and ``stitch.VersionConstraint`` name), with the
original's constructors, ``identity``, ``from_payload`` / ``to_payload``;
``decide_pointer_move`` applies the core's pointer rules; ``PointerRewind``
and ``PointerConflict`` are ``stitch.errors``'s classes. The rest is plain
data: what a replica's ``/server_info`` says and what a pool's readiness
gathers. Nothing here does I/O but ``VersionManifest.from_hf_index``, which
reads one index through the core.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import List, Optional

from stitch import _stitch
from stitch._stitch import VersionConstraint, VersionRef
from stitch.errors import PointerConflict, PointerRewind

WEIGHT_PREFIX = "weight_v"


class VersionKind(str, enum.Enum):
    """A FULL version is an anchor holding every weight; a DELTA changes the
    version before it in the same run."""

    FULL = "full"
    DELTA = "delta"


@dataclass(frozen=True)
class VersionManifest:
    """A published version as its index describes it: identity, kind and
    payload files (sorted)."""

    ref: VersionRef
    kind: VersionKind
    files: List[str]

    @classmethod
    def from_hf_index(cls, version_dir: str | os.PathLike, *,
                      run_id: Optional[str] = None) -> "VersionManifest":
        """Reads ``version_dir``'s ``model.safetensors.index.json`` (checked
        as every Stitch reader checks it); its ``metadata.version`` is the
        version number."""
        version, kind, files, _ = _stitch.read_index_manifest(os.fspath(version_dir))
        return cls(VersionRef(run_id, version), VersionKind(kind), list(files))

    @classmethod
    def _from_core(cls, run_id: Optional[str], manifest: tuple) -> "VersionManifest":
        version, kind, files, _ = manifest
        return cls(VersionRef(run_id, version), VersionKind(kind), list(files))


class SyncState(str, enum.Enum):
    """Where a replica's reconcile is (``/server_info``'s ``sync_state``)."""

    IDLE = "IDLE"
    FETCHING = "FETCHING"
    STAGING = "STAGING"
    COMMITTING = "COMMITTING"
    ERROR = "ERROR"


@dataclass(frozen=True)
class ReplicaState:
    """What one replica's ``/server_info`` reports: whether it is in rotation,
    the version its engine holds, its reconcile state and why."""

    ready: bool = False
    applied: Optional[VersionRef] = None
    sync_state: Optional[SyncState] = None
    reason: Optional[str] = None

    def at(self, target: VersionRef) -> bool:
        """Whether this replica serves ``target`` and its reconcile is not in
        error: it counts toward ``target`` being live."""
        return self.applied == target and self.sync_state is not SyncState.ERROR

    @classmethod
    def from_dict(cls, data: dict) -> "ReplicaState":
        applied = data.get("applied")
        state = data.get("sync_state")
        known = {s.value for s in SyncState}
        return cls(ready=bool(data.get("ready", False)),
                   applied=VersionRef.parse(applied) if applied else None,
                   sync_state=SyncState(state) if state in known else None,
                   reason=data.get("reason"))

    def to_dict(self) -> dict:
        out: dict = {"ready": self.ready}
        if self.applied is not None:
            out["applied"] = self.applied.identity
        if self.sync_state is not None:
            out["sync_state"] = self.sync_state.value
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class PoolState:
    """Every discovered replica's state (``stitch.pools.readiness``)."""

    replicas: List[ReplicaState]


@dataclass(frozen=True)
class PointerMove:
    """An allowed pointer move; ``reset`` when it enters another run (replicas
    reset to that run's boot checkpoint, then follow it)."""

    ref: VersionRef
    reset: bool


def decide_pointer_move(current: Optional[VersionRef], proposed: VersionRef) -> PointerMove:
    """Whether the pointer may move from ``current`` (None: unset) to
    ``proposed``: forward inside a run, or into another run at any version.
    Raises PointerRewind (with ``current`` and ``proposed``) for a lower or
    equal version of the same run."""
    try:
        move = _stitch.check_pointer_move(current, proposed)
    except PointerRewind as rewind:
        rewind.current, rewind.proposed = current, proposed
        raise
    reset = move == "run_reset" or (move == "initial" and proposed.run_id is not None)
    return PointerMove(proposed, reset)


__all__ = [
    "WEIGHT_PREFIX",
    "VersionRef",
    "VersionKind",
    "VersionManifest",
    "VersionConstraint",
    "SyncState",
    "ReplicaState",
    "PoolState",
    "PointerRewind",
    "PointerConflict",
    "PointerMove",
    "decide_pointer_move",
]

