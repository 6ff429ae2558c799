"""Publisher: claim and publish from one process or from every rank of a
multi-host trainer (the upload-and-verify protocol of
src/stitch/publish/multihost.h runs through a TrainerComms).

Both this package's calls and the original Python Stitch's
(``Publisher(store, pool, run_id=..., comms=...)``, ``TrainerComms`` with
``rank`` / ``all_gather_object`` / ``is_host_leader``) work here.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Optional, Sequence

from stitch import _stitch
from stitch._stitch import VersionRef
from stitch.errors import InvalidArgument, StitchError

logger = logging.getLogger("stitch")

_WEIGHT_PREFIX = "weight_v"


class TrainerComms:
    """How a trainer's ranks meet during a publish. The defaults are one
    process: rank None (treated as 0), gathers of one value, its own host's
    leader. A distributed trainer subclasses it over its runtime
    (``stitch.integrations.torch_comms`` does for torch.distributed); every
    method is called on every rank at the same point of a publish.

    Override ``rank``, ``is_host_leader`` and ``all_gather_object`` (the
    original's three), or ``all_gather`` for byte values; ``world_size``
    may return None, the group then being as large as its gathers."""

    def rank(self) -> Optional[int]:
        """This process's global rank; None off the distributed path."""
        return None

    def world_size(self) -> Optional[int]:
        """How many ranks publish together; None: as many as a gather returns."""
        return None

    def is_host_leader(self) -> bool:
        """True for the one rank per host that uploads the files its host wrote."""
        return True

    def all_gather_object(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order (a collective)."""
        return [value]

    def all_gather(self, value: bytes) -> List[bytes]:
        """``all_gather_object`` of a bytes value."""
        return list(self.all_gather_object(value))


class _CoreComms(_stitch.TrainerComms):
    """A TrainerComms of this module (or any object with its methods) as the
    core's TrainerComms."""

    def __init__(self, comms: Any) -> None:
        super().__init__()
        self._comms = comms
        self._gathered = 1

    def rank(self) -> int:
        rank = self._comms.rank()
        return 0 if rank is None else int(rank)

    def world_size(self) -> int:
        size = getattr(self._comms, "world_size", lambda: None)()
        return self._gathered if size is None else int(size)

    def is_host_leader(self) -> bool:
        return bool(self._comms.is_host_leader())

    def all_gather(self, value: bytes) -> List[bytes]:
        gather = getattr(self._comms, "all_gather", None) or self._comms.all_gather_object
        values = [bytes(v) for v in gather(bytes(value))]
        self._gathered = len(values)
        return values


def _core_comms(comms: Any) -> _stitch.TrainerComms:
    return comms if isinstance(comms, _stitch.TrainerComms) else _CoreComms(comms)


class Publisher:
    """Claims ``store``'s run and publishes versions into it.

    Without ``comms`` (or with one whose ``rank()`` is None) every call is
    local (:func:`stitch.claim_run`, :func:`stitch.publish_version`). With
    ``comms`` over the trainer's process group every rank calls
    :meth:`publish` with its local view of the version directory: each host
    leader uploads its own shards, rank 0 verifies the receipts and moves the
    pointer; every rank gets the same outcome or the same exception.
    ``pool`` is woken after the pointer moved: a pool spec string or a
    ``stitch.pools.Pool``.
    """

    def __init__(self, store: Any, pool: Any = None, run_id: Optional[str] = None,
                 comms: Any = None, *, keep_last: Optional[int] = None,
                 keep_every: int = 0) -> None:
        import stitch
        from stitch.pools.base import as_pool
        from stitch.stores.base import core_store

        self.store = store
        self._core = core_store(store)
        stitch._check_run(self._core, run_id)
        self.pool = pool
        self._spec = stitch._check_pool(pool) if pool is None or isinstance(pool, str) else None
        self._pool = None if self._spec is not None else as_pool(pool)
        self.run_id = self._core.run_id
        self.comms = comms
        # Retention after each publish (``stitch gc``'s rule): keep the last
        # ``keep_last`` versions and every ``keep_every``-th, with the
        # pointer's, the held ones and their chains. None: keep everything.
        if keep_last is not None and int(keep_last) < 1:
            raise InvalidArgument(f"stitch: keep_last must be at least 1, not {keep_last}",
                                  "INVALID_ARGUMENT")
        if int(keep_every) < 0:
            raise InvalidArgument(f"stitch: keep_every must be 0 or positive, not {keep_every}",
                                  "INVALID_ARGUMENT")
        self.keep_last = None if keep_last is None else int(keep_last)
        self.keep_every = int(keep_every)

    def _local(self) -> bool:
        return self.comms is None or self.comms.rank() is None

    def claim(self, boot_version: int = 0):
        """Claims the run (rank 0 only when there are several ranks; the
        others return None)."""
        import stitch
        from stitch.publish import wake_pool

        if not self._local() and self.comms.rank() != 0:
            return None
        outcome = stitch.claim_run(self._core, self.run_id, int(boot_version), self._spec)
        wake_pool(self._pool, outcome.pointer)
        return outcome

    def publish(self, version_dir: "str | os.PathLike",
                files: Sequence[str] = ()) -> Optional[VersionRef]:
        """Publishes ``version_dir`` (named weight_vNNNNNN) and returns its
        identity. ``files``: the payload files this host uploads, relative to
        the directory (default: those present in it). The version the
        pointer already names, with the same bytes, is a no-op (logged).

        A directory not named ``weight_v...`` (a framework's run directory,
        which the original commits to its volume) has nothing to publish:
        Stitch's stores are durable at publish. Returns None."""
        import stitch
        from stitch.publish import wake_pool

        path = os.fspath(version_dir)
        if not os.path.basename(os.path.normpath(path)).startswith(_WEIGHT_PREFIX):
            logger.debug("stitch: %s is not a version directory; nothing to publish", path)
            return None
        if self._local():
            ref, already = _stitch.publish_version(self._core, path, self._spec)
        else:
            ref, already = _stitch.publish_from_hosts(self._core, _core_comms(self.comms), path,
                                                      list(files), self._spec)
        if already:
            stitch._log_already_published(self._core, ref)
        if self._local() or self.comms.rank() == 0:
            wake_pool(self._pool, ref)
            self._retain()
        return ref

    def _retain(self) -> None:
        """Applies the retention rule, if any. The version is published
        whatever happens here: a failure is logged, and the next publish's
        retention tries again."""
        if self.keep_last is None:
            return
        try:
            deleted, report = _stitch.apply_retention(self._core, self.keep_last,
                                                      self.keep_every)
        except StitchError as e:
            logger.warning("stitch: retention after publish failed: %s", e)
            return
        if deleted:
            logger.info("stitch: retention deleted %d version(s):\n%s", len(deleted), report)
