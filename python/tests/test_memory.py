"""DeltaEncoder reads the trainer's arrays in place: encoding 1 GiB of
weights raises peak memory by the one snapshot copy and nothing more."""

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import os, resource, sys, tempfile
    import numpy as np
    import stitch
    from dlpack_standin import KDL_BFLOAT, DLPackOnly

    mib = 1 << 20
    n = 1024 * mib // 2
    w = np.empty(n, dtype=np.uint16)  # 1 GiB of bfloat16 bits, every page touched
    chunk = 1 << 20
    pattern = (np.arange(chunk, dtype=np.uint32) * 2654435761 >> 16).astype(np.uint16)
    for i in range(0, n, chunk):  # in chunks: no temporary as big as the array
        w[i:i + chunk] = pattern ^ (i >> 20)
    wrap = (lambda a: DLPackOnly(a, code=KDL_BFLOAT, bits=16)) if sys.argv[1] == "dlpack" \\
        else (lambda a: (a, "BF16"))
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = peak()
    enc = stitch.DeltaEncoder({"w": wrap(w)}, version=0, run_id="run-1")  # the snapshot copy
    w[::100] ^= 1  # 1% of values change, in place
    before = peak()
    with tempfile.TemporaryDirectory() as tmp:
        result = enc.encode({"w": wrap(w)}, os.path.join(tmp, "weight_v000001"))
    after = peak()
    assert result["changed_tensors"] == 1
    print((before - start) // mib, (after - before) // mib)
""")


@pytest.mark.parametrize("kind", ["numpy", "dlpack"])
def test_encoding_1_gib_raises_peak_memory_by_the_snapshot_only(kind):
    out = subprocess.run([sys.executable, "-c", CHILD, kind], check=True, capture_output=True,
                         text=True, cwd=__import__("os").path.dirname(__file__))
    snapshot_mib, encode_mib = map(int, out.stdout.split())
    # The snapshot is one 1 GiB copy; encoding adds chunk buffers and the
    # compressed frames (tens of MiB). Any copy of the array would add 1 GiB.
    assert snapshot_mib <= 1024 + 16, f"the snapshot took {snapshot_mib} MiB"
    assert encode_mib < 64, f"peak memory grew by {encode_mib} MiB while encoding 1 GiB"
