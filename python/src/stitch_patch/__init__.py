"""In-place weight patches inside an engine's process, whatever the engine.

The sidecar writes a patch file (format in ``src/stitch/delta/weight_patch.h``):
for every checkpoint tensor a version changes, the flat indices of the values
that changed, the XOR of old and new there, the new values, and the tensor's
xxh3-128 after the change. The engine-specific entry points
(``stitch_vllm``, a vLLM worker extension; ``stitch_sglang``, an SGLang custom
weight loader) hand this module the engine's model:

``stage(model, path)``
    Reads the patch into the parameters' device, places every checkpoint
    tensor it changes inside the engine's parameters (q/k/v rows fused in
    ``qkv_proj``, gate/up rows in ``gate_up_proj``, as the model's own
    mapping says; rows or columns the engine pads, such as a padded
    vocabulary or SGLang's padded MLP width on CPU, left alone) and checks
    that the values there are the old version's.
    Raises PatchError, touching nothing, when the patch does not fit.
``apply(staged, verify)``
    Checks again that the values to change are the old version's, writes the
    new ones in place, and (``verify="checksums"``) hashes every patched
    tensor and compares it with the version's recorded xxh3-128
    (``verify="values"`` stops after the writes). On any failure every value
    already written is restored (XOR is its own inverse) and read back, and
    the answer says ``undone``. Only a failed restore raises (RestoreFailed):
    the weights are then neither version, and the engine must not serve on.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

PATCH_FORMAT = "stitch-weight-patch/1"
METADATA_KEY = "stitch_patch"

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# What apply(verify=...) accepts: the sidecar's --patch-verify.
VERIFY = ("checksums", "values")


class PatchError(Exception):
    """A patch that cannot be applied to the weights this engine holds."""


class RestoreFailed(RuntimeError):
    """Undoing a failed patch failed: the weights are neither version."""


def check_verify(verify: Any) -> None:
    """Any other word would skip the checksums as silently as "values": refused
    before the staged patch or a weight is touched."""
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {', '.join(map(repr, VERIFY))}, "
                         f"not {verify!r}: nothing was patched")


def require_unsharded(distributed_module: str) -> None:
    """Patches place unsharded tensors: refused unless the engine's tensor
    parallelism (get_tensor_model_parallel_world_size in
    `distributed_module`, the engine's) is 1. Outside the engine, or in one
    without a parallel group, there is one process."""
    import importlib

    try:
        size = importlib.import_module(distributed_module).get_tensor_model_parallel_world_size()
    except (ImportError, AttributeError, AssertionError):
        return
    if size != 1:
        raise PatchError("patches place unsharded tensors: tensor parallelism must be 1")


class _Slot:
    """One checkpoint tensor's patch, placed inside an engine parameter."""

    def __init__(self, name: str, flat: torch.Tensor, region: torch.Tensor, idx, xor, new,
                 checksum: str):
        self.name = name
        self.flat = flat  # the integer view of the whole parameter, flattened
        self.region = region  # the part of the parameter that is the checkpoint tensor
        self.idx = idx  # into `flat`
        self.new = new
        self.old = torch.bitwise_xor(new, xor)
        self.checksum = checksum


class Staged:
    """A patch read and placed, ready to apply."""

    def __init__(self, source: str, target: str, slots: List[_Slot], checked: bool):
        self.source = source
        self.target = target
        self.slots = slots
        self.checked = checked  # the old values were checked at staging

    def values(self) -> int:
        return int(sum(s.idx.numel() for s in self.slots))


def fused_parts(model) -> Dict[str, List[str]]:
    """{fused parameter: [checkpoint parts in row order]}: vLLM's
    ``packed_modules_mapping``, or SGLang's ``stacked_params_mapping``
    ((".qkv_proj", ".q_proj", shard id), ... in row order)."""
    packed = getattr(model, "packed_modules_mapping", None)
    if packed:
        return {k: list(v) for k, v in packed.items()}
    parts: Dict[str, List[str]] = {}
    for entry in getattr(model, "stacked_params_mapping", None) or []:
        fused, part = entry[0].strip("."), entry[1].strip(".")
        parts.setdefault(fused, []).append(part)
    return parts


def _place(fused: Dict[str, List[str]], params: Dict[str, torch.nn.Parameter], name: str,
           shape: List[int], shapes: Dict[str, List[int]]) -> Tuple[torch.Tensor, int]:
    """The engine parameter that holds checkpoint tensor `name` and the row
    where it starts there. A fused parameter holds its parts one after the
    other, each padded to the same number of rows when the engine pads
    them (SGLang's CPU path pads the MLP's intermediate size); any
    dimension may be padded at its end."""
    pname, offset = name, 0
    for whole, parts in fused.items():
        for i, part in enumerate(parts):
            needle = "." + part + "."
            if needle not in name:
                continue
            pname = name.replace(needle, "." + whole + ".")
            rows = []
            for sibling_part in parts:
                sibling = name.replace(needle, "." + sibling_part + ".")
                if sibling not in shapes:
                    raise PatchError(f"{name}: the checkpoint has no {sibling} to place it beside")
                rows.append(shapes[sibling][0])
            param = params.get(pname)
            if param is not None and param.data.dim() > 0 and sum(rows) != param.data.shape[0]:
                # Padded parts: equal ones, each to an equal share of the rows.
                if len(set(rows)) != 1 or param.data.shape[0] % len(parts) != 0:
                    raise PatchError(f"{name}: cannot tell where {pname} "
                                     f"{list(param.data.shape)} holds parts of rows {rows}")
                offset = i * (param.data.shape[0] // len(parts))
            else:
                offset = sum(rows[:i])
            break
        if pname != name:
            break
    param = params.get(pname)
    if param is None:
        raise PatchError(f"{name}: the engine has no parameter {pname} to patch")
    data = param.data
    if not shape:
        if data.dim() != 0:
            raise PatchError(f"{name} is a scalar, {pname} {list(data.shape)} is not")
        return data, 0
    if (data.dim() != len(shape) or offset + shape[0] > data.shape[0]
            or any(c > p for c, p in zip(shape[1:], data.shape[1:]))):
        raise PatchError(
            f"{name} {shape} does not fit {pname} {list(data.shape)} at row {offset}")
    if not data.is_contiguous():
        raise PatchError(f"{pname} is not contiguous")
    return data, offset


def _region(data: torch.Tensor, shape: List[int], offset: int) -> torch.Tensor:
    """The part of `data` that holds a checkpoint tensor of `shape` from row
    `offset` (a view: not contiguous where columns are padded)."""
    if not shape:
        return data
    region = data.narrow(0, offset, shape[0])
    for dim, size in enumerate(shape[1:], start=1):
        region = region.narrow(dim, 0, size)
    return region


def _param_indices(idx: torch.Tensor, shape: List[int], pshape: List[int],
                   offset: int) -> torch.Tensor:
    """Flat indices into a checkpoint tensor of `shape`, as flat indices into
    the parameter of `pshape` that holds it from row `offset`."""
    idx = idx.to(torch.int64)
    if not shape:
        return idx
    if list(shape[1:]) == list(pshape[1:]):
        row = 1
        for d in pshape[1:]:
            row *= d
        return idx + offset * row
    out = torch.zeros_like(idx)
    rest = idx
    for dim in range(len(shape)):
        inner = 1
        for d in shape[dim + 1:]:
            inner *= d
        pinner = 1
        for d in pshape[dim + 1:]:
            pinner *= d
        coord = torch.div(rest, inner, rounding_mode="floor")
        rest = rest - coord * inner
        out += (coord + (offset if dim == 0 else 0)) * pinner
    return out


def _xxh3_128_hex(view: torch.Tensor) -> str:
    import xxhash

    host = view.detach().contiguous()
    if host.device.type != "cpu":
        host = host.cpu()
    return xxhash.xxh3_128_hexdigest(host.view(torch.uint8).numpy())


def stage(model, path: str, check: bool = True) -> Staged:
    """`check=False` leaves the old values' check to apply(), for a patch
    applied at once (apply checks them again anyway)."""
    from safetensors import safe_open

    params = dict(model.named_parameters())
    fused = fused_parts(model)
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
            data, offset = _place(fused, params, name, info["shape"], shapes)
            width = data.element_size()
            if str(data.dtype).replace("torch.", "") != _torch_dtype_name(info["dtype"]):
                raise PatchError(
                    f"{name}: the engine holds {data.dtype}, the patch {info['dtype']}")
            flat = data.view(_BITS[width]).reshape(-1)
            idx = _param_indices(f.get_tensor(name + "::idx"), info["shape"], list(data.shape),
                                 offset)
            slot = _Slot(name, flat, _region(data, info["shape"], offset), idx,
                         f.get_tensor(name + "::xor"), f.get_tensor(name + "::new"),
                         info["checksum"])
            if check and not torch.equal(torch.take(flat, slot.idx), slot.old):
                raise PatchError(f"{name}: the engine does not hold {meta['from']}'s values there")
            slots.append(slot)
    return Staged(meta["from"], meta["to"], slots, check)


def apply(staged: Staged, verify: str, fail_after: Optional[int] = None) -> Dict[str, Any]:
    """`fail_after`: fail after patching that many tensors (tests only)."""
    check_verify(verify)
    start = time.monotonic()
    done: List[_Slot] = []
    try:
        for slot in staged.slots:
            if fail_after is not None and len(done) >= fail_after:
                raise PatchError(f"a fault armed to fail after {fail_after} tensors")
            if not torch.equal(torch.take(slot.flat, slot.idx), slot.old):
                raise PatchError(
                    f"{slot.name}: the values to patch changed since staging" if staged.checked
                    else f"{slot.name}: the engine does not hold {staged.source}'s values there")
            done.append(slot)
            slot.flat.put_(slot.idx, slot.new)
        if verify == "checksums":
            for slot in staged.slots:
                got = _xxh3_128_hex(slot.region)
                if got != slot.checksum:
                    raise PatchError(f"{slot.name}: xxh3-128 {got} after patching, "
                                     f"the version records {slot.checksum}")
    except Exception as e:  # noqa: BLE001: whatever failed, the old version is restored
        for slot in reversed(done):
            slot.flat.put_(slot.idx, slot.old)
        for slot in done:
            if not torch.equal(torch.take(slot.flat, slot.idx), slot.old):
                raise RestoreFailed(f"undoing the patch to {staged.target} failed at "
                                    f"{slot.name}: the weights are neither version") from e
        return {"applied": False, "undone": True, "error": str(e), "from": staged.source,
                "seconds": time.monotonic() - start}
    return {"applied": True, "to": staged.target, "tensors": len(staged.slots),
            "values": staged.values(), "verified": verify, "seconds": time.monotonic() - start}


def _torch_dtype_name(safetensors_dtype: str) -> str:
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
            "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32",
            "I64": "int64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
            "F8_E5M2": "float8_e5m2"}.get(safetensors_dtype, safetensors_dtype)
