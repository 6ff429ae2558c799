"""Stitch's vLLM worker extension: in-place weight patches.

Start vLLM with ``--worker-extension-cls stitch_vllm.WeightPatchExtension``
(this package must be importable by vLLM's workers) and the Stitch sidecar
(``--engine vllm --patch-commits``) brings the engine from one version to the
next by patching only the values that changed, through vLLM's
``/collective_rpc`` route:

``stitch_patch_stage(path)``
    While the engine serves: reads a patch file (written by the sidecar,
    format in ``src/stitch/delta/weight_patch.h``) into the device's memory,
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

import json
import time
from typing import Any, Dict, List, Optional

import torch

PATCH_FORMAT = "stitch-weight-patch/1"
METADATA_KEY = "stitch_patch"

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# What stitch_patch_apply(verify=...) accepts: the sidecar's --patch-verify.
VERIFY = ("checksums", "values")


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


class PatchError(Exception):
    """A patch that cannot be applied to the weights this engine holds."""


class _Slot:
    """One checkpoint tensor's patch, placed inside a vLLM parameter."""

    def __init__(self, name: str, flat: torch.Tensor, idx, xor, new, checksum: str):
        self.name = name
        self.flat = flat  # the integer view of the parameter's slice, flattened
        self.idx = idx
        self.new = new
        self.old = torch.bitwise_xor(new, xor)
        self.checksum = checksum


def _packed_mapping(model) -> Dict[str, List[str]]:
    mapping = getattr(model, "packed_modules_mapping", None) or {}
    return {k: list(v) for k, v in mapping.items()}


def _place(model, params: Dict[str, torch.nn.Parameter], name: str, shape: List[int],
           shapes: Dict[str, List[int]]) -> torch.Tensor:
    """The slice of vLLM's parameters that holds checkpoint tensor `name`."""
    pname, offset = name, 0
    for fused, parts in _packed_mapping(model).items():
        for i, part in enumerate(parts):
            needle = "." + part + "."
            if needle not in name:
                continue
            pname = name.replace(needle, "." + fused + ".")
            for earlier in parts[:i]:
                sibling = name.replace(needle, "." + earlier + ".")
                if sibling not in shapes:
                    raise PatchError(f"{name}: the checkpoint has no {sibling} to place it after")
                offset += shapes[sibling][0]
            break
        if pname != name:
            break
    param = params.get(pname)
    if param is None:
        raise PatchError(f"{name}: the engine has no parameter {pname} to patch")
    data = param.data
    if list(data.shape[1:]) != list(shape[1:]) or offset + shape[0] > data.shape[0]:
        raise PatchError(
            f"{name} {shape} does not fit {pname} {list(data.shape)} at row {offset}")
    if not data.is_contiguous():
        raise PatchError(f"{pname} is not contiguous")
    return data.narrow(0, offset, shape[0]) if shape else data


def _xxh3_128_hex(view: torch.Tensor) -> str:
    import xxhash

    host = view.detach().contiguous()
    if host.device.type != "cpu":
        host = host.cpu()
    return xxhash.xxh3_128_hexdigest(host.view(torch.uint8).numpy())


class WeightPatchExtension:
    """Mixed into vLLM's worker class by --worker-extension-cls."""

    def _stitch_state(self) -> Dict[str, Any]:
        state = getattr(self, "_stitch_patch_state", None)
        if state is None:
            state = {"staged": None, "fail_after": None}
            self._stitch_patch_state = state
        return state

    def stitch_patch_stage(self, path: str) -> Dict[str, Any]:
        from safetensors import safe_open

        start = time.monotonic()
        state = self._stitch_state()
        state["staged"] = None
        if _tensor_parallel_size() != 1:
            raise PatchError("patches place unsharded tensors: tensor parallelism must be 1")
        model = self.model_runner.model
        params = dict(model.named_parameters())
        device = next(iter(params.values())).device
        slots: List[_Slot] = []
        with safe_open(path, framework="pt", device=str(device)) as f:
            meta_text = (f.metadata() or {}).get(METADATA_KEY)
            if meta_text is None:
                raise PatchError(f"{path} is not a Stitch weight patch")
            meta = json.loads(meta_text)
            if meta.get("format") != PATCH_FORMAT:
                raise PatchError(f"{path}: unknown patch format {meta.get('format')!r}")
            shapes = meta["shapes"]
            for name, info in sorted(meta["tensors"].items()):
                region = _place(model, params, name, info["shape"], shapes)
                width = region.element_size()
                if str(region.dtype).replace("torch.", "") != _torch_dtype_name(info["dtype"]):
                    raise PatchError(
                        f"{name}: the engine holds {region.dtype}, the patch {info['dtype']}")
                flat = region.view(_BITS[width]).reshape(-1)
                slot = _Slot(name, flat, f.get_tensor(name + "::idx"),
                             f.get_tensor(name + "::xor"), f.get_tensor(name + "::new"),
                             info["checksum"])
                if not torch.equal(torch.take(flat, slot.idx), slot.old):
                    raise PatchError(
                        f"{name}: the engine does not hold {meta['from']}'s values there")
                slots.append(slot)
        state["staged"] = {"from": meta["from"], "to": meta["to"], "slots": slots}
        return {"staged": meta["to"], "tensors": len(slots),
                "values": int(sum(s.idx.numel() for s in slots)),
                "threads": torch.get_num_threads(), "seconds": time.monotonic() - start}

    def stitch_patch_apply(self, verify: str = "checksums") -> Dict[str, Any]:
        # Any other word would skip the checksums as silently as "values":
        # refused before the staged patch or a weight is touched.
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {', '.join(map(repr, VERIFY))}, "
                             f"not {verify!r}: nothing was patched")
        start = time.monotonic()
        state = self._stitch_state()
        staged = state["staged"]
        if staged is None:
            return {"applied": False, "undone": True, "error": "no patch is staged"}
        state["staged"] = None
        # Only FaultInjectingExtension arms a fault.
        fail_after, state["fail_after"] = state["fail_after"], None
        done: List[_Slot] = []
        try:
            for slot in staged["slots"]:
                if fail_after is not None and len(done) >= fail_after:
                    raise PatchError(f"a fault armed to fail after {fail_after} tensors")
                if not torch.equal(torch.take(slot.flat, slot.idx), slot.old):
                    raise PatchError(f"{slot.name}: the values to patch changed since staging")
                done.append(slot)
                slot.flat.put_(slot.idx, slot.new)
            if verify == "checksums":
                for slot in staged["slots"]:
                    got = _xxh3_128_hex(slot.flat)
                    if got != slot.checksum:
                        raise PatchError(f"{slot.name}: xxh3-128 {got} after patching, "
                                         f"the version records {slot.checksum}")
        except Exception as e:  # noqa: BLE001: whatever failed, the old version is restored
            for slot in reversed(done):
                slot.flat.put_(slot.idx, slot.old)
            for slot in done:
                if not torch.equal(torch.take(slot.flat, slot.idx), slot.old):
                    raise RuntimeError(f"undoing the patch to {staged['to']} failed at "
                                       f"{slot.name}: the weights are neither version") from e
            return {"applied": False, "undone": True, "error": str(e), "from": staged["from"],
                    "seconds": time.monotonic() - start}
        return {"applied": True, "to": staged["to"], "tensors": len(staged["slots"]),
                "verified": verify, "seconds": time.monotonic() - start}

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


def _tensor_parallel_size() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_world_size()
    except ImportError:  # not in vLLM
        return 1
    except AssertionError:  # vLLM without a parallel group: one process
        return 1


def _torch_dtype_name(safetensors_dtype: str) -> str:
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
            "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32",
            "I64": "int64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
            "F8_E5M2": "float8_e5m2"}.get(safetensors_dtype, safetensors_dtype)
