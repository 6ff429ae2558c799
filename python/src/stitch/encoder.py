"""DeltaEncoder: turns the weights a trainer holds in memory into versions."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from stitch import _stitch
from stitch.errors import InvalidArgument, StitchError

# NumPy dtype names -> safetensors dtype names. "bfloat16", "float8_*" are
# ml_dtypes' names (when it is installed, its arrays work directly). Other
# array types come in through DLPack, whose dtype the extension maps.
_NUMPY_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
    "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32",
    "float32": "F32", "uint64": "U64", "int64": "I64", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
# (name, safetensors dtype, shape, flat uint8 view of the bytes)
_Tensor = Tuple[str, str, List[int], np.ndarray]


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(f"stitch: {message}", "INVALID_ARGUMENT")


def _dlpack_view(name: str, value: Any) -> _Tensor:
    if getattr(value, "requires_grad", False):
        value = value.detach()  # torch refuses to export a tensor that requires grad
    try:
        dtype, shape, data = _stitch.dlpack_view(name, value)
    except TypeError as e:  # nanobind could not import it (e.g. a device it cannot read)
        raise _invalid(f"tensor {name!r} ({type(value).__name__}) could not be read through "
                       f"DLPack: {e}; pass a contiguous CPU array") from None
    return name, dtype, list(shape), data


def as_tensor(name: str, value: Any) -> _Tensor:
    """A zero-copy byte view of a contiguous CPU array or tensor.

    ``value`` is a NumPy array (ml_dtypes' bfloat16 and float8 included), any
    object with ``__dlpack__`` (PyTorch CPU tensors of any dtype, bfloat16
    included; JAX CPU arrays), an object with the buffer protocol, or
    ``(array, dtype)`` where ``dtype`` is a safetensors name overriding the
    array's own (e.g. a ``uint16`` view of bfloat16 weights with ``"BF16"``).
    """
    dtype_override = None
    if isinstance(value, tuple):
        value, dtype_override = value
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        n, dtype, shape, data = _dlpack_view(name, value)
        return n, dtype_override or dtype, shape, data
    arr = np.asarray(value)
    if not arr.flags.c_contiguous:
        raise _invalid(f"array {name!r} is not C-contiguous; use np.ascontiguousarray first")
    if arr.dtype.byteorder == ">":
        raise _invalid(f"array {name!r} is big-endian; safetensors are little-endian "
                       "(use arr.astype(arr.dtype.newbyteorder('<')))")
    dtype = dtype_override or _NUMPY_DTYPES.get(arr.dtype.name)
    if dtype is None:
        raise _invalid(f"array {name!r} has unsupported dtype {arr.dtype}")
    data = arr.reshape(-1).view(np.uint8)
    return name, dtype, list(arr.shape), data


def _make_parent(out_dir: Any) -> None:
    parent = os.path.dirname(os.path.abspath(os.fspath(out_dir)))
    os.makedirs(parent, exist_ok=True)


class DeltaEncoder:
    """Holds the last published weights and writes the next version.

    ``tensors`` maps names to the weights of version ``version`` (already
    published, e.g. the boot checkpoint); they are copied once into a
    snapshot. Each :meth:`encode` writes version ``version + 1`` as a DELTA
    against the snapshot (or a FULL anchor with ``full=True``) and updates
    the snapshot: a DELTA overwrites it in the same pass that encodes it.
    The GIL is released while the core encodes on ``threads`` workers (0:
    every core). When a DELTA encode fails after it started to overwrite
    the snapshot (a write error), the next version must be FULL
    (``full=True``); until then delta encodes raise :class:`StitchError`.

    The anchor budget bounds what a replica joining late applies: with
    ``anchor_every=N`` a version is written FULL once the DELTAs since the
    last FULL number N, and with ``anchor_bytes=True`` once they weigh as
    much as one FULL version. ``tensors`` counts as the first anchor; the
    result says ``"anchor": True`` when the budget chose FULL.
    """

    def __init__(self, tensors: Mapping[str, Any], version: int, run_id: str,
                 level: int = 1, threads: int = 0, *, anchor_every: int = 0,
                 anchor_bytes: bool = False) -> None:
        if int(anchor_every) < 0:
            raise _invalid(f"anchor_every must be 0 (no count budget) or positive, "
                           f"not {anchor_every}")
        self.version = int(version)
        self.run_id = run_id
        self.level = int(level)
        self.threads = int(threads)
        self.anchor_every = int(anchor_every)
        self.anchor_bytes = bool(anchor_bytes)
        # The chain since the last FULL version: how many DELTAs, how many
        # payload bytes.
        self.chain_deltas = 0
        self.chain_bytes = 0
        self._snapshot: Dict[str, _Tensor] = {}
        # Why the snapshot is no version any more (a failed encode had
        # partly advanced it), or None.
        self._lost: Optional[str] = None
        copies = []
        for name, value in tensors.items():
            n, dtype, shape, data = as_tensor(name, value)
            snapshot = np.empty_like(data)
            copies.append((data, snapshot))
            self._snapshot[name] = (n, dtype, shape, snapshot)
        _stitch.copy_bytes(copies, self.threads)
        self._full_bytes = sum(int(t[3].nbytes) for t in self._snapshot.values())

    def anchor_due(self) -> bool:
        """Whether the anchor budget makes the next version FULL."""
        if self.anchor_every and self.chain_deltas >= self.anchor_every:
            return True
        return self.anchor_bytes and self.chain_deltas > 0 and \
            self.chain_bytes >= self._full_bytes

    def _check_snapshot(self) -> None:
        if self._lost is not None:
            raise StitchError(
                f"stitch: the snapshot of version {self.version} was partly overwritten by an "
                f"encode that failed ({self._lost}); write the next version as a FULL one: "
                "encode(tensors, full=True)", "FAILED_PRECONDITION")

    def _targets(self, tensors: Mapping[str, Any]) -> List[_Tensor]:
        if set(tensors) != set(self._snapshot):
            missing = sorted(set(self._snapshot) - set(tensors))
            extra = sorted(set(tensors) - set(self._snapshot))
            raise _invalid(f"a delta cannot add or remove tensors (missing {missing}, new {extra}); "
                           "start a new DeltaEncoder after writing a FULL version")
        return [as_tensor(name, tensors[name]) for name in self._snapshot]

    def encode(self, tensors: Mapping[str, Any], out_dir: Optional[str] = None, *,
               full: bool = False) -> Dict[str, Any]:
        """Writes version ``self.version + 1`` from ``tensors`` into
        ``out_dir`` (default: ``weight_vNNNNNN`` in the current directory;
        must not exist or be empty) and returns what was written, with
        ``"dir"`` set to the directory."""
        version = self.version + 1
        if out_dir is None:
            out_dir = _stitch.VersionRef(self.run_id, version).dir_name
        targets = self._targets(tensors)
        by_budget = not full and self.anchor_due()
        full = full or by_budget
        if not full:
            self._check_snapshot()
        _make_parent(out_dir)
        if full:
            result = _stitch.write_full(targets, str(out_dir), version, self.run_id)
            _stitch.copy_bytes([(data, self._snapshot[name][3]) for name, _, _, data in targets],
                               self.threads)
            self._lost = None
        else:
            # The snapshot advances to the targets in the encoding pass.
            base = list(self._snapshot.values())
            try:
                result = _stitch.encode_delta_advancing(base, targets, str(out_dir), version,
                                                        self.run_id, self.level, self.threads)
            except StitchError as e:
                if getattr(e, "base_advanced", False):
                    self._lost = e.message
                raise
        self.version = version
        if full:
            self.chain_deltas, self.chain_bytes = 0, 0
        else:
            self.chain_deltas += 1
            self.chain_bytes += int(result["payload_bytes"])
        result["dir"] = os.fspath(out_dir)
        result["anchor"] = by_budget
        return result

    def write_anchor(self, out_dir: str) -> Dict[str, Any]:
        """Writes the snapshot (version ``self.version``) as a FULL version."""
        self._check_snapshot()
        _make_parent(out_dir)
        result = _stitch.write_full(list(self._snapshot.values()), str(out_dir), self.version,
                                    self.run_id)
        result["dir"] = os.fspath(out_dir)
        return result
