"""``FsStore``: a run's versions and pointer under one directory of a local
or shared POSIX filesystem. Constructed as the original Python Stitch's
``ModalVolumeStore(root, run_id=...)``, over the same layout
(``<root>/latest``, ``<root>/updates/weight_vNNNNNN/``)."""

from __future__ import annotations

import os

from stitch import _stitch
from stitch.errors import InvalidArgument
from stitch.stores.base import Store


class FsStore(Store):
    """``root`` is the run's directory. Files are fsync'ed and renamed into
    place when published, and the pointer is replaced atomically under a
    lock, so there is no commit step (``commit`` does nothing). That needs a
    filesystem other hosts see writes on as they happen (local disk, NFS,
    Lustre...); a volume that shows them only after an explicit commit and
    reload (a Modal Volume) cannot keep bytes ahead of the pointer: use S3
    there. Opening creates nothing; ``claim`` (or ``stitch.claim_run``)
    creates the store."""

    def __init__(self, root: "str | os.PathLike", *, run_id: str) -> None:
        if not run_id:
            raise InvalidArgument("stitch: FsStore needs a run_id", "INVALID_ARGUMENT")
        self.root = os.path.abspath(os.fspath(root))
        super().__init__(_stitch.open_store(self.root, run_id, None))
