"""The original Python Stitch's sidecar launcher, ``python -m stitch.sidecar``
and ``SidecarConfig``, over this project's sidecar: the ``stitch sidecar``
command. A launcher written for the original (building a ``SidecarConfig``
and running ``python -m stitch.sidecar *config.to_argv()``) starts it
unchanged: the module translates the original's flags into the command's
and replaces itself with it (``os.execv``), so the launcher's process is the
sidecar's and its signals and exit status are the sidecar's.

The ``stitch`` executable is found as ``$STITCH_BIN``, else beside this
interpreter (where ``pip install .`` puts it when the package is installed
with a built binary, docs/migrating.md), else on ``PATH``.

Stores: the original named a Python ``store_factory`` with ``store_options``
and a ``bulletin_root``. The original cookbook's factory
(``cookbook.common.storage:create_store``) is understood by ``stitch
sidecar`` itself (``backend=s3`` with ``s3_root`` and ``s3_endpoint_url``;
``backend=local``). Any other factory is called here, as the original called
it, and must return a ``stitch.stores`` store (``FsStore``, ``S3Store``),
whose URI the sidecar then opens. ``store`` (a store URI) is this project's
own, simpler alternative.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# The original cookbook's store factory: `stitch sidecar` reads its options.
ORIGINAL_STORE_FACTORY = "cookbook.common.storage:create_store"

# Keyword arguments the factory always receives; store_options may not set them.
_FACTORY_KWARGS = frozenset({"local_root", "run_id"})


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


@dataclass(frozen=True)
class SidecarConfig:
    """One replica's sidecar settings, with the original's field names.

    Required: ``bulletin_root`` (the store's local root: an S3 store's
    cache directory), ``base_checkpoint_dir``, ``delta_update_mode``
    (``"disk"`` or ``"cpu"``), ``run_id``, and a store: ``store_factory``
    (with ``store_options``) as in the original, or ``store``, a store URI.
    Defaults that differ from the original's, on purpose (docs/migrating.md):
    ``host`` is 127.0.0.1 (give ``"0.0.0.0"`` for other hosts to reach it),
    ``watchdog_interval`` 1 s and ``watchdog_failure_threshold`` 15.
    Pass fields by keyword, as the original requires."""

    host: str = "127.0.0.1"
    port: int = 8000
    upstream: str = "http://127.0.0.1:8001"
    bulletin_root: str = _REQUIRED
    base_checkpoint_dir: str = _REQUIRED
    local_checkpoint_dir: Optional[str] = None
    delta_update_mode: str = _REQUIRED
    disk_load_format: str = "auto"
    store_factory: Optional[str] = None
    store_options: Dict[str, str] = field(default_factory=dict)
    commit_mode: str = "in_place"
    flush_cache_on_commit: bool = False
    run_id: str = _REQUIRED
    boot_version: int = 0
    debug_requests: bool = False
    reconcile_interval: float = 5.0
    watchdog_interval: float = 1.0
    watchdog_failure_threshold: int = 15
    # This project's: the store URI itself, instead of a factory.
    store: Optional[str] = None

    def __post_init__(self) -> None:
        missing = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is _REQUIRED]
        if missing:
            raise TypeError(f"SidecarConfig: missing required fields: {', '.join(missing)}")
        if not self.run_id:
            raise ValueError("run_id is required")
        if self.boot_version < 0:
            raise ValueError("boot_version must be non-negative")
        if self.delta_update_mode not in ("disk", "cpu"):
            raise ValueError(f"delta_update_mode must be 'disk' or 'cpu', got {self.delta_update_mode!r}")
        if self.delta_update_mode == "disk" and not self.local_checkpoint_dir:
            raise ValueError("local_checkpoint_dir is required in disk mode")
        if self.store is None and not self.store_factory:
            raise ValueError("give store_factory (with store_options) or store, a store URI")
        if self.store is not None and self.store_factory:
            raise ValueError("give store_factory or store, not both")
        if self.store_factory and ":" not in self.store_factory:
            raise ValueError("store_factory must be an importable 'package.module:callable' "
                             f"reference, got {self.store_factory!r}")
        reserved = _FACTORY_KWARGS.intersection(self.store_options)
        if reserved:
            raise ValueError(f"store_options may not set {sorted(reserved)}; the factory "
                             "receives local_root and run_id from the launcher itself")

    def to_argv(self) -> List[str]:
        """The ``python -m stitch.sidecar`` flags for this config, in the
        original's spelling; ``from_argv(config.to_argv()) == config``."""
        argv = ["--host", self.host, "--port", str(self.port), "--upstream", self.upstream,
                "--bulletin-root", self.bulletin_root,
                "--base-checkpoint-dir", self.base_checkpoint_dir,
                "--delta-update-mode", self.delta_update_mode,
                "--disk-load-format", self.disk_load_format]
        if self.store_factory:
            argv += ["--store-factory", self.store_factory]
        if self.store is not None:
            argv += ["--store", self.store]
        argv += ["--commit-mode", self.commit_mode, "--run-id", self.run_id,
                 "--boot-version", str(self.boot_version),
                 "--reconcile-interval", str(self.reconcile_interval),
                 "--watchdog-interval", str(self.watchdog_interval),
                 "--watchdog-failure-threshold", str(self.watchdog_failure_threshold)]
        for key, value in self.store_options.items():
            argv += ["--store-opt", f"{key}={value}"]
        if self.local_checkpoint_dir is not None:
            argv += ["--local-checkpoint-dir", self.local_checkpoint_dir]
        if self.flush_cache_on_commit:
            argv.append("--flush-cache-on-commit")
        if self.debug_requests:
            argv.append("--debug-requests")
        return argv

    @classmethod
    def from_argv(cls, argv: Optional[List[str]] = None) -> "SidecarConfig":
        """Parses ``python -m stitch.sidecar`` flags (the original's)."""
        parser = _parser()
        args = parser.parse_args(argv)
        if args.store_factory is None and args.store is None:
            parser.error("give --store-factory (with --store-opt) or --store URI")
        if args.delta_update_mode == "disk" and not args.local_checkpoint_dir:
            parser.error("--local-checkpoint-dir is required in disk mode")
        options: Dict[str, str] = {}
        for option in args.store_opt:
            key, sep, value = option.partition("=")
            if not sep or not key:
                parser.error(f"--store-opt expects KEY=VALUE, got {option!r}")
            if key in options:
                parser.error(f"--store-opt {key!r} given more than once")
            options[key] = value
        return cls(host=args.host, port=args.port, upstream=args.upstream,
                   bulletin_root=args.bulletin_root, base_checkpoint_dir=args.base_checkpoint_dir,
                   local_checkpoint_dir=args.local_checkpoint_dir,
                   delta_update_mode=args.delta_update_mode,
                   disk_load_format=args.disk_load_format, store_factory=args.store_factory,
                   store_options=options, commit_mode=args.commit_mode,
                   flush_cache_on_commit=args.flush_cache_on_commit, run_id=args.run_id,
                   boot_version=args.boot_version, debug_requests=args.debug_requests,
                   reconcile_interval=args.reconcile_interval,
                   watchdog_interval=args.watchdog_interval,
                   watchdog_failure_threshold=args.watchdog_failure_threshold, store=args.store)


def _parser() -> argparse.ArgumentParser:
    defaults = SidecarConfig.__dataclass_fields__
    p = argparse.ArgumentParser(
        prog="python -m stitch.sidecar",
        description="The original Stitch's sidecar launcher: runs `stitch sidecar` with these "
                    "settings")
    p.add_argument("--host", default=defaults["host"].default)
    p.add_argument("--port", type=int, default=defaults["port"].default)
    p.add_argument("--upstream", default=defaults["upstream"].default)
    p.add_argument("--bulletin-root", required=True)
    p.add_argument("--base-checkpoint-dir", required=True)
    p.add_argument("--delta-update-mode", choices=["disk", "cpu"], required=True)
    p.add_argument("--disk-load-format", default="auto")
    p.add_argument("--store-factory", metavar="MODULE:CALLABLE")
    p.add_argument("--store-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a keyword argument for the store factory; repeatable")
    p.add_argument("--store", metavar="URI", help="the store URI, instead of a factory")
    p.add_argument("--commit-mode", choices=["in_place", "quiesce"], default="in_place")
    p.add_argument("--run-id", required=True)
    p.add_argument("--boot-version", type=int, default=0)
    p.add_argument("--reconcile-interval", type=float, default=5.0)
    p.add_argument("--watchdog-interval", type=float,
                   default=defaults["watchdog_interval"].default)
    p.add_argument("--watchdog-failure-threshold", type=int,
                   default=defaults["watchdog_failure_threshold"].default)
    p.add_argument("--local-checkpoint-dir")
    p.add_argument("--flush-cache-on-commit", action="store_true")
    p.add_argument("--debug-requests", action="store_true")
    return p


def find_stitch_binary() -> str:
    """The ``stitch`` executable: ``$STITCH_BIN``, else the one installed
    beside this interpreter, else ``stitch`` on ``PATH``. Raises
    FileNotFoundError saying how to get one."""
    explicit = os.environ.get("STITCH_BIN")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise FileNotFoundError(f"stitch.sidecar: STITCH_BIN={explicit} is not an executable file; "
                                "point it at a built `stitch` (build/src/stitch/cli/stitch after "
                                "`make build`)")
    for candidate in (os.path.join(sysconfig.get_path("scripts"), "stitch"),
                      os.path.join(os.path.dirname(sys.executable), "stitch"),
                      shutil.which("stitch")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "stitch.sidecar: the `stitch` executable was not found (not in $STITCH_BIN, beside "
        f"{sys.executable} or on PATH): build it with `make build` and set "
        "STITCH_BIN=<repo>/build/src/stitch/cli/stitch, or install this package with it: "
        "`make python-install` after `make build` (or `pip install . -C "
        "cmake.define.STITCH_BINARY=<repo>/build/src/stitch/cli/stitch`)")


def _store_flags(config: SidecarConfig) -> List[str]:
    if config.store is not None:
        return ["--store", config.store, "--cache-dir", config.bulletin_root]
    if config.store_factory == ORIGINAL_STORE_FACTORY:
        flags = ["--store-factory", config.store_factory, "--bulletin-root", config.bulletin_root]
        for key, value in config.store_options.items():
            flags += ["--store-opt", f"{key}={value}"]
        return flags
    # Another factory: called as the original called it; it must build one
    # of this package's stores, which the sidecar then opens by its URI.
    store = _load_factory(config.store_factory)(
        local_root=config.bulletin_root, run_id=config.run_id, **config.store_options)
    from stitch.stores.base import Store

    if not isinstance(store, Store):
        raise TypeError(f"store factory {config.store_factory!r} returned "
                        f"{type(store).__name__}, not a stitch.stores store (FsStore or S3Store); "
                        "give the store's URI as --store instead")
    return ["--store", store.uri, "--cache-dir", config.bulletin_root]


def _load_factory(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attribute, None)
    if factory is None or not callable(factory):
        raise ImportError(f"store factory {spec!r}: module {module_name!r} has no callable "
                          f"{attribute!r}")
    return factory


def sidecar_argv(config: SidecarConfig, binary: str = "stitch") -> List[str]:
    """The ``stitch sidecar`` command line that runs ``config``."""
    argv = [binary, "sidecar", *_store_flags(config),
            "--run-id", config.run_id, "--boot-version", str(config.boot_version),
            "--engine-url", config.upstream, "--base-checkpoint", config.base_checkpoint_dir,
            "--update-mode", config.delta_update_mode,
            "--disk-load-format", config.disk_load_format, "--commit-mode", config.commit_mode,
            "--reconcile-interval", str(config.reconcile_interval),
            "--watchdog-interval", str(config.watchdog_interval),
            "--watchdog-threshold", str(config.watchdog_failure_threshold),
            "--host", config.host, "--port", str(config.port)]
    if config.local_checkpoint_dir is not None:
        argv += ["--local-checkpoint", config.local_checkpoint_dir]
    if config.flush_cache_on_commit:
        argv.append("--flush-cache-on-commit")
    if config.debug_requests:
        argv.append("--debug-requests")
    return argv


def run(config: SidecarConfig) -> None:
    """Replaces this process with ``stitch sidecar`` running ``config``;
    returns only by raising (no binary, a store factory that fails)."""
    binary = find_stitch_binary()
    argv = sidecar_argv(config, binary)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, argv)


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m stitch.sidecar``: parse the original's flags and run the sidecar."""
    config = SidecarConfig.from_argv(argv)
    try:
        run(config)
    except (FileNotFoundError, ImportError, TypeError) as error:
        print(error if str(error).startswith("stitch") else f"stitch.sidecar: {error}",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
