"""A sidecar launcher written the way the original Python Stitch's cookbook
starts one beside its engine (cookbook/common/process.py, start_sidecar): a
``stitch.sidecar.SidecarConfig``, then ``python -m stitch.sidecar`` with
``config.to_argv()`` in a session of its own. test_original_sidecar.py uses
it unchanged against this project.

``store_factory`` is the original cookbook's (``cookbook.common.storage:
create_store``, with ``backend=s3``...) or this directory's
``original_stores:create_store`` (a factory returning an ``FsStore``).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from stitch.sidecar import SidecarConfig

SIDECAR_MODULE = "stitch.sidecar"


def start_sidecar(*, sidecar_port: int, upstream: str, bulletin_root: str,
                  base_checkpoint_dir: str, local_checkpoint_dir: str | None,
                  delta_update_mode: str, store_factory: str, store_options: dict[str, str],
                  run_id: str, boot_version: int = 0, commit_mode: str = "in_place",
                  flush_cache_on_commit: bool = False, debug_requests: bool = False,
                  env: dict[str, str] | None = None, stderr: Any = None) -> subprocess.Popen:
    config = SidecarConfig(
        host="127.0.0.1",
        port=sidecar_port,
        upstream=upstream,
        bulletin_root=bulletin_root,
        base_checkpoint_dir=base_checkpoint_dir,
        local_checkpoint_dir=local_checkpoint_dir,
        delta_update_mode=delta_update_mode,
        disk_load_format="auto",
        store_factory=store_factory,
        store_options=store_options,
        commit_mode=commit_mode,
        flush_cache_on_commit=flush_cache_on_commit,
        run_id=run_id,
        boot_version=boot_version,
        debug_requests=debug_requests,
    )
    cmd = [sys.executable, "-m", SIDECAR_MODULE, *config.to_argv()]
    return subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env=env)
