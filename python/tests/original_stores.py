"""A store factory in the original Python Stitch's shape
(``factory(backend, *, local_root, run_id, **options) -> Store``), as a
launcher's ``--store-factory`` names one: ``backend="fs"`` is an ``FsStore``
rooted at the local root."""

from __future__ import annotations

from stitch.stores import FsStore
from stitch.stores.base import Store


def create_store(backend: str, *, local_root: str, run_id: str) -> Store:
    if backend == "fs":
        return FsStore(local_root, run_id=run_id)
    raise ValueError(f"unsupported store backend: {backend!r}")
