"""The original Python Stitch's ``stitch.service`` import path for what a
launcher uses from it: ``readiness`` and ``await_pool_ready``
(``stitch.pools``). Stitch's sidecar is the ``stitch sidecar`` command, not a
Python app: ``create_app`` and ``serve`` are not provided."""

from stitch.pools.readiness import POOL_READY_FRACTION, await_pool_ready, readiness

__all__ = ["POOL_READY_FRACTION", "readiness", "await_pool_ready"]
