"""How ready a pool is, from every replica's own ``/server_info``: what a
launcher waits on before it starts rollouts (the original's
``stitch.service.readiness`` and ``await_pool_ready``, with its defaults).

A gateway answers its ``/health`` once one replica is ready; a large rollout
launch needs more than one, so readiness counts replicas."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from typing import Optional, Union

from stitch.pools.base import Pool, as_pool
from stitch.types import PoolState, ReplicaState

# The share of `replica_floor` that must be ready before a launch goes on.
POOL_READY_FRACTION = 0.75

# Replicas and gateways are reached directly, never through an HTTP proxy
# from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout: float) -> tuple:
    """(status, body) of a GET; an HTTP error status is an answer too."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _probe(url: str, timeout: float) -> ReplicaState:
    """One replica's state; one that does not answer is not ready, and says
    why."""
    try:
        _, body = _get(f"{url.rstrip('/')}/server_info", timeout)
        return ReplicaState.from_dict(json.loads(body))
    except Exception as error:  # noqa: BLE001 - any failure means "not ready"
        return ReplicaState(reason=str(error)[:80])


async def _discover(pool: Pool) -> list:
    discover = getattr(pool, "discover_replicas_async", None)
    if discover is not None:
        return list(await discover())
    return list(await asyncio.to_thread(pool.discover_replicas))


async def _gateway_url(pool: Pool) -> Optional[str]:
    gateway = getattr(pool, "gateway_url_async", None)
    if gateway is not None:
        return await gateway()
    return await asyncio.to_thread(pool.gateway_url)


async def readiness(pool: Union[Pool, str], *, timeout: float = 15.0) -> PoolState:
    """Every discovered replica's ``/server_info`` (each probe bounded by
    ``timeout`` seconds), gathered concurrently. ``pool`` is a Pool or a
    Stitch pool spec."""
    pool = as_pool(pool)
    replicas = await _discover(pool)
    states = await asyncio.gather(*(asyncio.to_thread(_probe, url, timeout) for url in replicas))
    return PoolState(list(states))


def await_pool_ready(pool: Union[Pool, str], *, replica_floor: int, timeout: float = 60 * 60,
                     interval: float = 30.0) -> bool:
    """Blocks until ``ceil(POOL_READY_FRACTION * replica_floor)`` replicas
    report ready, then until the pool's gateway answers ``/health`` with 200
    (skipped for a pool without a gateway: ``gateway_url()`` is None). Polls
    every ``interval`` seconds, printing the count when it changes. Returns
    True; raises TimeoutError after ``timeout`` seconds (a launch never
    starts below its floor) and ValueError for a floor below 1."""
    if replica_floor < 1:
        raise ValueError(f"replica_floor must be at least 1, got {replica_floor}")
    pool = as_pool(pool)
    needed = math.ceil(POOL_READY_FRACTION * replica_floor)

    async def wait() -> bool:
        deadline = time.monotonic() + timeout
        shown = None
        while time.monotonic() < deadline:
            state = await readiness(pool)
            counts = (sum(1 for r in state.replicas if r.ready), len(state.replicas))
            if counts != shown:
                print(f"stitch: {counts[0]} of {needed} required replicas ready "
                      f"({counts[1]} discovered)", flush=True)
                shown = counts
            if counts[0] >= needed and await _gateway_serves(pool):
                return True
            await asyncio.sleep(interval)
        ready, discovered = shown or (0, 0)
        raise TimeoutError(f"stitch: the pool is not ready after {timeout:.0f}s: {ready} of "
                           f"{needed} required replicas ready ({discovered} discovered); check "
                           "the replicas' /health and /server_info")

    return asyncio.run(wait())


async def _gateway_serves(pool: Pool) -> bool:
    gateway = await _gateway_url(pool)
    if gateway is None:
        return True
    try:
        status, _ = await asyncio.to_thread(_get, f"{gateway.rstrip('/')}/health", 10.0)
    except Exception:  # noqa: BLE001 - an unreachable gateway is not ready yet
        return False
    return status == 200
