"""Pure-torch stand-ins for the two sgl-kernel CPU ops that stock SGLang needs.

Why this exists: PyPI has only CUDA builds of SGLang's kernel library
(distribution "sglang-kernel", module sgl_kernel). On a machine without a GPU
driver its compiled op library (sgl_kernel/sm100/common_ops.abi3.so) fails
to load (libcuda.so.1 is missing), and sgl_kernel's loader
(sgl_kernel/load_utils.py, _load_architecture_specific_ops) then falls back
to a plain `import common_ops`. This file is that module: put this directory
on PYTHONPATH (tests/engines/sglang_serve.sh does) and `import sgl_kernel`
succeeds.

With SGLANG_USE_CPU_ENGINE=1, SGLang imports two ops from sgl_kernel at
module load whatever the attention backend is:

- sglang/srt/mem_cache/allocation.py: assign_req_to_token_pool_cpu
- sglang/kernels/ops/kvcache/cache_move.py: copy_all_layer_kv_cache_cpu

sgl_kernel's Python wrappers for them call torch.ops.sgl_kernel.<name>, so
this module registers both in the "sgl_kernel" operator namespace with
torch.library, implemented with ordinary torch tensor operations. No other
sgl_kernel op is provided: SGLang's CPU path with --attention-backend
torch_native does not call any other one for a plain Llama (a call to one
would fail with "no such operator torch.ops.sgl_kernel.<name>").

What the ops compute (read from the Triton kernels SGLang uses for the same
job on GPUs, assign_req_to_token_pool in allocation.py and
copy_all_layer_kv_cache_tiled in cache_move.py):

assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset,
                             end_offset, out_cache_loc, pool_len)
    req_to_token is the [num_request_slots, pool_len] table from a request's
    token positions to KV-cache slots. For the batch's i-th request, the
    positions start_offset[i] .. end_offset[i]-1 of row req_pool_indices[i]
    get the next (end_offset[i] - start_offset[i]) entries of out_cache_loc,
    which lists the newly allocated slots of all requests one after another
    in batch order. Writes req_to_token in place; returns nothing.

copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc)
    data_ptrs holds the raw addresses (uint64) of every per-layer KV buffer
    (K and V of each layer), strides the size in bytes of one slot (one row)
    of each of them. In every buffer, the row at slot src_loc[j] is copied
    to slot tgt_loc[j], for all j. All source rows are read before any row
    is written, so overlapping source and target sets are safe. Returns
    nothing.
"""

import ctypes

import numpy
import torch

_NAMESPACE = "sgl_kernel"

# FRAGMENT: only adds to the namespace, which a real sgl_kernel build (if
# one ever loads next to this module) owns.
_lib = torch.library.Library(_NAMESPACE, "FRAGMENT")


def _has_op(name):
    try:
        getattr(getattr(torch.ops, _NAMESPACE), name)
        return True
    except (AttributeError, RuntimeError):
        return False


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    if req_pool_indices.numel() == 0:
        return
    assert req_to_token.shape[1] == pool_len
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, begin, end in zip(rows, starts, ends):
        count = end - begin
        if count <= 0:
            continue
        req_to_token[row, begin:end] = out_cache_loc[taken : taken + count].to(
            req_to_token.dtype
        )
        taken += count


def _bytes_at(address, size):
    """A uint8 tensor over `size` bytes of memory at `address` (no copy)."""
    pointer = ctypes.cast(ctypes.c_void_p(address), ctypes.POINTER(ctypes.c_uint8))
    return torch.from_numpy(numpy.ctypeslib.as_array(pointer, shape=(size,)))


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    count = tgt_loc.numel()
    if count == 0:
        return
    assert src_loc.numel() == count
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    # Only the rows up to the highest slot named are touched, so the view
    # over each buffer needs to reach no further than that.
    rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        address, row_bytes = int(address), int(row_bytes)
        if address == 0 or row_bytes <= 0:
            continue
        table = _bytes_at(address, rows * row_bytes).view(rows, row_bytes)
        table[tgt] = table[src]  # the gather copies before the scatter writes


if not _has_op("assign_req_to_token_pool_cpu"):
    _lib.define(
        "assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token,"
        " Tensor start_offset, Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()"
    )
    _lib.impl(
        "assign_req_to_token_pool_cpu", assign_req_to_token_pool_cpu, "CompositeExplicitAutograd"
    )

if not _has_op("copy_all_layer_kv_cache_cpu"):
    _lib.define(
        "copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc,"
        " Tensor src_loc) -> ()"
    )
    _lib.impl(
        "copy_all_layer_kv_cache_cpu", copy_all_layer_kv_cache_cpu, "CompositeExplicitAutograd"
    )
