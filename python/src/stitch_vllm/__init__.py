"""Stitch's vLLM worker extension: in-place weight patches.

Start vLLM with ``--worker-extension-cls stitch_vllm.WeightPatchExtension``
(this package must be importable by vLLM's workers) and the Stitch sidecar
(``--engine vllm --patch-commits``) brings the engine from one version to the
next by patching only the values that changed, through vLLM's
``/collective_rpc`` route:

``stitch_patch_stage(path)``
    While the engine serves: reads a patch file (written by the sidecar,
    format in ``src/stitch/delta/weight_patch.h``; the engine-independent
    work is ``stitch_patch``'s) into the device's memory,
    places every checkpoint tensor it changes inside vLLM's parameters (q/k/v
    rows inside ``qkv_proj``, gate/up rows inside ``gate_up_proj``) and
    checks that the values there are the old version's.
``stitch_patch_apply(verify="checksums")``
    While the engine is paused: checks again that the values to change are
    the old version's, writes the new values in place, and
    (``verify="checksums"``) hashes every patched tensor in the engine and
    compares it with the version's recorded xxh3-128 (``verify="values"``
    stops after the writes). Nothing is read from disk. On any failure every
    value already written is restored (XOR is its own inverse) and read back,
    and the answer says so: the old version keeps serving. Only a failure to
    restore raises; so does a ``verify`` other than ``"checksums"`` and
    ``"values"`` (``ValueError``), refused before anything is touched, the
    staged patch included.
``stitch_patch_discard()``
    Drops what was staged.

On CPU, vLLM repacks linear weights into its GEMM kernels' layouts after
loading and frees the originals, so a patch of the parameters would not reach
the matrix products. Looking the extension up by name (which vLLM does in
every worker before the model loads, for ``--worker-extension-cls``) keeps CPU
linear layers on ``torch.nn.functional.linear`` over their parameters instead;
importing this module changes nothing in vLLM. On CUDA nothing changes: vLLM
multiplies by the parameters themselves.

``stitch_vllm.FaultInjectingExtension`` is the same extension with
``stitch_patch_arm_fault(after_tensors)``, which makes the next apply fail
after patching that many tensors. Only tests name it: the class a production
vLLM is started with has no method that makes a patch fail.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import torch

import stitch_patch
from stitch_patch import PatchError, VERIFY  # noqa: F401: part of this module's API


def _keep_cpu_weights_patchable() -> None:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # looked up outside vLLM (tests, docs)
        return
    if not current_platform.is_cpu():
        return
    import vllm.model_executor.layers.utils as layer_utils

    def plain_gemm(layer, remove_weight):  # noqa: ARG001: vLLM's signature
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = plain_gemm


class WeightPatchExtension:
    """Mixed into vLLM's worker class by --worker-extension-cls."""

    def _stitch_state(self) -> Dict[str, Any]:
        state = getattr(self, "_stitch_patch_state", None)
        if state is None:
            state = {"staged": None, "fail_after": None}
            self._stitch_patch_state = state
        return state

    def stitch_patch_stage(self, path: str) -> Dict[str, Any]:
        start = time.monotonic()
        state = self._stitch_state()
        state["staged"] = None
        stitch_patch.require_unsharded("vllm.distributed")
        staged = stitch_patch.stage(self.model_runner.model, path)
        state["staged"] = staged
        return {"staged": staged.target, "tensors": len(staged.slots), "values": staged.values(),
                "threads": torch.get_num_threads(), "seconds": time.monotonic() - start}

    def stitch_patch_apply(self, verify: str = "checksums") -> Dict[str, Any]:
        stitch_patch.check_verify(verify)
        state = self._stitch_state()
        staged = state["staged"]
        if staged is None:
            return {"applied": False, "undone": True, "error": "no patch is staged"}
        state["staged"] = None
        # Only FaultInjectingExtension arms a fault.
        fail_after, state["fail_after"] = state["fail_after"], None
        return stitch_patch.apply(staged, verify, fail_after)

    def stitch_patch_discard(self) -> None:
        self._stitch_state()["staged"] = None


class FaultInjectingExtension(WeightPatchExtension):
    """WeightPatchExtension that tests can make fail part-way. A separate
    class named at vLLM's start, rather than a method of the extension or a
    switch, so that no /collective_rpc call (vLLM's own
    update_environment_variables included) can arm a fault in a production
    engine."""

    def stitch_patch_arm_fault(self, after_tensors: int) -> None:
        """The next apply fails after patching this many tensors."""
        self._stitch_state()["fail_after"] = int(after_tensors)


# The extensions' names are taken off the module, so that vLLM's look-up by
# name (resolve_obj_by_qualname in init_worker, in every worker before the
# model loads) goes through __getattr__ below: that look-up installs what the
# extension needs in vLLM, and a bare import changes nothing there.
_EXTENSIONS = {cls.__name__: cls for cls in (WeightPatchExtension, FaultInjectingExtension)}
del WeightPatchExtension, FaultInjectingExtension


def __getattr__(name: str):
    extension = _EXTENSIONS.get(name)
    if extension is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _keep_cpu_weights_patchable()
    return extension
