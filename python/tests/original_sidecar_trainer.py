"""A trainer written against the original Python Stitch's API, publishing
for a live sidecar (test_original_sidecar.py runs it as a script, unchanged):
it claims its run, waits for the pool, then writes one FULL version the way
a framework does (the engine's tensors, changed, as model.safetensors with an
index whose metadata.version names it, and the model's config) and
publishes it. Prints one JSON line.

    original_sidecar_trainer.py STORE_ROOT WORKDIR BASE_MODEL_DIR REPLICA_URL
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import urllib.request

from safetensors.numpy import load_file, save_file

from stitch.pools.base import Pool
from stitch.publish import claim_run, publish_version
from stitch.service import await_pool_ready
from stitch.stores import FsStore
from stitch.types import WEIGHT_PREFIX, VersionRef

RUN = "run-orig"


class LocalPool(Pool):
    def __init__(self, url: str) -> None:
        self.url = url

    def gateway_url(self) -> str | None:
        return None

    def discover_replicas(self) -> list[str]:
        return [self.url]

    def wake(self, replicas: list[str], ref: VersionRef) -> None:
        for replica in replicas:
            request = urllib.request.Request(f"{replica}/wake", data=b"{}", method="POST")
            urllib.request.urlopen(request, timeout=5).close()


def write_version(run_dir: str, base_dir: str, version: int) -> str:
    name = f"{WEIGHT_PREFIX}{version:06d}"
    out = os.path.join(run_dir, name)
    os.makedirs(out, exist_ok=True)
    weights = {}
    for shard in sorted(glob.glob(os.path.join(base_dir, "*.safetensors"))):
        weights.update(load_file(shard))
    weights = {k: (v * (1 + version / 100)).astype(v.dtype) for k, v in weights.items()}
    save_file(weights, os.path.join(out, "model.safetensors"))
    index = {"metadata": {"version": f"{version:06d}"},
             "weight_map": {k: "model.safetensors" for k in weights}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    shutil.copy(os.path.join(base_dir, "config.json"), os.path.join(out, "config.json"))
    return out


def main(argv: list[str]) -> int:
    root, workdir, base_dir, replica = argv[:4]
    store = FsStore(root, run_id=RUN)
    pool = LocalPool(replica)
    claim_run(store, pool, RUN, boot_version=0)
    assert await_pool_ready(pool, replica_floor=1, interval=0.2, timeout=120)
    ref = publish_version(store, pool, write_version(os.path.join(workdir, "run"), base_dir, 1),
                          run_id=RUN)
    print(json.dumps({"published": ref.identity, "pointer": store.read_pointer().identity}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
