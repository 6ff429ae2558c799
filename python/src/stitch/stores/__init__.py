"""Stores, as the original Python Stitch's ``stitch.stores`` presents them:
``FsStore`` (a directory, where the original had ``ModalVolumeStore``) and
``S3Store``, both ``Store``s (``stitch.stores.base``)."""

from stitch.stores.base import Store
from stitch.stores.fs import FsStore
from stitch.stores.s3 import S3Store

__all__ = ["Store", "FsStore", "S3Store"]
