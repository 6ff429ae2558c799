"""Pools of replicas, as the original Python Stitch's ``stitch.pools`` (and
``stitch.service``) present them: the Pool port, a pool over Stitch's pool
specs, and the readiness helpers a launcher waits on."""

from stitch.pools.base import Pool, SpecPool
from stitch.pools.readiness import POOL_READY_FRACTION, await_pool_ready, readiness

__all__ = ["Pool", "SpecPool", "POOL_READY_FRACTION", "readiness", "await_pool_ready"]
