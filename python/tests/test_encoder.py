"""DeltaEncoder output applied by the C++ codec and the reference codec."""

import os
import subprocess
import sys

import numpy as np
import pytest

import delta_reference
import stitch
from dlpack_standin import KDL_BFLOAT, KDL_COMPLEX, KDL_CUDA, DLPackOnly

RUN = "run-1"


def weights(seed):
    rng = np.random.default_rng(seed)
    return {
        "layer.0.w": rng.standard_normal((64, 33), dtype=np.float32),
        # bfloat16 as a uint16 view (NumPy has no bfloat16).
        "layer.0.bf16": (rng.integers(0, 1 << 16, size=(17, 5), dtype=np.uint16), "BF16"),
        "layer.1.b": rng.standard_normal(9).astype(np.float16),
        "step": np.array(3, dtype=np.int64),
    }


def perturb(tensors, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in tensors.items():
        arr, dtype = value if isinstance(value, tuple) else (value, None)
        arr = arr.copy()
        flat = arr.reshape(-1)
        if name != "layer.1.b":  # leave one tensor unchanged
            idx = rng.integers(0, flat.size, size=max(1, flat.size // 50))
            flat.view(np.uint8)[idx * arr.itemsize] ^= 0x5A
        out[name] = (arr, dtype) if dtype else arr
    return out


def raw(value):
    arr = value[0] if isinstance(value, tuple) else value
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def expect_checkpoint(directory, tensors):
    got = delta_reference.read_checkpoint(str(directory))
    assert set(got) == set(tensors)
    for name, value in tensors.items():
        dtype, shape, data = got[name]
        assert np.array_equal(data, raw(value)), name
    assert got["layer.0.bf16"][0] == "BF16"
    assert got["layer.0.w"][0] == "F32"


@pytest.fixture
def chain(tmp_path):
    v0 = weights(0)
    v1 = perturb(v0, 1)
    v2 = perturb(v1, 2)
    enc = stitch.DeltaEncoder(v0, version=0, run_id=RUN)
    anchor = tmp_path / "weight_v000000"
    enc.write_anchor(str(anchor))
    d1 = enc.encode(v1, str(tmp_path / "weight_v000001"))
    d2 = enc.encode(v2, str(tmp_path / "weight_v000002"))
    assert enc.version == 2
    assert d1["changed_tensors"] == 3 and d1["tensors"] == 4
    return tmp_path, anchor, [d1["dir"], d2["dir"]], (v0, v1, v2)


def test_apply_chain_reproduces_the_arrays_bit_for_bit(chain):
    tmp, anchor, deltas, (v0, v1, v2) = chain
    result = stitch.apply_chain(str(anchor), deltas, str(tmp / "out"))
    assert result["version"] == stitch.VersionRef(RUN, 2)
    assert result["deltas_applied"] == 2
    expect_checkpoint(tmp / "out", v2)
    stitch.apply_chain(str(anchor), deltas[:1], str(tmp / "out1"))
    expect_checkpoint(tmp / "out1", v1)


def test_reference_codec_applies_the_encoders_deltas(chain):
    tmp, anchor, deltas, (_, _, v2) = chain
    script = os.path.join(os.path.dirname(delta_reference.__file__), "delta_reference.py")
    subprocess.run([sys.executable, script, "apply", "--anchor", str(anchor), "--out", str(tmp / "ref"),
                    *deltas], check=True)
    expect_checkpoint(tmp / "ref", v2)


def test_verify_checks_a_delta_against_its_base(chain):
    tmp, anchor, deltas, _ = chain
    report = stitch.verify(deltas[0], base_dir=str(anchor))
    assert report["kind"] == "DELTA" and report["checksums_verified"]
    assert report["version"] == 1 and report["base_version"] == 0
    assert stitch.verify(str(anchor))["kind"] == "FULL"


def test_delta_against_the_wrong_base_is_a_checksum_mismatch(chain, tmp_path):
    _, _, deltas, _ = chain
    other = stitch.DeltaEncoder(weights(99), version=0, run_id=RUN)
    wrong = tmp_path / "wrong"
    other.write_anchor(str(wrong))
    with pytest.raises(stitch.ChecksumMismatch) as info:
        stitch.verify(deltas[0], base_dir=str(wrong))
    assert info.value.code == "DATA_LOSS"
    with pytest.raises(stitch.ChecksumMismatch):
        stitch.apply_chain(str(wrong), deltas, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_corrupt_delta_frame_raises_checksum_mismatch(chain):
    tmp, anchor, deltas, _ = chain
    payload = [f for f in os.listdir(deltas[0]) if f.endswith(".safetensors")][0]
    path = os.path.join(deltas[0], payload)
    data = bytearray(open(path, "rb").read())
    data[-8] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(stitch.ChecksumMismatch):
        stitch.apply_chain(str(anchor), deltas, str(tmp / "out"))


def test_unchanged_weights_give_an_empty_delta(tmp_path):
    v0 = weights(0)
    enc = stitch.DeltaEncoder(v0, version=4, run_id=RUN)
    result = enc.encode(v0, str(tmp_path / "weight_v000005"))
    assert result["changed_tensors"] == 0 and result["version"] == 5 and result["base_version"] == 4


def test_adding_a_tensor_is_refused(tmp_path):
    enc = stitch.DeltaEncoder({"a": np.zeros(4, np.float32)}, version=0, run_id=RUN)
    with pytest.raises(stitch.InvalidArgument):
        enc.encode({"a": np.zeros(4, np.float32), "b": np.zeros(1, np.float32)}, str(tmp_path / "d"))
    with pytest.raises(stitch.InvalidArgument):
        enc.encode({"a": np.zeros((2, 2), np.float32)[:, 0]}, str(tmp_path / "d"))


def test_encoder_publishes_through_a_store(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    v0 = weights(0)
    enc = stitch.DeltaEncoder(v0, version=0, run_id=RUN)
    stitch.claim_run(store, RUN, boot_version=0)
    stitch.publish_version(store, enc.encode(v0, str(tmp_path / "weight_v000001"), full=True)["dir"], RUN)
    v2 = perturb(v0, 5)
    ref = stitch.publish_version(store, enc.encode(v2, str(tmp_path / "weight_v000002"))["dir"], RUN)
    assert ref == stitch.VersionRef(RUN, 2) == store.read_pointer()
    stitch.apply_chain(store.materialize(1), [store.materialize(2)], str(tmp_path / "out"))
    expect_checkpoint(tmp_path / "out", v2)


def test_ml_dtypes_bfloat16_arrays_work_directly(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(10, dtype=np.float32).astype(ml_dtypes.bfloat16)
    enc = stitch.DeltaEncoder({"a": a}, version=0, run_id=RUN)
    enc.write_anchor(str(tmp_path / "v0"))
    b = a.copy()
    b[3] = 100
    enc.encode({"a": b}, str(tmp_path / "v1"))
    stitch.apply_chain(str(tmp_path / "v0"), [str(tmp_path / "v1")], str(tmp_path / "out"))
    got = delta_reference.read_checkpoint(str(tmp_path / "out"))["a"]
    assert got[0] == "BF16" and np.array_equal(got[2], b.view(np.uint8))


def round_trip(tmp_path, v0, v1):
    """Encodes v0 -> v1 as a DELTA and returns what the C++ codec applies."""
    enc = stitch.DeltaEncoder(v0, version=0, run_id=RUN)
    enc.write_anchor(str(tmp_path / "v0"))
    enc.encode(v1, str(tmp_path / "v1"))
    stitch.apply_chain(str(tmp_path / "v0"), [str(tmp_path / "v1")], str(tmp_path / "out"))
    return delta_reference.read_checkpoint(str(tmp_path / "out"))


def test_dlpack_only_tensors_round_trip_bit_for_bit(tmp_path):
    rng = np.random.default_rng(3)
    f32 = rng.standard_normal((32, 7), dtype=np.float32)
    bf16 = rng.integers(0, 1 << 16, size=(16, 9), dtype=np.uint16)  # bfloat16 bits
    f32b, bf16b = f32.copy(), bf16.copy()
    f32b[0, 0] = 42.0
    bf16b[3, 4] ^= 0x0101
    v0 = {"f": DLPackOnly(f32), "h": DLPackOnly(bf16, code=KDL_BFLOAT, bits=16)}
    v1 = {"f": DLPackOnly(f32b), "h": DLPackOnly(bf16b, code=KDL_BFLOAT, bits=16)}
    got = round_trip(tmp_path, v0, v1)
    assert got["f"][0] == "F32" and got["f"][1] == [32, 7]
    assert got["h"][0] == "BF16" and got["h"][1] == [16, 9]
    assert np.array_equal(got["f"][2], f32b.view(np.uint8).reshape(-1))
    assert np.array_equal(got["h"][2], bf16b.view(np.uint8).reshape(-1))


def test_dlpack_reads_are_zero_copy_and_release_the_export():
    from stitch.encoder import as_tensor

    bf16 = np.arange(1000, dtype=np.uint16)
    t = DLPackOnly(bf16, code=KDL_BFLOAT, bits=16)
    name, dtype, shape, data = as_tensor("w", t)
    assert (dtype, shape) == ("BF16", [1000])
    assert data.ctypes.data == bf16.ctypes.data and data.nbytes == bf16.nbytes
    bf16[0] = 7  # the view sees the trainer's memory, not a copy
    assert data[:2].view(np.uint16)[0] == 7
    assert t.deleted == 0
    del data
    assert t.deleted == 1  # the consumer released the DLPack export
    f32 = np.ones(10, np.float32)
    assert np.shares_memory(as_tensor("f", DLPackOnly(f32))[3], f32)


def test_tensors_that_require_grad_are_read_detached(tmp_path):
    w = np.arange(6, dtype=np.float32)
    got = round_trip(tmp_path, {"w": DLPackOnly(w, requires_grad=True)},
                     {"w": DLPackOnly(w + 1, requires_grad=True)})
    assert np.array_equal(got["w"][2], (w + 1).view(np.uint8))


def test_dlpack_tensors_off_the_cpu_or_strided_are_refused():
    from stitch.encoder import as_tensor

    a = np.zeros((4, 4), np.uint16)
    with pytest.raises(stitch.InvalidArgument, match="not in CPU memory"):
        as_tensor("g", DLPackOnly(a, code=KDL_BFLOAT, bits=16, device=KDL_CUDA))
    with pytest.raises(stitch.InvalidArgument, match="not C-contiguous"):
        as_tensor("t", DLPackOnly(a, code=KDL_BFLOAT, bits=16, strides=(1, 4)))
    with pytest.raises(stitch.InvalidArgument, match="no safetensors equivalent"):
        as_tensor("c", DLPackOnly(np.zeros(4, np.complex64), code=KDL_COMPLEX, bits=64))
    with pytest.raises(stitch.InvalidArgument, match="not C-contiguous"):
        as_tensor("s", DLPackOnly(np.zeros((4, 4), np.float32)[:, ::2]))


def test_buffer_protocol_objects_are_read_in_place(tmp_path):
    from stitch.encoder import as_tensor

    w = np.arange(8, dtype=np.float32)
    view = memoryview(w)
    assert np.shares_memory(as_tensor("m", view)[3], w)
    got = round_trip(tmp_path, {"m": memoryview(w.copy())}, {"m": memoryview(w * 2)})
    assert got["m"][0] == "F32" and np.array_equal(got["m"][2], (w * 2).view(np.uint8))


def test_big_endian_arrays_are_refused():
    from stitch.encoder import as_tensor

    with pytest.raises(stitch.InvalidArgument, match="big-endian"):
        as_tensor("b", np.zeros(4, dtype=">f4"))


def test_a_failed_encode_that_overwrote_the_snapshot_demands_a_full_version(tmp_path):
    import resource
    import signal
    rng = np.random.default_rng(5)
    v0 = {"w": rng.standard_normal((256, 256), dtype=np.float32)}
    v1 = perturb(v0, 1)
    v2 = perturb(v1, 2)
    enc = stitch.DeltaEncoder(v0, version=0, run_id=RUN)
    # While v1 is encoded, files may not grow past 1 KiB: writing its frame
    # fails (EFBIG) after the snapshot started to advance.
    saved = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, saved[1]))
    try:
        with pytest.raises(stitch.StitchError) as info:
            enc.encode(v1, str(tmp_path / "weight_v000001"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, saved)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert info.value.base_advanced
    assert "partly advanced" in info.value.message
    assert enc.version == 0 and not (tmp_path / "weight_v000001").exists()
    # No delta (and no anchor) can come from that snapshot any more.
    with pytest.raises(stitch.StitchError, match=r"full=True"):
        enc.encode(v1, str(tmp_path / "weight_v000001"))
    with pytest.raises(stitch.StitchError, match=r"full=True"):
        enc.write_anchor(str(tmp_path / "anchor"))
    # A FULL version makes the snapshot a version again.
    enc.encode(v1, str(tmp_path / "weight_v000001"), full=True)
    d2 = enc.encode(v2, str(tmp_path / "weight_v000002"))
    stitch.apply_chain(str(tmp_path / "weight_v000001"), [d2["dir"]], str(tmp_path / "out"))
    got = delta_reference.read_checkpoint(str(tmp_path / "out"))
    assert np.array_equal(got["w"][2], raw(v2["w"]))


def test_a_refused_encode_leaves_the_snapshot_usable(tmp_path):
    v0 = weights(0)
    v1 = perturb(v0, 1)
    enc = stitch.DeltaEncoder(v0, version=0, run_id=RUN)
    (tmp_path / "busy" / "weight_v000001").mkdir(parents=True)
    (tmp_path / "busy" / "weight_v000001" / "x").write_text("not empty")
    with pytest.raises(stitch.StitchError) as info:
        enc.encode(v1, str(tmp_path / "busy" / "weight_v000001"))
    assert not getattr(info.value, "base_advanced", False)
    d1 = enc.encode(v1, str(tmp_path / "weight_v000001"))
    anchor = tmp_path / "weight_v000000"
    stitch.DeltaEncoder(v0, version=0, run_id=RUN).write_anchor(str(anchor))
    stitch.apply_chain(str(anchor), [d1["dir"]], str(tmp_path / "out"))
    expect_checkpoint(tmp_path / "out", v1)


# The anchor budget: a version written FULL once the chain since the last
# FULL is long (anchor_every) or heavy (anchor_bytes) enough.

def index_metadata(directory):
    return delta_reference.read_index(str(directory))["metadata"]


def expect_kind(directory, kind, version):
    """The directory holds `version` as a `kind` ("FULL" / "DELTA") version,
    by its index and by stitch.verify."""
    metadata = index_metadata(directory)
    assert ("delta_encoding" in metadata) == (kind == "DELTA"), (directory, metadata)
    assert int(metadata["version"]) == version
    report = stitch.verify(str(directory))
    assert report["kind"] == kind and report["version"] == version


def test_anchor_every_writes_every_fourth_version_full(tmp_path):
    steps = [weights(0)]
    for step in range(1, 9):
        steps.append(perturb(steps[-1], step))
    enc = stitch.DeltaEncoder(steps[0], version=0, run_id=RUN, anchor_every=3)
    assert enc.anchor_every == 3 and not enc.anchor_due()
    anchor = tmp_path / "weight_v000000"
    enc.write_anchor(str(anchor))
    results = {}
    for version in range(1, 9):
        due = enc.anchor_due()
        result = enc.encode(steps[version], str(tmp_path / f"weight_v{version:06d}"))
        assert result["version"] == version and enc.version == version
        assert result["anchor"] is due, version
        results[version] = result
    # Version 0 is the first anchor: three DELTAs, then a FULL, twice.
    assert [v for v, r in results.items() if r["anchor"]] == [4, 8]
    assert (enc.chain_deltas, enc.chain_bytes) == (0, 0)
    for version, result in results.items():
        kind = "FULL" if version in (4, 8) else "DELTA"
        expect_kind(result["dir"], kind, version)
        if kind == "DELTA":
            assert result["base_version"] == version - 1
    # A budget FULL holds exactly the weights given, and the DELTAs after it
    # apply to it.
    expect_checkpoint(results[4]["dir"], steps[4])
    expect_checkpoint(results[8]["dir"], steps[8])
    stitch.apply_chain(results[4]["dir"], [results[v]["dir"] for v in (5, 6, 7)],
                       str(tmp_path / "out7"))
    expect_checkpoint(tmp_path / "out7", steps[7])
    stitch.apply_chain(str(anchor), [results[v]["dir"] for v in (1, 2, 3)], str(tmp_path / "out3"))
    expect_checkpoint(tmp_path / "out3", steps[3])


def test_anchor_every_counts_from_an_explicit_full_version(tmp_path):
    v = [weights(0)]
    for step in range(1, 6):
        v.append(perturb(v[-1], step))
    enc = stitch.DeltaEncoder(v[0], version=0, run_id=RUN, anchor_every=2)
    assert not enc.encode(v[1], str(tmp_path / "weight_v000001"))["anchor"]
    assert enc.chain_deltas == 1
    # full=True is the caller's FULL, not the budget's, and restarts the count.
    forced = enc.encode(v[2], str(tmp_path / "weight_v000002"), full=True)
    assert forced["anchor"] is False and (enc.chain_deltas, enc.chain_bytes) == (0, 0)
    expect_kind(forced["dir"], "FULL", 2)
    got = [enc.encode(v[n], str(tmp_path / f"weight_v{n:06d}"))["anchor"] for n in (3, 4, 5)]
    assert got == [False, False, True]
    expect_kind(tmp_path / "weight_v000005", "FULL", 5)


def test_without_a_budget_every_version_is_a_delta(tmp_path):
    v = weights(0)
    enc = stitch.DeltaEncoder(v, version=0, run_id=RUN)
    for version in range(1, 7):
        v = perturb(v, version)
        result = enc.encode(v, str(tmp_path / f"weight_v{version:06d}"))
        assert result["anchor"] is False and not enc.anchor_due()
        expect_kind(result["dir"], "DELTA", version)
    assert enc.chain_deltas == 6


def dense(seed):
    """Weights whose every byte is random: a DELTA between two of them is
    as large as a FULL version."""
    rng = np.random.default_rng(seed)
    return {
        "a": rng.integers(0, 1 << 32, size=(64, 64), dtype=np.uint32),
        # Random float32 bit patterns (NaNs included: only the bytes matter).
        "b": rng.integers(0, 1 << 32, size=300, dtype=np.uint32).view(np.float32),
    }


def test_anchor_bytes_writes_full_once_the_deltas_weigh_a_full_version(tmp_path):
    steps = [dense(s) for s in range(7)]
    full_bytes = sum(t.nbytes for t in steps[0].values())
    enc = stitch.DeltaEncoder(steps[0], version=0, run_id=RUN, anchor_bytes=True)
    assert not enc.anchor_due()  # the first anchor has no chain behind it
    anchor = tmp_path / "weight_v000000"
    enc.write_anchor(str(anchor))
    chain, anchors, last_full = 0, [], 0
    for version in range(1, 7):
        due = enc.anchor_due()
        assert due == (chain >= full_bytes and chain > 0), version
        result = enc.encode(steps[version], str(tmp_path / f"weight_v{version:06d}"))
        assert result["anchor"] is due
        if due:
            anchors.append(version)
            expect_kind(result["dir"], "FULL", version)
            expect_checkpoint_dense(result["dir"], steps[version])
            chain, last_full = 0, version
        else:
            # Every value changed: the DELTA rewrites every tensor.
            assert result["changed_tensors"] == 2
            expect_kind(result["dir"], "DELTA", version)
            chain += result["payload_bytes"]
            base = tmp_path / f"weight_v{last_full:06d}"
            out = tmp_path / f"out{version}"
            stitch.apply_chain(str(base), [str(tmp_path / f"weight_v{n:06d}")
                                           for n in range(last_full + 1, version + 1)], str(out))
            expect_checkpoint_dense(out, steps[version])
        assert (enc.chain_bytes, enc.chain_deltas) == (chain, version - last_full)
    # Random bytes do not compress: one DELTA weighs a FULL version, so
    # every second version is FULL.
    assert anchors == [2, 4, 6]


def expect_checkpoint_dense(directory, tensors):
    got = delta_reference.read_checkpoint(str(directory))
    assert set(got) == set(tensors)
    for name, value in tensors.items():
        assert np.array_equal(got[name][2], raw(value)), name
    assert got["a"][0] == "U32" and got["b"][0] == "F32"


def test_anchor_bytes_keeps_small_deltas_chained(tmp_path):
    rng = np.random.default_rng(7)
    v = {"w": rng.standard_normal((256, 256), dtype=np.float32)}
    enc = stitch.DeltaEncoder(v, version=0, run_id=RUN, anchor_bytes=True)
    total = 0
    for version in range(1, 7):
        v = perturb(v, version)
        assert not enc.anchor_due()
        result = enc.encode(v, str(tmp_path / f"weight_v{version:06d}"))
        total += result["payload_bytes"]
        assert result["anchor"] is False
        expect_kind(result["dir"], "DELTA", version)
    assert enc.chain_bytes == total < v["w"].nbytes and enc.chain_deltas == 6


def test_anchor_every_and_anchor_bytes_together_take_whichever_comes_first(tmp_path):
    steps = [dense(s) for s in range(4)]
    # The count budget is far away; the byte budget decides.
    enc = stitch.DeltaEncoder(steps[0], version=0, run_id=RUN, anchor_every=100, anchor_bytes=True)
    kinds = []
    for version in range(1, 4):
        due = enc.anchor_due()
        kinds.append(enc.encode(steps[version], str(tmp_path / f"a{version}"))["anchor"])
        assert kinds[-1] is due
    assert True in kinds
    # The byte budget is never met by empty deltas; the count budget decides.
    w = weights(0)
    enc = stitch.DeltaEncoder(w, version=0, run_id=RUN, anchor_every=2, anchor_bytes=True)
    got = [enc.encode(w, str(tmp_path / f"b{n}"))["anchor"] for n in range(1, 7)]
    assert got == [False, False, True, False, False, True]


def test_a_negative_anchor_every_is_refused():
    with pytest.raises(stitch.InvalidArgument, match="anchor_every") as info:
        stitch.DeltaEncoder(weights(0), version=0, run_id=RUN, anchor_every=-1)
    assert info.value.code == "INVALID_ARGUMENT"
    # 0 is no count budget.
    assert not stitch.DeltaEncoder(weights(0), version=0, run_id=RUN, anchor_every=0).anchor_due()
