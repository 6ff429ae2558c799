"""The same calls against an S3 store (a local moto server, SigV4 enforced)."""

import json
import os

import numpy as np
import pytest

import stitch

RUN = "run-1"


def s3_uri(s3, monkeypatch, prefix):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret_access_key"])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return f"s3://{s3['bucket']}/{prefix}?endpoint={s3['endpoint']}&region={s3['region']}"


def test_claim_publish_and_conflict_on_s3(s3, tmp_path, monkeypatch):
    uri = s3_uri(s3, monkeypatch, "runs/a")
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


def split_by_host(full_dir, root):
    """Rewrites the one-shard version `full_dir` as two shards, tensor a on
    host 0 and tensor b on host 1, each host holding the index and only its
    own shard, the way node-local disks of a trainer look. Each shard keeps
    its tensor's recorded checksum."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with open(os.path.join(full_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    (shard,) = set(index["weight_map"].values())
    tensors = load_file(os.path.join(full_dir, shard))
    with safe_open(os.path.join(full_dir, shard), "np") as f:
        checksums = f.metadata()
    files = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    index["weight_map"] = files
    hosts = []
    for name in ("a", "b"):
        d = root / f"host-{name}" / os.path.basename(full_dir)
        d.mkdir(parents=True)
        save_file({name: tensors[name]}, str(d / files[name]), metadata={name: checksums[name]})
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        hosts.append((d, files[name]))
    return hosts


def test_two_hosts_upload_their_own_shards_and_rank0_publishes(s3, tmp_path, monkeypatch):
    """The multi-host protocol against S3: two ranks (threads), each the
    leader of its own host, each uploading only its host's shard; the
    version exists once both uploads are verified."""
    from safetensors.numpy import load_file
    from test_publisher import ThreadComms, group, run_ranks

    uri = s3_uri(s3, monkeypatch, "runs/multihost")
    assert stitch.claim_run(stitch.open_store(uri, RUN, cache_dir=str(tmp_path / "c")), RUN, 0).moved
    w = {"a": np.arange(1000, dtype=np.float32), "b": np.full(500, 7, np.float32)}
    full = stitch.DeltaEncoder(w, version=0, run_id=RUN).encode(
        w, str(tmp_path / "trainer" / "weight_v000001"), full=True)["dir"]
    hosts = split_by_host(full, tmp_path)
    g = group(2)

    def rank_body(rank):
        store = stitch.open_store(uri, RUN, cache_dir=str(tmp_path / f"cache{rank}"))
        pub = stitch.Publisher(store, run_id=RUN, comms=ThreadComms(g, rank, 1))
        host_dir, shard = hosts[rank]
        return pub.publish(str(host_dir), files=[shard])

    results = run_ranks(2, rank_body)
    assert results == [stitch.VersionRef(RUN, 1)] * 2, results

    reader = stitch.open_store(uri, RUN, cache_dir=str(tmp_path / "reader"))
    assert reader.read_pointer() == stitch.VersionRef(RUN, 1)
    got = reader.materialize(1)
    stitch.verify(got)  # raises on a missing, short or undecodable file
    for (_, shard), name in zip(hosts, "ab"):
        np.testing.assert_array_equal(load_file(os.path.join(got, shard))[name], w[name])
