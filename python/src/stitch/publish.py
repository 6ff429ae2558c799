"""The original Python Stitch's trainer-side helpers (``stitch.publish``), with
its signatures, over Stitch's flat API: a trainer written against them runs
unchanged.

``pool`` is a ``stitch.pools.Pool`` (or anything with ``discover_replicas()``
and ``wake(replicas, ref)``), a Stitch pool spec string, or None. Stores are
``stitch.stores`` stores or ``stitch.open_store``'s. What differs from the
original, and why, is in docs/migrating.md.
"""

from __future__ import annotations

import logging
import os
from typing import Any, MutableMapping, Optional

import stitch
from stitch._stitch import VersionConstraint, VersionRef
from stitch.pools.base import as_pool
from stitch.stores.base import core_store

logger = logging.getLogger("stitch")


def publish_version(store: Any, pool: Any, version_dir: "str | os.PathLike", *,
                    run_id: str) -> VersionRef:
    """Publishes one version directory a framework wrote (FULL or DELTA,
    named ``weight_vNNNNNN``, the pointer's version + 1): verifies it, makes
    its files (index, payload, config and tokenizer files) durable, moves
    the pointer with a compare-and-swap, then wakes ``pool``. Publishing the
    version the pointer names with the same bytes again is a no-op (a
    retry); other bytes raise StoreError naming the first differing file.
    Raises PointerRewind for an older version, PointerConflict when another
    writer moved the pointer, ChecksumMismatch, InvalidArgument (a
    ValueError) and NotFound (a FileNotFoundError)."""
    pool = as_pool(pool)
    ref = stitch.publish_version(core_store(store), os.fspath(version_dir), run_id)
    wake_pool(pool, ref)
    return ref


def claim_run(store: Any, pool: Any, run_id: str, *, boot_version: int = 0) -> None:
    """Points the store at ``run_id``'s boot checkpoint before its first
    publish and wakes ``pool``. Claiming a claimed run again is a no-op (the
    pool is still woken); a reused run id that already published past its
    boot version raises PointerRewind."""
    if not isinstance(run_id, str):
        raise TypeError(f"stitch.publish.claim_run(store, pool, run_id, *, boot_version=0): "
                        f"run_id must be a string, got {run_id!r}")
    pool = as_pool(pool)
    stitch.claim_run(core_store(store), run_id, int(boot_version))
    wake_pool(pool, VersionRef(run_id, int(boot_version)))


def wake_pool(pool: Any, ref: VersionRef) -> None:
    """Asks ``pool``'s replicas to reconcile now. Best effort: the pointer
    has already moved and replicas converge on their own, so a failure is
    logged, never raised."""
    pool = as_pool(pool)
    if pool is None:
        return
    try:
        pool.wake(pool.discover_replicas(), ref)
    except Exception:  # noqa: BLE001 - a lost wake only costs latency
        logger.warning("stitch: waking the pool after %s failed; replicas will catch up on "
                       "their own", ref, exc_info=True)


def constrain_request(payload: MutableMapping[str, Any], headers: MutableMapping[str, str], *,
                      latest: Optional[int] = None, lag: int = 0, exact: Optional[int] = None,
                      session_id: Any = None, affinity_header: Optional[str] = None,
                      max_staleness: Optional[int] = None) -> None:
    """Constrains one rollout request in place: ``payload["weight_version"]``
    pins ``exact`` when given, else demands ``latest - lag`` or newer (at
    least 0) when ``latest`` is known, and with ``max_staleness`` a replica
    at most that many versions behind the pointer it last read; else it is
    removed (any version); and ``headers[affinity_header]`` carries
    ``session_id`` when both are given. Raises InvalidArgument for a
    negative lag, version or staleness."""
    constraint = VersionConstraint.for_request(
        latest=None if latest is None else int(latest), lag=int(lag),
        exact=None if exact is None else int(exact),
        max_staleness=None if max_staleness is None else int(max_staleness))
    if constraint.empty:
        payload.pop("weight_version", None)
    else:
        body: dict = {}
        if constraint.exact_version is not None:
            body["exact_version"] = constraint.exact_version
        elif constraint.min_version is not None:
            body["min_version"] = constraint.min_version
        if constraint.max_staleness is not None:
            body["max_staleness"] = constraint.max_staleness
        payload["weight_version"] = body
    if affinity_header and session_id is not None:
        headers[affinity_header] = str(session_id)


__all__ = ["publish_version", "claim_run", "wake_pool", "constrain_request"]
