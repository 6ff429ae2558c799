"""What the framework hooks share: settings from the trainer's argument
namespace, the claim and publish calls, and the rollout request gate."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import os
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import stitch
from stitch.errors import InvalidArgument

# (flag, type, default, help); dest is the flag without "--", "-" -> "_".
_FLAGS = (
    ("--stitch-store", str, None,
     "Stitch store the trainer publishes into: a path, file:///abs/path or "
     "s3://bucket/prefix?endpoint=URL&region=R."),
    ("--stitch-run-id", str, None, "The run (epoch token) the store is scoped to."),
    ("--stitch-pool", str, None,
     "Replica pool to wake after each publish: static:URL,URL,..., file:PATH or dns:NAME:PORT."),
    ("--stitch-cache-dir", str, None, "Where remote (s3:) stores materialize versions."),
    ("--stitch-boot-version", int, 0, "The version the engines boot from (0: a fresh run)."),
    ("--stitch-lag", int, 1,
     "Rollout requests accept the latest published version minus this many, or newer."),
    ("--stitch-exact-version", int, None,
     "Pin every rollout request to this version (overrides --stitch-lag)."),
    ("--stitch-affinity-header", str, "X-Session-Id",
     "Header carrying the session id (the sample's group) to the Stitch gateway."),
    ("--stitch-pointer-ttl", float, 1.0,
     "Seconds the rollout side caches the store's pointer between reads."),
    ("--stitch-multihost", "store_true", False,
     "Every trainer rank publishes its host's files (the multi-host upload-and-verify "
     "protocol over torch.distributed); default: global rank 0 publishes the directory."),
)


def add_arguments(parser: Any) -> Any:
    """Adds the ``--stitch-*`` flags to an argparse parser (slime's and miles'
    ``parse_args(add_custom_arguments=...)`` calls it with theirs) and
    returns it."""
    group = parser.add_argument_group("stitch") if hasattr(parser, "add_argument_group") else parser
    for flag, kind, default, text in _FLAGS:
        if kind == "store_true":
            group.add_argument(flag, action="store_true", default=default, help=text)
        else:
            group.add_argument(flag, type=kind, default=default, help=text)
    return parser


@dataclasses.dataclass(frozen=True)
class Settings:
    """The ``--stitch-*`` settings of one trainer."""

    store: str
    run_id: str
    pool: Optional[str] = None
    cache_dir: Optional[str] = None
    boot_version: int = 0
    lag: int = 1
    exact_version: Optional[int] = None
    affinity_header: Optional[str] = "X-Session-Id"
    pointer_ttl: float = 1.0
    multihost: bool = False


def settings(args: Any) -> Settings:
    """Reads the ``stitch_*`` attributes of a trainer's namespace (unset
    ones take the flag defaults). Raises InvalidArgument without a store or
    run id."""
    values: Dict[str, Any] = {}
    for flag, _, default, _ in _FLAGS:
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest, None)
        values[dest[len("stitch_"):]] = default if value is None else value
    if not values["store"] or not values["run_id"]:
        raise InvalidArgument(
            "stitch: the trainer's arguments name no Stitch store; set --stitch-store and "
            "--stitch-run-id (stitch.integrations.add_arguments adds them)", "INVALID_ARGUMENT")
    return Settings(**values)


_lock = threading.Lock()
_stores: Dict[Tuple[str, str, Optional[str]], stitch.Store] = {}
_gates: Dict[Settings, "RequestGate"] = {}


def _store(s: Settings) -> stitch.Store:
    key = (s.store, s.run_id, s.cache_dir)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = stitch.open_store(s.store, s.run_id, cache_dir=s.cache_dir)
        return store


def reset() -> None:
    """Forgets the stores and gates opened so far (tests; a new run)."""
    with _lock:
        _stores.clear()
        _gates.clear()


def _rank(args: Any) -> int:
    """The global rank: Megatron's ``args.rank``, else torch.distributed's,
    else $RANK, else 0."""
    rank = getattr(args, "rank", None)
    if rank is not None:
        return int(rank)
    try:
        import torch.distributed as dist  # noqa: PLC0415 - torch is optional
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0"))


def claim(args: Any) -> Optional[stitch.ClaimOutcome]:
    """Claims the run at ``--stitch-boot-version`` and wakes the pool (call it
    once at launch, before the first rollout). Only global rank 0 acts; the
    others return None."""
    if _rank(args) != 0:
        return None
    s = settings(args)
    return stitch.claim_run(_store(s), s.run_id, s.boot_version, s.pool)


def publish_update(args: Any, version_dir: str,
                   comms: Optional[stitch.TrainerComms] = None) -> Optional[stitch.VersionRef]:
    """Publishes a version directory the framework wrote (``weight_vNNNNNN``,
    FULL or DELTA in the Stitch/SGLang delta format), moves the pointer and
    wakes the pool.

    Without ``--stitch-multihost`` only global rank 0 publishes (the
    directory is on a filesystem rank 0 sees whole); other ranks return None.
    With it every rank must call this: each host leader uploads the files of
    its own directory and rank 0 moves the pointer once the receipts cover
    the version (``comms``: default a TorchDistributedComms on the world)."""
    s = settings(args)
    if s.multihost:
        if comms is None:
            from stitch.integrations.torch_comms import TorchDistributedComms  # noqa: PLC0415
            comms = TorchDistributedComms()
        return stitch.Publisher(_store(s), pool=s.pool, comms=comms).publish(os.fspath(version_dir))
    if _rank(args) != 0:
        return None
    return stitch.publish_version(_store(s), os.fspath(version_dir), s.run_id, s.pool)


class RequestGate:
    """Constrains rollout requests to the store's pointer: ``latest - lag``
    or newer, or ``exact``. The pointer is re-read at most every
    ``pointer_ttl`` seconds; until a version of this run is published no
    min-version constraint is added."""

    def __init__(self, store: stitch.Store, lag: int = 1, exact: Optional[int] = None,
                 affinity_header: Optional[str] = "X-Session-Id", pointer_ttl: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.lag = int(lag)
        self.exact = exact
        self.affinity_header = affinity_header
        self.pointer_ttl = float(pointer_ttl)
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: Optional[int] = None
        self._read_at: Optional[float] = None

    def latest(self) -> Optional[int]:
        """The version the pointer names, if it is of this store's run."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.pointer_ttl:
                self.store.refresh()
                pointer = self.store.read_pointer()
                self._latest = (pointer.version if pointer is not None
                                and pointer.run_id == self.store.run_id else None)
                self._read_at = now
            return self._latest

    def constrain(self, payload: Mapping[str, Any], headers: Optional[Mapping[str, str]] = None,
                  session_id: Optional[str] = None,
                  exact: Optional[int] = None) -> Tuple[dict, dict]:
        """The constrained copies of a request's JSON payload and headers."""
        exact = exact if exact is not None else self.exact
        latest = None if exact is not None else self.latest()
        return stitch.constrain_request(payload, dict(headers or {}), latest=latest, lag=self.lag,
                                        exact=exact, session_id=session_id,
                                        affinity_header=self.affinity_header)


def gate(args: Any) -> RequestGate:
    """The RequestGate for a trainer's settings (one per process)."""
    s = settings(args)
    with _lock:
        g = _gates.get(s)
    if g is None:
        g = RequestGate(_store(s), s.lag, s.exact_version, s.affinity_header, s.pointer_ttl)
        with _lock:
            g = _gates.setdefault(s, g)
    return g


def sample_session(sample: Any) -> Optional[str]:
    """The affinity key of a rollout sample: its group (samples of one prompt
    share a replica's prefix cache), else its own session id."""
    group = getattr(sample, "group_index", None)
    if group is not None:
        return f"group-{group}"
    session = getattr(sample, "session_id", None)
    return None if session is None else str(session)


def sample_exact_version(sample: Any) -> Optional[int]:
    """A per-sample pin: ``sample.metadata["stitch_version"]`` when set."""
    metadata = getattr(sample, "metadata", None)
    if isinstance(metadata, Mapping) and metadata.get("stitch_version") is not None:
        return int(metadata["stitch_version"])
    return None


def constrain_payload(args: Any, payload: Mapping[str, Any],
                      headers: Optional[Mapping[str, str]] = None, sample: Any = None,
                      session_id: Optional[str] = None,
                      exact_version: Optional[int] = None) -> Tuple[dict, dict]:
    """Gates one rollout request (an SGLang /generate JSON body): returns the
    payload with its version constraint and the headers with the session's
    affinity. ``sample`` supplies the session (its group) and an optional
    per-sample pin; call this from a custom generate function just before
    posting."""
    if sample is not None:
        session_id = session_id if session_id is not None else sample_session(sample)
        exact_version = exact_version if exact_version is not None else sample_exact_version(sample)
    return gate(args).constrain(payload, headers, session_id=session_id, exact=exact_version)


def post_write_hook(args: Any, version_dir: str, rollout_engines: Any = None) -> None:
    """``--custom-update-weight-post-write-path``: publishes the version the
    framework just wrote and wakes the Stitch pool. Gates itself: global rank
    0 publishes, or every rank with ``--stitch-multihost``. The engines the
    framework manages itself (``rollout_engines``) are left to it."""
    del rollout_engines
    publish_update(args, version_dir)


def constrain_sample_request(args: Any, sample: Any, payload: Mapping[str, Any],
                             headers: Optional[Mapping[str, str]] = None) -> Tuple[dict, dict]:
    """For a custom generate function: the payload constrained to
    ``latest - --stitch-lag`` (or the pinned version) and the headers with
    the sample's group as the session, ready for the framework's ``post``."""
    return constrain_payload(args, payload, headers, sample=sample)


# The (args, sample) of the generate call running in the current asyncio
# task, read by the wrapped `post` of the framework's generate module.
_current: contextvars.ContextVar[Optional[Tuple[Any, Any]]] = contextvars.ContextVar(
    "stitch_rollout_sample", default=None)


def _wrap_post(module: Any) -> None:
    """Replaces ``module.post`` (once) by one that gates the request when
    called inside :func:`gated`; outside it behaves as the original."""
    original = module.post
    if getattr(original, "__stitch_gated__", False):
        return

    @functools.wraps(original)
    async def post(url: str, payload: Any = None, *rest: Any, **kwargs: Any) -> Any:
        current = _current.get()
        if current is not None and isinstance(payload, Mapping):
            args, sample = current
            payload, headers = constrain_payload(args, payload, kwargs.get("headers"), sample=sample)
            if headers:
                kwargs["headers"] = headers
        return await original(url, payload, *rest, **kwargs)

    post.__stitch_gated__ = True  # type: ignore[attr-defined]
    module.post = post


async def gated(module: Any, fn: Callable[..., Any], args: Any, sample: Any, *call: Any,
                **kwargs: Any) -> Any:
    """Runs the framework's generate function ``fn(*call, **kwargs)`` with
    every ``module.post`` it makes gated for ``sample``."""
    _wrap_post(module)
    token = _current.set((args, sample))
    try:
        return await fn(*call, **kwargs)
    finally:
        _current.reset(token)


async def gated_generate(module_name: str, args: Any, sample: Any, *call: Any) -> Any:
    """Runs ``generate(*call)`` of the framework's module ``module_name``
    (imported now) with its requests to the router gated for ``sample``."""
    module = importlib.import_module(module_name)
    return await gated(module, module.generate, args, sample, *call)
