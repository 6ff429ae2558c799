"""Stitch for trainers: claim a run, publish versions, constrain requests,
and encode deltas from the weights a trainer holds in memory.

The work is done by Stitch's C++ core (the ``stitch._stitch`` extension);
calls that touch disk or the network release the GIL.

A trainer's three calls::

    store = stitch.open_store("file:///runs/a", run_id="run-1")
    stitch.claim_run(store, "run-1", boot_version=0)
    stitch.publish_version(store, "/scratch/weight_v000001", "run-1")
    payload, headers = stitch.constrain_request(payload, headers, latest=1, lag=1)

The original Python Stitch's import paths work too, as thin aliases over
these calls: ``stitch.types``, ``stitch.publish``, ``stitch.publisher``,
``stitch.stores``, ``stitch.pools`` (and ``stitch.service``), ``stitch.errors``
(docs/migrating.md).
"""

from __future__ import annotations

import json
import logging
import operator
import os
from typing import Any, Mapping, MutableMapping, Optional, Sequence, Tuple

from stitch import _stitch
from stitch._stitch import Store, VersionConstraint, VersionRef
from stitch import errors
from stitch.encoder import DeltaEncoder
from stitch.errors import (
    ChecksumMismatch,
    InvalidArgument,
    NotFound,
    PointerConflict,
    PointerRewind,
    StitchError,
    StoreError,
    VersionNotReady,
)


def _check_pool(pool: Optional[str]) -> Optional[str]:
    if pool is not None and not isinstance(pool, str):
        raise InvalidArgument(
            "stitch: pool must be a spec string (static:URL,URL,..., file:PATH or dns:NAME:PORT) "
            "or None", "INVALID_ARGUMENT")
    return pool


def _core(store: Any) -> Store:
    """The core store behind ``store`` (a ``stitch.stores`` store wraps one)."""
    return getattr(store, "_core", store)


def _check_run(store: Store, run_id: Optional[str]) -> None:
    if run_id is not None and run_id != store.run_id:
        raise InvalidArgument(
            f"stitch: store {store.uri} is opened for run {store.run_id!r}, not {run_id!r}; "
            "open the store with the run you mean",
            "INVALID_ARGUMENT",
        )


def open_store(uri: str, run_id: str, cache_dir: Optional[str] = None) -> Store:
    """Opens the store at ``uri`` (a path, ``file:///abs/path`` or
    ``s3://bucket/prefix[?endpoint=URL&region=R]``) scoped to ``run_id``.
    ``cache_dir`` is where remote stores materialize versions. Opening creates
    nothing: a store that does not exist yet is created by :func:`claim_run`,
    and publishing into it before that is refused."""
    return _stitch.open_store(str(uri), run_id, None if cache_dir is None else str(cache_dir))


class ClaimOutcome:
    """What :func:`claim_run` did: where the pointer stands now, what it named
    before (None: unset), and whether it moved."""

    def __init__(self, pointer: VersionRef, previous: Optional[VersionRef], moved: bool) -> None:
        self.pointer = pointer
        self.previous = previous
        self.moved = moved

    def __repr__(self) -> str:
        return f"ClaimOutcome(pointer={self.pointer!s}, previous={self.previous!s}, moved={self.moved})"


def claim_run(store: Store, *args: Any, **kwargs: Any) -> Optional[ClaimOutcome]:
    """``claim_run(store, run_id=None, boot_version=0, pool=None)``: points
    the store's pointer at ``run_id``'s boot version (a no-op when the run is
    already claimed), then wakes the replicas of ``pool`` (a spec:
    ``static:URL,URL,...``, ``file:PATH`` or ``dns:NAME:PORT``). Raises
    PointerRewind, PointerConflict or StoreError.

    The original Stitch's order, ``claim_run(store, pool, run_id, *,
    boot_version=0)`` (``stitch.publish.claim_run``), is taken too: a call
    whose second argument is a pool object or None followed by a run id,
    or whose third is a run id, means it, and returns None as the original's
    does."""
    if _original_claim_order(args):
        from stitch.publish import claim_run as original_claim_run

        return original_claim_run(store, *args, **kwargs)
    run_id, boot_version, pool = _claim_args(*args, **kwargs)
    store = _core(store)
    _check_run(store, run_id)
    pointer, previous, moved = _stitch.claim_run(store, _version(boot_version, "boot_version"),
                                                 _check_pool(pool))
    return ClaimOutcome(pointer, previous, moved)


def _claim_args(run_id: Optional[str] = None, boot_version: int = 0,
                pool: Optional[str] = None) -> Tuple[Optional[str], int, Optional[str]]:
    return run_id, boot_version, pool


def _original_claim_order(args: Sequence[Any]) -> bool:
    # Ours: (run_id: str | None, boot_version: int, pool); the original's:
    # (pool: Pool | str | None, run_id: str).
    if len(args) >= 2 and isinstance(args[1], str):
        return True
    return len(args) >= 1 and args[0] is not None and not isinstance(args[0], str)


def _version(value: Any, name: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"stitch: {name} must be an int, got {value!r}; the call order is "
                        "claim_run(store, run_id, boot_version, pool) or the original's "
                        "claim_run(store, pool, run_id, *, boot_version)") from None


def publish_version(store: Store, *args: Any, **kwargs: Any) -> VersionRef:
    """``publish_version(store, version_dir, run_id=None, pool=None,
    base_dir=None)``: verifies the version directory ``version_dir`` (named
    weight_vNNNNNN, FULL or DELTA, the pointer's version + 1), publishes it
    with the directory's other files (config.json, tokenizer files), moves
    the pointer to it and wakes ``pool``'s replicas. The run must be claimed
    first (:func:`claim_run`). ``base_dir``, the complete checkpoint of the
    pointer's version, makes a DELTA's checksums verified too.

    Publishing the version the pointer already names, with the bytes it was
    published with, is a successful no-op (a retry after a crash; logged);
    with other bytes it raises StoreError naming the first differing file.
    Raises PointerRewind, PointerConflict, ChecksumMismatch or StoreError.

    The original Stitch's order, ``publish_version(store, pool, version_dir,
    *, run_id)`` (``stitch.publish.publish_version``), is taken too: a call
    whose second argument is a pool object or None, or that gives a pool and
    a directory before ``run_id=``, means it."""
    if _original_publish_order(args, kwargs):
        from stitch.publish import publish_version as original_publish_version

        return original_publish_version(store, *args, **kwargs)
    version_dir, run_id, pool, base_dir = _publish_args(*args, **kwargs)
    store = _core(store)
    _check_run(store, run_id)
    ref, already = _stitch.publish_version(store, str(version_dir), _check_pool(pool),
                                           None if base_dir is None else str(base_dir))
    if already:
        _log_already_published(store, ref)
    return ref


def _publish_args(version_dir: "str | os.PathLike[str]", run_id: Optional[str] = None,
                  pool: Optional[str] = None, base_dir: Optional[str] = None) -> Tuple[Any, ...]:
    return version_dir, run_id, pool, base_dir


def _original_publish_order(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    # Ours: (version_dir: path, run_id, pool, base_dir); the original's:
    # (pool: Pool | str | None, version_dir, *, run_id).
    if len(args) >= 1 and not isinstance(args[0], (str, os.PathLike)):
        return True
    return len(args) >= 2 and "run_id" in kwargs


def _log_already_published(store: Store, ref: VersionRef) -> None:
    logging.getLogger("stitch").info(
        "%s is already published in %s with these bytes; nothing changed", ref, store.uri)


def constrain_request(payload: Mapping[str, Any], headers: Optional[MutableMapping[str, str]] = None,
                      latest: Optional[int] = None, lag: int = 0, exact: Optional[int] = None,
                      session_id: Optional[str] = None,
                      affinity_header: Optional[str] = None,
                      max_staleness: Optional[int] = None) -> Tuple[dict, dict]:
    """Returns a copy of a rollout request's JSON ``payload`` constrained to
    version ``exact`` when given, else ``latest - lag`` or newer when
    ``latest`` is known, and, with ``max_staleness``, to a replica at most
    that many versions behind the store's pointer as it last read it; and a
    copy of ``headers`` with ``session_id`` under ``affinity_header`` when
    both are given."""
    body = _stitch.constrain_request_body(json.dumps(payload), latest, int(lag), exact,
                                          None if max_staleness is None else int(max_staleness))
    new_headers = dict(headers or {})
    if session_id is not None and affinity_header:
        new_headers[affinity_header] = str(session_id)
    return json.loads(body), new_headers


def apply_chain(anchor_dir: str, delta_dirs: Sequence[str], out_dir: str, run_id: str = "",
                anchor_version: Optional[int] = None, threads: int = 0) -> dict:
    """Materializes into ``out_dir`` the version the last of ``delta_dirs``
    produces, from the anchor (FULL or boot checkpoint) in ``anchor_dir``.
    Raises ChecksumMismatch when a result does not match its checksum."""
    return _stitch.apply_chain(str(anchor_dir), [str(d) for d in delta_dirs], str(out_dir),
                               run_id, anchor_version, int(threads))


def verify(version_dir: str, base_dir: Optional[str] = None, threads: int = 0) -> dict:
    """Checks a version directory; with ``base_dir`` (the complete checkpoint
    a DELTA applies to) also every changed tensor's checksum."""
    return _stitch.verify(str(version_dir), None if base_dir is None else str(base_dir), int(threads))


from stitch.publisher import Publisher, TrainerComms  # noqa: E402  (uses the helpers above)

__all__ = [
    "VersionRef",
    "VersionConstraint",
    "Store",
    "ClaimOutcome",
    "open_store",
    "claim_run",
    "publish_version",
    "constrain_request",
    "apply_chain",
    "verify",
    "DeltaEncoder",
    "Publisher",
    "TrainerComms",
    *errors.__all__,
]
