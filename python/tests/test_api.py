"""Round trips through a temporary filesystem store."""

import json
import os

import numpy as np
import pytest

import stitch


def make_version(encoder_dir, version, run_id, seed=0):
    rng = np.random.default_rng(seed)
    tensors = {"w": rng.standard_normal((4, 8), dtype=np.float32)}
    enc = stitch.DeltaEncoder(tensors, version=version - 1, run_id=run_id)
    out = os.path.join(encoder_dir, stitch.VersionRef(run_id, version).dir_name)
    enc.encode(tensors, out, full=True)
    return out


def test_version_ref_parses_and_prints():
    ref = stitch.VersionRef.parse("run-1/weight_v000007")
    assert ref.run_id == "run-1" and ref.version == 7
    assert str(ref) == "run-1/weight_v000007"
    assert ref == stitch.VersionRef("run-1", 7)
    assert ref != stitch.VersionRef("run-1", 8) and ref != stitch.VersionRef("run-2", 7)
    assert ref != "run-1/weight_v000007" and ref != None  # noqa: E711 - other types compare unequal
    assert len({ref, stitch.VersionRef("run-1", 7)}) == 1
    assert ref.dir_name == "weight_v000007"
    with pytest.raises(stitch.InvalidArgument):
        stitch.VersionRef.parse("not a version")


def test_version_constraint_round_trips_json():
    c = stitch.VersionConstraint.at_least(5)
    assert c.min_version == 5 and not c.is_exact
    assert c.satisfied_by(6) and not c.satisfied_by(4) and not c.satisfied_by(None)
    assert stitch.VersionConstraint.from_json(c.to_json()) == c
    e = stitch.VersionConstraint.exact(3)
    assert e.is_exact and e.target == 3
    assert stitch.VersionConstraint().empty
    assert stitch.VersionConstraint.for_request(latest=10, lag=2) == stitch.VersionConstraint.at_least(8)


def test_constrain_request_sets_constraint_and_affinity():
    payload, headers = stitch.constrain_request(
        {"text": "hi"}, {"a": "b"}, latest=7, lag=2, session_id="g1", affinity_header="X-Session")
    assert payload["text"] == "hi"
    assert payload["weight_version"] == {"min_version": 5}
    assert headers == {"a": "b", "X-Session": "g1"}
    exact, _ = stitch.constrain_request({}, None, latest=7, exact=3)
    assert exact["weight_version"] == {"exact_version": 3}
    unconstrained, _ = stitch.constrain_request({"x": 1, "weight_version": {"min_version": 1}})
    assert unconstrained == {"x": 1}


def test_constrain_request_sets_max_staleness_alone_or_with_min_version():
    fresh, _ = stitch.constrain_request({}, max_staleness=1)
    assert fresh["weight_version"] == {"max_staleness": 1}
    both, _ = stitch.constrain_request({}, latest=7, lag=2, max_staleness=0)
    assert both["weight_version"] == {"min_version": 5, "max_staleness": 0}
    c = stitch.VersionConstraint.for_request(max_staleness=2)
    assert c.max_staleness == 2 and not c.empty
    with pytest.raises(ValueError):
        stitch.constrain_request({}, max_staleness=-1)
    from stitch.publish import constrain_request as constrain_in_place
    payload, headers = {}, {}
    constrain_in_place(payload, headers, latest=3, max_staleness=1)
    assert payload["weight_version"] == {"min_version": 3, "max_staleness": 1}


def test_claim_publish_and_read_pointer(tmp_path):
    store = stitch.open_store(f"file://{tmp_path}/store", "run-1")
    assert store.run_id == "run-1"
    assert store.read_pointer() is None
    outcome = stitch.claim_run(store, "run-1", boot_version=0)
    assert outcome.moved and outcome.previous is None
    assert store.read_pointer() == stitch.VersionRef("run-1", 0)
    again = stitch.claim_run(store, "run-1", boot_version=0)
    assert not again.moved

    v1 = make_version(tmp_path / "work", 1, "run-1")
    assert stitch.publish_version(store, v1, "run-1") == stitch.VersionRef("run-1", 1)
    assert store.read_pointer() == stitch.VersionRef("run-1", 1)
    assert os.path.isdir(store.materialize(1))


def test_only_claim_run_creates_a_missing_store(tmp_path):
    root = tmp_path / "store"
    store = stitch.open_store(str(root), "run-1")
    assert not root.exists()  # opening creates nothing
    v1 = make_version(tmp_path / "work", 1, "run-1")
    with pytest.raises(stitch.StoreError) as info:
        stitch.publish_version(store, v1, "run-1")
    assert "claim it first" in str(info.value) and "stitch.claim_run" in str(info.value)
    assert not root.exists()
    assert stitch.claim_run(store, "run-1", boot_version=0).moved
    assert (root / "latest").is_file()
    assert stitch.publish_version(store, v1, "run-1") == stitch.VersionRef("run-1", 1)


def test_publish_verifies_before_the_pointer_moves(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), "run-1")
    stitch.claim_run(store, "run-1", boot_version=0)
    # A gap: replicas would never meet version 1.
    with pytest.raises(stitch.StoreError, match="next version must be weight_v000001"):
        stitch.publish_version(store, make_version(tmp_path / "a", 2, "run-1"), "run-1")
    # A FULL version whose bytes no longer match their recorded checksums.
    v1 = make_version(tmp_path / "b", 1, "run-1")
    shard = next(p for p in os.listdir(v1) if p.endswith(".safetensors"))
    with open(os.path.join(v1, shard), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(stitch.ChecksumMismatch):
        stitch.publish_version(store, v1, "run-1")
    assert store.read_pointer() == stitch.VersionRef("run-1", 0)


def test_publishing_an_older_version_is_a_rewind(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), "run-1")
    stitch.claim_run(store, "run-1", boot_version=0)
    stitch.publish_version(store, make_version(tmp_path / "a", 1, "run-1"), "run-1")
    stitch.publish_version(store, make_version(tmp_path / "a", 2, "run-1"), "run-1")
    with pytest.raises(stitch.PointerRewind) as info:
        store.advance_pointer(stitch.VersionRef("run-1", 2), stitch.VersionRef("run-1", 1))
    assert isinstance(info.value, stitch.StoreError)
    assert "weight_v000001" in str(info.value) or "rewind" in str(info.value).lower()


def test_concurrent_pointer_change_is_a_conflict(tmp_path):
    uri = str(tmp_path / "store")
    mine = stitch.open_store(uri, "run-1")
    theirs = stitch.open_store(uri, "run-1")
    stitch.claim_run(mine, "run-1", boot_version=0)
    seen = mine.read_pointer()
    theirs.advance_pointer(seen, stitch.VersionRef("run-1", 5))
    with pytest.raises(stitch.PointerConflict) as info:
        mine.advance_pointer(seen, stitch.VersionRef("run-1", 1))
    err = info.value
    assert isinstance(err, stitch.StoreError)
    assert err.code == "ABORTED"
    assert err.expected == stitch.VersionRef("run-1", 0)
    assert err.actual == stitch.VersionRef("run-1", 5)
    assert err.proposed == stitch.VersionRef("run-1", 1)


def test_store_scoped_to_another_run_is_refused(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), "run-1")
    with pytest.raises(stitch.InvalidArgument):
        stitch.claim_run(store, "run-2")


def test_missing_version_dir_raises_a_stitch_error(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), "run-1")
    with pytest.raises(stitch.StitchError):
        stitch.publish_version(store, str(tmp_path / "weight_v000001"), "run-1")


def test_a_bad_pool_spec_is_an_invalid_argument(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), "run-1")
    with pytest.raises(stitch.InvalidArgument):
        stitch.claim_run(store, "run-1", pool="gopher:nowhere")
    assert store.read_pointer() is None
