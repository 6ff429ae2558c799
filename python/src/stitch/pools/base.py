"""The Pool port as the original Python Stitch presents it: how a trainer
reaches the replicas of its rollout pool (and the gateway in front of them)
and nudges them after a publish.

``SpecPool`` is the pool behind one of Stitch's pool specs, the same replicas
``stitch gateway --pool`` and ``stitch publish --pool`` use; subclass ``Pool``
for another discovery (the original's Modal pools are not provided).
"""

from __future__ import annotations

import abc
import asyncio
from typing import List, Optional

from stitch import _stitch
from stitch._stitch import VersionRef


class Pool(abc.ABC):
    """A client of a running pool of replicas. Subclasses implement
    ``gateway_url`` and ``discover_replicas``; ``wake`` and ``scale`` are
    optional (replicas poll the store on their own; the pool scales itself).
    The ``*_async`` variants run the synchronous ones on a worker thread."""

    @abc.abstractmethod
    def gateway_url(self) -> Optional[str]:
        """The URL rollout traffic goes to, or None when there is no gateway."""

    @abc.abstractmethod
    def discover_replicas(self) -> List[str]:
        """The base URLs of the replicas live now (a snapshot: replicas come
        and go, so callers tolerate a stale list)."""

    def wake(self, replicas: List[str], ref: VersionRef) -> None:
        """Asks ``replicas`` to reconcile now (best effort; default: nothing)."""

    def scale(self, *, min: Optional[int] = None, max: Optional[int] = None) -> None:  # noqa: A002
        """Adjusts the replica floor and cap (default: nothing)."""

    async def gateway_url_async(self) -> Optional[str]:
        return await asyncio.to_thread(self.gateway_url)

    async def discover_replicas_async(self) -> List[str]:
        return await asyncio.to_thread(self.discover_replicas)

    async def wake_async(self, replicas: List[str], ref: VersionRef) -> None:
        await asyncio.to_thread(self.wake, replicas, ref)


class SpecPool(Pool):
    """The replicas a Stitch pool spec names: ``static:URL,URL,...``,
    ``file:PATH`` (one URL per line, re-read when it changes) or
    ``dns:NAME:PORT``, fronted by ``gateway_url`` (a ``stitch gateway``) when
    given. Raises InvalidArgument for a malformed spec."""

    def __init__(self, spec: str, *, gateway_url: Optional[str] = None) -> None:
        self.spec = spec
        self._core = _stitch.make_pool(spec)
        self._gateway_url = gateway_url

    def gateway_url(self) -> Optional[str]:
        return self._gateway_url

    def discover_replicas(self) -> List[str]:
        return list(self._core.discover())

    def wake(self, replicas: List[str], ref: VersionRef) -> None:
        """POSTs ``/wake`` to each replica concurrently; failures are logged
        by the core, never raised."""
        _stitch.wake_replicas([str(url) for url in replicas])

    def __repr__(self) -> str:
        return f"SpecPool({self.spec!r})"


def as_pool(pool: "Pool | str | None") -> Optional[Pool]:
    """``pool`` as a Pool: a spec string becomes a SpecPool."""
    if pool is None or isinstance(pool, Pool):
        return pool
    if isinstance(pool, str):
        return SpecPool(pool)
    return pool  # a duck-typed pool: discover_replicas() and wake(replicas, ref)
