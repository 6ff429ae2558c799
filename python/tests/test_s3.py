"""The same calls against an S3 store (a local moto server, SigV4 enforced)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import stitch

from conftest import REPO

RUN = "run-1"


@pytest.fixture(scope="module")
def s3():
    if shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("moto_server is not installed (scripts/requirements-test.txt)")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "s3_moto.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("tests/s3_moto.py exited before printing its endpoint")
        yield json.loads(line)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_claim_publish_and_conflict_on_s3(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret_access_key"])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    uri = f"s3://{s3['bucket']}/runs/a?endpoint={s3['endpoint']}&region={s3['region']}"
    store = stitch.open_store(uri, RUN, cache_dir=str(tmp_path / "cache"))
    other = stitch.open_store(uri, RUN, cache_dir=str(tmp_path / "cache2"))
    assert stitch.claim_run(store, RUN, boot_version=0).moved

    w = {"w": np.arange(1000, dtype=np.float32)}
    enc = stitch.DeltaEncoder(w, version=0, run_id=RUN)
    v1 = enc.encode(w, str(tmp_path / "weight_v000001"), full=True)["dir"]
    assert stitch.publish_version(store, v1, RUN) == stitch.VersionRef(RUN, 1)
    w2 = {"w": w["w"] + 1}
    v2 = enc.encode(w2, str(tmp_path / "weight_v000002"))["dir"]
    assert stitch.publish_version(store, v2, RUN) == stitch.VersionRef(RUN, 2)

    other.refresh()
    assert other.read_pointer() == stitch.VersionRef(RUN, 2)
    out = tmp_path / "out"
    stitch.apply_chain(other.materialize(1), [other.materialize(2)], str(out))
    assert stitch.verify(other.materialize(2), base_dir=other.materialize(1))["checksums_verified"]

    with pytest.raises(stitch.PointerConflict):
        store.advance_pointer(stitch.VersionRef(RUN, 1), stitch.VersionRef(RUN, 3))
    with pytest.raises(stitch.PointerRewind):
        store.advance_pointer(stitch.VersionRef(RUN, 2), stitch.VersionRef(RUN, 1))
