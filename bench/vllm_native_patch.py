"""For activation_bench.py only: Stitch's vLLM worker extension plus vLLM's
own sparse weight patches (``load_checkpoint_weight_patches``, vLLM 0.32),
so that the benchmark times both on the same engine, the same patch and the
same pause.

vLLM feeds its sparse patches from its NCCL weight-transfer engine; here the
same (name, indices, new values) come from Stitch's patch file, read outside
the pause as Stitch's own staging is. Nothing here checks old values or
checksums, or undoes a failed load: that is vLLM's function as it is.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict

import torch

import stitch_patch
from stitch_vllm import WeightPatchExtension


class NativePatchBenchExtension(WeightPatchExtension):
    """WeightPatchExtension with vLLM's own sparse patches beside it."""

    def native_patch_stage(self, path: str) -> Dict[str, Any]:
        from safetensors import safe_open
        from vllm.model_executor.model_loader.checkpoint_weight_patch import (
            CheckpointWeightPatch,
        )

        start = time.monotonic()
        device = next(self.model_runner.model.parameters()).device
        patches = []
        with safe_open(path, framework="pt", device=str(device)) as f:
            meta = json.loads(f.metadata()[stitch_patch.METADATA_KEY])
            for name, info in sorted(meta["tensors"].items()):
                dtype = getattr(torch, stitch_patch._torch_dtype_name(info["dtype"]))
                patches.append(CheckpointWeightPatch(
                    name=name, shape=tuple(info["shape"]), dtype=dtype,
                    values=f.get_tensor(name + "::new").view(dtype),
                    indices=f.get_tensor(name + "::idx")))
        self._native_patches = patches
        return {"tensors": len(patches), "seconds": time.monotonic() - start}

    def native_patch_apply(self) -> Dict[str, Any]:
        from vllm.model_executor.model_loader.checkpoint_weight_patch import (
            load_checkpoint_weight_patches,
        )

        patches, self._native_patches = self._native_patches, None
        start = time.monotonic()
        loaded = load_checkpoint_weight_patches(self.model_runner.model, patches)
        return {"loaded": len(loaded), "seconds": time.monotonic() - start}

    def native_patch_check(self, path: str) -> Dict[str, Any]:
        """Whether the engine now holds the patch's new values at every
        changed position (read after the pause, not timed)."""
        staged = stitch_patch.stage(self.model_runner.model, path, check=False)
        wrong = [s.name for s in staged.slots
                 if not torch.equal(torch.take(s.flat, s.idx), s.new)]
        return {"values": staged.values(), "wrong_tensors": wrong}

    def worker_cpus(self) -> Dict[str, Any]:
        """The cores this worker's thread may run on, and torch's threads."""
        return {"cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}
