"""Publisher: claim and publish from one process or from every rank of a
multi-host trainer (the S3 upload-and-verify protocol of
src/stitch/publish/multihost.h runs through a TrainerComms)."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from stitch import _stitch
from stitch._stitch import Store, TrainerComms, VersionRef


class Publisher:
    """Claims ``store``'s run and publishes versions into it.

    Without ``comms`` every call is local (:func:`stitch.claim_run`,
    :func:`stitch.publish_version`). With ``comms`` (a :class:`TrainerComms`
    subclass over the trainer's process group) every rank calls
    :meth:`publish` with its local view of the version directory: each host
    leader uploads its own shards, rank 0 verifies the receipts and moves the
    pointer; every rank gets the same outcome or the same exception.
    ``pool`` is a replica pool spec to wake after the pointer moved.
    """

    def __init__(self, store: Store, pool: Optional[str] = None, run_id: Optional[str] = None,
                 comms: Optional[TrainerComms] = None) -> None:
        import stitch

        stitch._check_run(store, run_id)
        self.store = store
        self.pool = stitch._check_pool(pool)
        self.run_id = store.run_id
        self.comms = comms

    def claim(self, boot_version: int = 0):
        """Claims the run (rank 0 only when there are several ranks; the
        others return None)."""
        import stitch

        if self.comms is not None and self.comms.rank() != 0:
            return None
        return stitch.claim_run(self.store, self.run_id, boot_version, self.pool)

    def publish(self, version_dir: str, files: Sequence[str] = ()) -> VersionRef:
        """Publishes ``version_dir`` (named weight_vNNNNNN). ``files``: the
        payload files this host uploads, relative to the directory (default:
        those present in it)."""
        import stitch

        if self.comms is None:
            ref, already = _stitch.publish_version(self.store, os.fspath(version_dir), self.pool)
        else:
            ref, already = _stitch.publish_from_hosts(self.store, self.comms,
                                                      os.fspath(version_dir), list(files),
                                                      self.pool)
        if already:
            stitch._log_already_published(self.store, ref)
        return ref
