#!/usr/bin/env python3
"""python_encode_bench: stitch.DeltaEncoder against the ways a Python trainer
encodes a delta today, on the same bytes in the same run.

The model is delta_bench's: bf16 weights (default 2 GiB in 64 tensors) with
random signs and mantissas and exponents of values between about 1e-4 and
0.5, and a target in which 1% of the values moved by one mantissa step.
Rows:
  memcpy           copying the checkpoint once (np.copyto, one core)
  encode floor     delta_bench's fused single-threaded loop (XOR, zstd level
                   1, xxh3-128 over 128 KiB chunks), the same C++ built as
                   build/bench/libencode_floor.so and called through ctypes
  numpy encoder    the straightforward Python encoder: per tensor
                   np.bitwise_xor, zstandard level 1, xxhash xxh3_128, then
                   safetensors files and the index (fsync'ed, like ours);
                   one core, as Python runs it
  DeltaEncoder     stitch.DeltaEncoder.encode with 1 and 2 threads: the
                   whole call a trainer makes (a DELTA directory written and
                   fsync'ed, and the snapshot advanced to the new weights in
                   the same pass)
Targets: DeltaEncoder on every core at least 4x the NumPy encoder, and at
least 0.8x the encode floor per thread (floor time / (time x threads)).
Exits 1 when a target is missed (--no-check: report only).

    python bench/python_encode_bench.py [--size-gib G] [--tensors N] [--reps R] [--dir DIR]
                                        [--floor-lib build/bench/libencode_floor.so]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import safetensors.numpy
import xxhash
import zstandard

import stitch

RUN = "bench"


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn):
    wall, cpu = time.perf_counter(), cpu_seconds()
    out = fn()
    return time.perf_counter() - wall, cpu_seconds() - cpu, out


def load_encode_floor(path: str):
    """encode_floor(base_u8, target_u8, tensor_bytes) -> (seconds, compressed bytes), from
    the shared library bench/encode_floor_lib.cc builds."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        sys.exit(f"python_encode_bench: cannot load the encode floor {path} ({e}); run `make build` "
                 "first, or give --floor-lib")
    fn = lib.stitch_encode_floor
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_size_t)]
    fn.restype = ctypes.c_int

    def encode_floor(base_u8: np.ndarray, target_u8: np.ndarray, tensor_bytes: int):
        if base_u8.nbytes != target_u8.nbytes or tensor_bytes <= 0:
            raise ValueError("encode_floor needs equal sizes and tensor_bytes > 0")
        seconds, compressed = ctypes.c_double(), ctypes.c_size_t()
        if fn(base_u8.ctypes.data, target_u8.ctypes.data, base_u8.nbytes, tensor_bytes,
              ctypes.byref(seconds), ctypes.byref(compressed)) != 0:
            raise ValueError("encode_floor refused its sizes")
        return seconds.value, compressed.value

    return encode_floor


def best(reps, fn):
    """Best wall and best CPU seconds of `reps` runs of fn(rep)."""
    wall = cpu = float("inf")
    for rep in range(reps):
        w, c, _ = timed(lambda: fn(rep))
        wall, cpu = min(wall, w), min(cpu, c)
    return wall, cpu


def make_model(total_bytes: int, tensors: int, seed: int = 42):
    """delta_bench's MakeModel, tensor by tensor (bounded temporaries)."""
    per = total_bytes // tensors // 2  # values per tensor
    base = np.empty(per * tensors, dtype=np.uint16)
    target = np.empty_like(base)
    rng = np.random.default_rng(seed)
    for k in range(tensors):
        bits = rng.integers(0, 1 << 16, size=per, dtype=np.uint16)
        exponent = (0x71 + ((bits >> 7) & 0xF) % 12).astype(np.uint16)
        b = base[k * per:(k + 1) * per]
        b[:] = (bits & 0x8000) | (exponent << 7) | (bits & 0x7F)
        t = target[k * per:(k + 1) * per]
        t[:] = b
        idx = np.cumsum(rng.geometric(0.01, size=per // 100 + per // 1000 + 64)) - 1
        idx = idx[idx < per]
        v = t[idx]
        t[idx] = np.where((v & 0x7F) == 0x7F, v - 1, v + 1).astype(np.uint16)
    names = [f"model.layers.{k:03d}.mlp.weight" for k in range(tensors)]
    return names, per, base, target


def as_bf16(flat: np.ndarray, names, per):
    try:
        import ml_dtypes
        return {n: flat[k * per:(k + 1) * per].view(ml_dtypes.bfloat16) for k, n in enumerate(names)}
    except ImportError:
        return {n: (flat[k * per:(k + 1) * per], "BF16") for k, n in enumerate(names)}


def numpy_encode(names, per, base, target, out_dir, version):
    """The straightforward Python encoder (one core): XOR, zstd-1 and
    xxh3-128 per tensor with NumPy, zstandard and xxhash; frames written as
    one safetensors file plus the index."""
    frames, checksums = {}, {}
    compressor = zstandard.ZstdCompressor(level=1)
    for k, name in enumerate(names):
        b = base[k * per:(k + 1) * per]
        t = target[k * per:(k + 1) * per]
        x = np.bitwise_xor(b, t)
        if not x.any():
            continue
        frames[name] = np.frombuffer(compressor.compress(x), dtype=np.uint8)
        checksums[name] = xxhash.xxh3_128(t).hexdigest()
    os.makedirs(out_dir)
    payload = os.path.join(out_dir, "delta.safetensors")
    safetensors.numpy.save_file(frames, payload, metadata=checksums)
    index = {"metadata": {"version": f"{version:06d}", "base_version": f"{version - 1:06d}",
                          "delta_encoding": "xor", "compression_format": "zstd",
                          "checksum_format": "xxh3-128"},
             "weight_map": {name: "delta.safetensors" for name in frames}}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    for path in (payload, os.path.join(out_dir, "model.safetensors.index.json")):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return sum(f.nbytes for f in frames.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where version directories go (default: $TMPDIR)")
    parser.add_argument("--no-check", action="store_true", help="report only; do not fail on targets")
    parser.add_argument("--floor-lib", default=os.path.join("build", "bench", "libencode_floor.so"),
                        help="the encode floor's shared library (built by `make build`)")
    a = parser.parse_args()
    encode_floor = load_encode_floor(a.floor_lib)
    cores = os.cpu_count() or 1
    total = int(a.size_gib * (1 << 30))
    print(f"python_encode_bench: {a.size_gib:.2f} GiB of bf16 in {a.tensors} tensors, 1% of values "
          f"one mantissa step apart; best of {a.reps} runs; {cores} cores; load average at start: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    names, per, base, target = make_model(total, a.tensors)
    nbytes = base.nbytes
    root = tempfile.mkdtemp(prefix="python-encode-bench-", dir=a.dir)
    rows = []  # (operation, threads, wall, cpu)
    try:
        work = np.empty_like(base)
        rows.append(("memcpy", 1, *best(a.reps, lambda _: np.copyto(work, base))))
        del work

        base_u8, target_u8 = base.view(np.uint8), target.view(np.uint8)
        floor_bytes = [0]

        def floor(_):
            seconds, floor_bytes[0] = encode_floor(base_u8, target_u8, per * 2)
            return seconds

        floor_wall, floor_cpu = best(a.reps, floor)
        rows.append(("encode floor (xor+zstd-1+xxh3)", 1, floor_wall, floor_cpu))

        numpy_bytes = [0]

        def numpy_run(rep):
            out = os.path.join(root, f"numpy-{rep}", "weight_v000001")
            numpy_bytes[0] = numpy_encode(names, per, base, target, out, 1)
            shutil.rmtree(os.path.dirname(out))

        numpy_wall, numpy_cpu = best(a.reps, numpy_run)
        rows.append(("numpy+zstandard+xxhash encoder", 1, numpy_wall, numpy_cpu))

        # One encoder; its snapshot alternates between base and target, so
        # every run encodes the same change (base->target or back).
        views = [as_bf16(base, names, per), as_bf16(target, names, per)]
        enc = stitch.DeltaEncoder(views[0], version=0, run_id=RUN)
        results = {}
        for threads in (1, cores) if cores > 1 else (1,):
            enc.threads = threads

            def ours(rep):
                out = os.path.join(root, f"ours-{threads}-{rep}", stitch.VersionRef(RUN, enc.version + 1).dir_name)
                results[threads] = enc.encode(views[(enc.version + 1) % 2], out)
                shutil.rmtree(os.path.dirname(out))

            rows.append(("DeltaEncoder.encode", threads, *best(a.reps, ours)))
        del enc, views
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\n{'operation':<32} {'thr':>3} {'wall s':>8} {'GB/s':>6} {'x numpy':>8} {'x floor':>8} "
          f"{'x memcpy':>8} {'cpu s':>7}")
    print(f"{'':<32} {'':>3} {'':>8} {'':>6} {'(wall)':>8} {'per thr':>8} {'(wall)':>8}")
    memcpy_wall = rows[0][2]
    for op, threads, wall, cpu in rows:
        speedup = f"{numpy_wall / wall:.2f}" if op.startswith("DeltaEncoder") else "-"
        per_thread = f"{floor_wall / (wall * threads):.2f}" if op.startswith("DeltaEncoder") else "-"
        print(f"{op:<32} {threads:>3} {wall:>8.3f} {nbytes / wall / 1e9:>6.2f} {speedup:>8} "
              f"{per_thread:>8} {memcpy_wall / wall:>8.2f} {cpu:>7.3f}")
    one = next(r for r in rows if r[0] == "DeltaEncoder.encode" and r[1] == 1)
    every = [r for r in rows if r[0] == "DeltaEncoder.encode"][-1]
    print(f"\ncompressed frames: floor {floor_bytes[0] / (1 << 20):.1f} MiB, numpy encoder "
          f"{numpy_bytes[0] / (1 << 20):.1f} MiB; DeltaEncoder payload "
          f"{results[every[1]]['payload_bytes'] / (1 << 20):.1f} MiB "
          f"({results[every[1]]['changed_tensors']} of {results[every[1]]['tensors']} tensors changed)")
    speedup = numpy_wall / every[2]
    floor_ratio = floor_wall / (every[2] * every[1])
    floor_ratio_1 = floor_wall / one[2]
    floor_ratio_cpu = floor_cpu / one[3]
    print(f"DeltaEncoder with {every[1]} threads: {speedup:.2f}x the NumPy encoder (target >= 4), "
          f"{floor_ratio:.2f}x the encode floor per thread (target >= 0.8); with 1 thread "
          f"{floor_ratio_1:.2f}x the floor (wall), {floor_ratio_cpu:.2f}x (cpu); "
          f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.no_check:
        return 0
    if speedup < 4 or floor_ratio < 0.8:
        print("python_encode_bench: a target was missed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
