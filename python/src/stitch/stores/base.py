"""The Store port as the original Python Stitch presents it, over one of
Stitch's stores (the object ``stitch.open_store`` returns).

Every method keeps the core's guarantees: a version's files are durable
before any pointer names them, the pointer moves by compare-and-swap and
only forward inside a run, and published versions are immutable. A Store
can be passed wherever the flat API takes a store (``stitch.publish_version``,
``stitch.Publisher``...)."""

from __future__ import annotations

import os
from typing import Optional

from stitch import _stitch
from stitch._stitch import VersionRef
from stitch.errors import InvalidArgument
from stitch.types import VersionManifest


class Store:
    """One run's versions and ``latest`` pointer."""

    def __init__(self, core: _stitch.Store) -> None:
        self._core = core

    @property
    def uri(self) -> str:
        return self._core.uri

    @property
    def run_id(self) -> str:
        return self._core.run_id

    def _check_ref(self, ref: VersionRef) -> None:
        if ref.run_id != self.run_id:
            raise InvalidArgument(
                f"stitch: store {self.uri} is scoped to run {self.run_id!r}, not "
                f"{ref.run_id!r}; open a store for that run", "INVALID_ARGUMENT")

    def refresh(self) -> None:
        """Makes other hosts' writes visible (a no-op for Stitch's stores)."""
        self._core.refresh()

    def read_pointer(self) -> Optional[VersionRef]:
        """The version ``latest`` names, or None before a run is claimed."""
        return self._core.read_pointer()

    def compare_and_advance_pointer(self, expected: Optional[VersionRef],
                                    ref: VersionRef) -> None:
        """Moves ``latest`` to ``ref`` only if it still names ``expected``
        (an atomic compare-and-swap). Raises PointerConflict when it does
        not, PointerRewind for a lower or equal version of the same run."""
        self._check_ref(ref)
        self._core.advance_pointer(expected, ref)

    def advance_pointer(self, ref: VersionRef) -> None:
        """Moves ``latest`` to ``ref`` from whatever it names now (still a
        compare-and-swap against that value, and still refusing a rewind)."""
        self.compare_and_advance_pointer(self.read_pointer(), ref)

    def claim(self, boot: VersionRef) -> None:
        """Points ``latest`` at ``boot``, the run's boot checkpoint (a no-op
        when it names it already; refused as a rewind when the run already
        published past it)."""
        if not boot.run_id:
            raise InvalidArgument("stitch: claim needs a run id (the run's epoch token)",
                                  "INVALID_ARGUMENT")
        self._check_ref(boot)
        _stitch.claim_run(self._core, boot.version, None)

    def read_manifest(self, ref: VersionRef) -> VersionManifest:
        """The manifest of published version ``ref`` (NotFound when it is
        not published)."""
        self._check_ref(ref)
        return VersionManifest._from_core(ref.run_id, self._core.read_manifest(ref.version))

    def publish(self, manifest: VersionManifest, files_dir: str) -> None:
        """Makes the version directory ``files_dir`` (index, payload and its
        other files) durable as ``manifest.ref`` without moving the pointer.
        Identical bytes again are a no-op; other bytes are refused."""
        self._check_ref(manifest.ref)
        self._core.publish_files(manifest.ref.version, os.fspath(files_dir))

    def materialize(self, ref: VersionRef) -> str:
        """A local directory holding published version ``ref``."""
        self._check_ref(ref)
        return self._core.materialize(ref.version)

    def commit(self) -> None:
        """Nothing to do: Stitch's stores make files durable when they
        publish them."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r}, run_id={self.run_id!r})"


def core_store(store: "Store | _stitch.Store") -> _stitch.Store:
    """The core store behind ``store`` (itself when it is one)."""
    return store._core if isinstance(store, Store) else store
