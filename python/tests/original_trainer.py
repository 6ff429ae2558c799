"""A trainer written against the original Python Stitch's API (its import
paths, signatures and hook shapes), with its Modal classes swapped for
Stitch's: ``ModalVolumeStore`` -> ``FsStore``, the Modal pool -> a ``Pool``
subclass. test_original_api.py runs it as a script, unchanged.

    original_trainer.py fs ROOT WORKDIR REPLICA_URL
    original_trainer.py s3 ROOT WORKDIR REPLICA_URL ENDPOINT_URL

It claims the run, waits for the pool, then for each step writes a FULL
version the way a framework does (safetensors shard, index with
metadata.version, config and tokenizer files), publishes it through the
publish hook (every rank's run directory too), retries the last publish as
a restarted job would, and constrains rollout requests in place. It prints
one JSON line describing what it saw.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from stitch.errors import UnrecoverableEngineError, UnrecoverableSidecarError
from stitch.pools.base import Pool
from stitch.publish import claim_run, constrain_request, publish_version, wake_pool
from stitch.publisher import Publisher, TrainerComms
from stitch.service import await_pool_ready
from stitch.stores import FsStore
from stitch.stores.base import Store
from stitch.stores.s3 import S3Store
from stitch.types import (
    WEIGHT_PREFIX,
    PointerRewind,
    VersionConstraint,
    VersionRef,
    decide_pointer_move,
)

RUN = "run-orig"
STEPS = 3
SESSION_HEADER = "X-Session-Id"


class _Comms(TrainerComms):
    """The trainer's comms, off the distributed path: the single-process
    defaults, as the original's hooks degrade to."""

    def rank(self) -> int | None:
        return None

    def all_gather_object(self, value: Any) -> list[Any]:
        return [value]

    def is_host_leader(self) -> bool:
        return True


class LocalPool(Pool):
    def __init__(self, url: str) -> None:
        self.url = url

    def gateway_url(self) -> str:
        return self.url

    def discover_replicas(self) -> list[str]:
        return [self.url]

    def wake(self, replicas: list[str], ref: VersionRef) -> None:
        import urllib.request

        for replica in replicas:
            request = urllib.request.Request(f"{replica}/wake", data=b"{}", method="POST")
            urllib.request.urlopen(request, timeout=5).close()


def write_version(run_dir: str, version: int, scale: float) -> str:
    """What a framework's disk sync leaves: weight_vNNNNNN with weights,
    index, config and tokenizer files."""
    name = f"{WEIGHT_PREFIX}{version:06d}"
    out = os.path.join(run_dir, name)
    os.makedirs(out, exist_ok=True)
    weights = {"layers.0.w": np.full((4, 8), scale, np.float32),
               "lm_head": np.arange(8, dtype=np.float32) * scale}
    save_file(weights, os.path.join(out, "model.safetensors"))
    index = {"metadata": {"version": f"{version:06d}"},
             "weight_map": {k: "model.safetensors" for k in weights}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 8}, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 128}, f)
    return out


def main(argv: list[str]) -> int:
    kind, root, workdir, replica = argv[:4]
    store: Store
    if kind == "fs":
        store = FsStore(root, run_id=RUN)
    else:
        store = S3Store(root, cache_dir=os.path.join(workdir, "cache"), run_id=RUN,
                        endpoint_url=argv[4])
    pool = LocalPool(replica)
    publisher = Publisher(store, pool, run_id=RUN, comms=_Comms())

    # Launch: claim the boot checkpoint (twice: a retried launch), wait for the pool.
    publisher.claim(boot_version=0)
    claim_run(store, pool, RUN, boot_version=0)
    assert await_pool_ready(pool, replica_floor=1, interval=0.0, timeout=60)

    run_dir = os.path.join(workdir, "trainer-run")
    seen = []
    for step in range(1, STEPS + 1):
        version_dir = write_version(run_dir, step, float(step))
        if step == 2:
            ref = publish_version(store, pool, version_dir, run_id=RUN)  # the bare helper
            assert ref == VersionRef(RUN, 2)
        else:
            publisher.publish(version_dir)
        publisher.publish(run_dir)  # the framework's run directory: a durability boundary
        latest = store.read_pointer()
        seen.append(latest.identity)

        payload: dict[str, Any] = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
        headers: dict[str, str] = {}
        assert constrain_request(payload, headers, latest=latest.version, lag=1,
                                 session_id=f"group-{step}", affinity_header=SESSION_HEADER) is None
        constraint = VersionConstraint.from_payload(payload)
        assert constraint.satisfied_by(latest.version)
        assert not constraint.satisfied_by(latest.version - 2)
        assert headers[SESSION_HEADER] == f"group-{step}"

    # A restarted job retries its last publish: nothing changes.
    publisher.publish(version_dir)
    wake_pool(pool, store.read_pointer())

    # The pointer rules and error names of the original.
    try:
        decide_pointer_move(store.read_pointer(), VersionRef(RUN, 1))
        rewind = None
    except PointerRewind as error:
        rewind = str(error.proposed)
    assert issubclass(UnrecoverableEngineError, UnrecoverableSidecarError)

    manifest = store.read_manifest(store.read_pointer())
    materialized = store.materialize(store.read_pointer())
    print(json.dumps({
        "seen": seen,
        "pointer": store.read_pointer().identity,
        "kind": manifest.kind.value,
        "files": manifest.files,
        "config": sorted(n for n in os.listdir(materialized) if n.endswith(".json")),
        "rewind": rewind,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
