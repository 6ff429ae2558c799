#!/usr/bin/env python3
"""The reference delta algorithm of the published Python Stitch, for interop tests.

  delta_reference.py encode --base DIR --target DIR --out DIR --version N
  delta_reference.py apply --anchor DIR --out DIR DELTA_DIR...

encode: for every tensor that differs, zstd level 1 (`zstandard`) of
base XOR target (numpy), stored as a U8 tensor by `safetensors.numpy.save_file`
with the xxh3-128 of the target tensor (`xxhash.xxh3_128().hexdigest()`) as
the file's metadata, plus the Hugging Face index with Stitch's delta keys.

apply: start from the anchor checkpoint, XOR every delta in version order,
verify each changed tensor's checksum, write the result as one
model.safetensors plus an index. Exits 3 with a message on a checksum
mismatch, 2 on malformed input.

numpy has no bfloat16, so checkpoint tensors are handled as raw bytes: the
reader and writer below keep each tensor's dtype string and shape from the
safetensors header and never interpret the values.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import safetensors.numpy
import xxhash
import zstandard
from safetensors import safe_open

INDEX = "model.safetensors.index.json"


def fail(code, message):
    print(f"delta_reference: {message}", file=sys.stderr)
    sys.exit(code)


def read_raw_safetensors(path):
    """{name: (dtype, shape, uint8 array)} and the metadata, without numpy dtypes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=end - begin, offset=base + begin)
        tensors[name] = (entry["dtype"], entry["shape"], raw.copy())
    return tensors, metadata


def write_raw_safetensors(path, tensors, metadata=None):
    header = {}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + raw.size]}
        offset += raw.size
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][2].tobytes())


def read_index(directory):
    path = os.path.join(directory, INDEX)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"metadata": {}, "weight_map": None}


def read_checkpoint(directory):
    index = read_index(directory)
    files = sorted(set(index["weight_map"].values())) if index["weight_map"] else ["model.safetensors"]
    tensors = {}
    for file in files:
        part, _ = read_raw_safetensors(os.path.join(directory, file))
        tensors.update(part)
    return tensors


def write_checkpoint(directory, tensors, version):
    os.makedirs(directory, exist_ok=True)
    write_raw_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    index = {"metadata": {"version": f"{version:06d}"}, "weight_map": {n: "model.safetensors" for n in tensors}}
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump(index, f)


def encode(args):
    base = read_checkpoint(args.base)
    target = read_checkpoint(args.target)
    if set(base) != set(target):
        fail(2, f"tensor sets differ: {sorted(set(base) ^ set(target))}")
    frames, checksums = {}, {}
    compressor = zstandard.ZstdCompressor(level=1)
    for name in sorted(target):
        b_dtype, b_shape, b = base[name]
        t_dtype, t_shape, t = target[name]
        if (b_dtype, b_shape) != (t_dtype, t_shape):
            fail(2, f"tensor {name}: {b_dtype}{b_shape} in the base, {t_dtype}{t_shape} in the target")
        x = np.bitwise_xor(b, t)
        if not x.any():
            continue
        frames[name] = np.frombuffer(compressor.compress(x.tobytes()), dtype=np.uint8)
        checksums[name] = xxhash.xxh3_128(t.tobytes()).hexdigest()
    os.makedirs(args.out)
    weight_map = {}
    if frames:
        safetensors.numpy.save_file(frames, os.path.join(args.out, "delta.safetensors"), metadata=checksums)
        weight_map = {name: "delta.safetensors" for name in frames}
    index = {
        "metadata": {
            "version": f"{args.version:06d}",
            "base_version": f"{args.version - 1:06d}",
            "delta_encoding": "xor",
            "compression_format": "zstd",
            "checksum_format": "xxh3-128",
        },
        "weight_map": weight_map,
    }
    with open(os.path.join(args.out, INDEX), "w") as f:
        json.dump(index, f)


def apply(args):
    tensors = read_checkpoint(args.anchor)
    deltas = []
    for d in args.deltas:
        index = read_index(d)
        md = index["metadata"]
        for key, want in (("delta_encoding", "xor"), ("compression_format", "zstd"), ("checksum_format", "xxh3-128")):
            if md.get(key) != want:
                fail(2, f"{d}: metadata.{key} is {md.get(key)!r}, expected {want!r}")
        deltas.append((int(md["version"]), int(md["base_version"]), d, index["weight_map"]))
    deltas.sort()
    for i in range(1, len(deltas)):
        if deltas[i][1] != deltas[i - 1][0]:
            fail(2, f"{deltas[i][2]} applies to version {deltas[i][1]}, not {deltas[i - 1][0]}")
    decompressor = zstandard.ZstdDecompressor()
    for version, _, d, weight_map in deltas:
        for file in sorted(set(weight_map.values())):
            path = os.path.join(d, file)
            with safe_open(path, framework="numpy") as f:
                checksums = f.metadata() or {}
                for name in f.keys():
                    frame = f.get_tensor(name).tobytes()
                    dtype, shape, current = tensors[name]
                    x = np.frombuffer(decompressor.decompress(frame), dtype=np.uint8)
                    if x.size != current.size:
                        fail(2, f"{path}: tensor {name} decodes to {x.size} bytes, expected {current.size}")
                    result = np.bitwise_xor(current, x)
                    got = xxhash.xxh3_128(result.tobytes()).hexdigest()
                    if got != checksums.get(name):
                        fail(3, f"{path}: tensor {name}: checksum {got} != recorded {checksums.get(name)}")
                    tensors[name] = (dtype, shape, result)
    write_checkpoint(args.out, tensors, deltas[-1][0] if deltas else 0)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("encode")
    e.add_argument("--base", required=True)
    e.add_argument("--target", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--version", type=int, required=True)
    a = sub.add_parser("apply")
    a.add_argument("--anchor", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("deltas", nargs="*")
    args = parser.parse_args()
    encode(args) if args.command == "encode" else apply(args)


if __name__ == "__main__":
    main()
