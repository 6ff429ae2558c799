"""The original Python Stitch's import paths, signatures and semantics, as
thin aliases over this package's API: stitch.types, stitch.publish,
stitch.publisher, stitch.stores, stitch.pools / stitch.service and
stitch.errors. Each test names the behaviour it pins."""

import asyncio
import hashlib
import http.server
import inspect
import json
import logging
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import stitch
import stitch.errors
import stitch.pools
import stitch.publish
import stitch.publisher
import stitch.service
import stitch.stores
import stitch.types
from stitch.pools.base import Pool, SpecPool
from stitch.stores import FsStore, S3Store
from stitch.types import VersionConstraint, VersionRef

RUN = "run-1"
HERE = os.path.dirname(os.path.abspath(__file__))


def full_version(parent, version, value=1.0, config=True):
    """A FULL version directory (checksums recorded) plus the config and
    tokenizer files a framework writes beside the weights."""
    w = {"w": np.full(16, value, np.float32)}
    out = stitch.DeltaEncoder(w, version=version - 1, run_id=RUN).encode(
        w, os.path.join(str(parent), f"weight_v{version:06d}"), full=True)["dir"]
    if config:
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump({"model_type": "llama"}, f)
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            json.dump({"model": {}}, f)
    return out


class FakeReplica:
    """A replica's /server_info and /wake, and a gateway's /health, on
    loopback. `states` are the /server_info answers, one per probe (the last
    one repeats); `health` the /health statuses likewise."""

    def __init__(self, states=({"ready": True},), health=(200,)):
        replica = self
        self.states, self.health = list(states), list(health)
        self.paths, self.woken = [], threading.Event()
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's name
                with replica.lock:
                    replica.paths.append(self.path)
                    if self.path == "/server_info":
                        state = replica.states.pop(0) if len(replica.states) > 1 else replica.states[0]
                        return self.answer(200, state)
                    status = replica.health.pop(0) if len(replica.health) > 1 else replica.health[0]
                self.answer(status, {"ready": status == 200})

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with replica.lock:
                    replica.paths.append(self.path)
                self.answer(200, {})
                replica.woken.set()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replica():
    r = FakeReplica()
    yield r
    r.close()


class RecordingPool(Pool):
    """An original-style Pool: the trainer's own discovery."""

    def __init__(self, urls=(), gateway=None, fail=False):
        self.urls, self.gateway, self.fail = list(urls), gateway, fail
        self.wakes = []

    def gateway_url(self):
        return self.gateway

    def discover_replicas(self):
        if self.fail:
            raise ConnectionError("control plane down")
        return list(self.urls)

    def wake(self, replicas, ref):
        self.wakes.append((list(replicas), ref))


def closed_port_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


# ---- stitch.types ----

def test_types_are_the_flat_apis_classes():
    assert stitch.types.VersionRef is stitch.VersionRef
    assert stitch.types.VersionConstraint is stitch.VersionConstraint
    assert stitch.types.PointerRewind is stitch.errors.PointerRewind is stitch.PointerRewind
    assert stitch.types.PointerConflict is stitch.errors.PointerConflict
    assert stitch.types.WEIGHT_PREFIX == "weight_v"


def test_version_ref_has_the_originals_constructor_identity_and_parse():
    assert VersionRef(RUN, 7).identity == "run-1/weight_v000007"
    bare = VersionRef(None, 7)
    assert bare.run_id is None and bare.identity == "weight_v000007"
    assert VersionRef.parse("weight_v000007") == bare
    assert VersionRef.parse("run-1/weight_v000042") == VersionRef(RUN, 42)
    assert VersionRef.parse("12") == VersionRef(None, 12)  # legacy bare digits
    assert len({VersionRef(RUN, 1), VersionRef(RUN, 1)}) == 1
    with pytest.raises(ValueError):
        VersionRef.parse("run-1/weight_vX")  # never read as "boot weights"


def test_version_constraint_reads_and_writes_the_originals_payload():
    c = VersionConstraint.from_payload({"weight_version": {"min_version": "3", "exact_version": None}})
    assert (c.min_version, c.exact_version) == (3, None)
    assert c.to_payload() == {"min_version": 3, "exact_version": None}
    assert VersionConstraint.from_payload({"weight_version": {"exact_version": 5}}).exact_version == 5
    for empty in (None, {}, {"weight_version": None}, {"weight_version": "3"}):
        assert VersionConstraint.from_payload(empty) == VersionConstraint()
    assert VersionConstraint().satisfied_by(None) and VersionConstraint().satisfied_by(4)
    assert not VersionConstraint(min_version=2).satisfied_by(None)
    assert VersionConstraint(exact_version=3).satisfied_by(3)
    assert not VersionConstraint(exact_version=3).satisfied_by(4)


def test_decide_pointer_move_follows_the_originals_rules():
    assert stitch.types.decide_pointer_move(None, VersionRef(RUN, 0)).reset
    forward = stitch.types.decide_pointer_move(VersionRef(RUN, 1), VersionRef(RUN, 2))
    assert forward == stitch.types.PointerMove(VersionRef(RUN, 2), False)
    assert stitch.types.decide_pointer_move(VersionRef("run-0", 9), VersionRef(RUN, 0)).reset
    for rewind in (VersionRef(RUN, 2), VersionRef(RUN, 1)):
        with pytest.raises(stitch.types.PointerRewind) as info:
            stitch.types.decide_pointer_move(VersionRef(RUN, 2), rewind)
        assert info.value.current == VersionRef(RUN, 2) and info.value.proposed == rewind


def test_replica_and_pool_state_read_a_server_info():
    s = stitch.types.ReplicaState.from_dict(
        {"ready": True, "applied": "run-1/weight_v000003", "sync_state": "IDLE", "reason": "ok",
         "active_requests": 2})
    assert s.at(VersionRef(RUN, 3)) and not s.at(VersionRef(RUN, 4))
    assert s.sync_state is stitch.types.SyncState.IDLE
    assert stitch.types.ReplicaState.from_dict(s.to_dict()) == s
    assert not stitch.types.ReplicaState.from_dict({"applied": None, "sync_state": "BOGUS"}).ready
    errored = stitch.types.ReplicaState(True, VersionRef(RUN, 3), stitch.types.SyncState.ERROR)
    assert not errored.at(VersionRef(RUN, 3))


def test_version_manifest_reads_an_index(tmp_path):
    m = stitch.types.VersionManifest.from_hf_index(full_version(tmp_path, 4), run_id=RUN)
    assert m.ref == VersionRef(RUN, 4)
    assert m.kind is stitch.types.VersionKind.FULL
    assert m.files == ["model-00001-of-00001.safetensors"]


# ---- stitch.errors ----

def test_the_originals_error_constructors_build_the_same_classes():
    conflict = stitch.errors.PointerConflict(VersionRef(RUN, 1), None, VersionRef(RUN, 2))
    assert isinstance(conflict, stitch.StoreError)
    assert (conflict.expected, conflict.actual, conflict.proposed) == (
        VersionRef(RUN, 1), None, VersionRef(RUN, 2))
    assert "run-1/weight_v000002" in str(conflict) and "<unset>" in str(conflict)
    rewind = stitch.errors.PointerRewind(VersionRef(RUN, 5), VersionRef(RUN, 3))
    assert (rewind.current, rewind.proposed) == (VersionRef(RUN, 5), VersionRef(RUN, 3))
    assert "refusing to rewind" in str(rewind)
    assert issubclass(stitch.errors.UnrecoverableEngineError, stitch.errors.UnrecoverableSidecarError)
    assert issubclass(stitch.errors.UnrecoverableSidecarError, RuntimeError)
    assert str(stitch.errors.UnrecoverableEngineError("engine gone")) == "engine gone"


def test_a_conflict_from_the_core_carries_version_refs(tmp_path):
    store = FsStore(tmp_path / "store", run_id=RUN)
    store.claim(VersionRef(RUN, 0))
    FsStore(tmp_path / "store", run_id=RUN).advance_pointer(VersionRef(RUN, 5))
    with pytest.raises(stitch.types.PointerConflict) as info:
        store.compare_and_advance_pointer(VersionRef(RUN, 0), VersionRef(RUN, 1))
    assert info.value.expected == VersionRef(RUN, 0)
    assert info.value.actual == VersionRef(RUN, 5)
    assert info.value.proposed == VersionRef(RUN, 1)


# ---- stitch.publish ----

def test_publish_version_takes_the_originals_signature_and_wakes_a_pool_object(tmp_path):
    store = FsStore(tmp_path / "store", run_id=RUN)
    pool = RecordingPool(["http://r0", "http://r1"])
    assert stitch.publish.claim_run(store, pool, RUN, boot_version=0) is None
    ref = stitch.publish.publish_version(store, pool, full_version(tmp_path / "src", 1), run_id=RUN)
    assert ref == VersionRef(RUN, 1) == store.read_pointer()
    assert pool.wakes == [(["http://r0", "http://r1"], VersionRef(RUN, 0)),
                          (["http://r0", "http://r1"], VersionRef(RUN, 1))]


def test_publish_version_wakes_the_replicas_of_a_pool_spec(tmp_path, replica):
    store = FsStore(tmp_path / "store", run_id=RUN)
    stitch.publish.claim_run(store, None, RUN)
    stitch.publish.publish_version(store, f"static:{replica.url}", full_version(tmp_path, 1),
                                   run_id=RUN)
    assert replica.woken.wait(10) and "/wake" in replica.paths


def test_publish_version_refuses_a_store_of_another_run(tmp_path):
    store = FsStore(tmp_path / "store", run_id=RUN)
    stitch.publish.claim_run(store, None, RUN)
    with pytest.raises(ValueError):
        stitch.publish.publish_version(store, None, full_version(tmp_path, 1), run_id="run-2")


def test_publish_version_refuses_a_delta_encoded_against_other_weights(tmp_path):
    # The original's publish_version takes no base checkpoint: the index
    # fingerprints are what tell a delta made from other weights.
    store = FsStore(tmp_path / "store", run_id=RUN)
    stitch.publish.claim_run(store, None, RUN)
    stitch.publish.publish_version(store, None, full_version(tmp_path / "a", 1, 1.0), run_id=RUN)
    target = {"w": np.full(16, 2.0, np.float32)}

    def delta(parent, base_value):
        base = {"w": np.full(16, base_value, np.float32)}
        return stitch.DeltaEncoder(base, version=1, run_id=RUN).encode(
            target, os.path.join(str(parent), "weight_v000002"))["dir"]

    with pytest.raises(stitch.errors.ChecksumMismatch, match="encoded against other weights"):
        stitch.publish.publish_version(store, None, delta(tmp_path / "b", 5.0), run_id=RUN)
    assert store.read_pointer() == VersionRef(RUN, 1)
    stitch.publish.publish_version(store, None, delta(tmp_path / "c", 1.0), run_id=RUN)
    assert store.read_pointer() == VersionRef(RUN, 2)


def test_claim_run_is_idempotent_wakes_every_time_and_refuses_a_reused_run_id(tmp_path):
    store = FsStore(tmp_path / "store", run_id=RUN)
    pool = RecordingPool(["http://r0"])
    stitch.publish.claim_run(store, pool, RUN, boot_version=0)
    stitch.publish.claim_run(store, pool, RUN, boot_version=0)  # a retried launch
    assert store.read_pointer() == VersionRef(RUN, 0) and len(pool.wakes) == 2
    stitch.publish.publish_version(store, None, full_version(tmp_path, 1), run_id=RUN)
    with pytest.raises(stitch.types.PointerRewind):
        stitch.publish.claim_run(store, pool, RUN, boot_version=0)
    with pytest.raises(ValueError):
        stitch.publish.claim_run(store, None, RUN, boot_version=-1)


def test_wake_pool_is_best_effort(tmp_path, caplog):
    stitch.publish.wake_pool(None, VersionRef(RUN, 1))
    with caplog.at_level(logging.WARNING, logger="stitch"):
        stitch.publish.wake_pool(RecordingPool(fail=True), VersionRef(RUN, 1))
    assert "replicas will catch up" in caplog.text


def test_constrain_request_mutates_the_payload_and_headers_in_place():
    payload, headers = {"text": "hi", "weight_version": {"exact_version": 1}}, {"a": "b"}
    assert stitch.publish.constrain_request(payload, headers, latest=7, lag=2, session_id=3,
                                            affinity_header="X-Session-Id") is None
    assert payload == {"text": "hi", "weight_version": {"min_version": 5}}
    assert headers == {"a": "b", "X-Session-Id": "3"}
    stitch.publish.constrain_request(payload, headers, latest=1, lag=4)
    assert payload["weight_version"] == {"min_version": 0}  # never below 0
    stitch.publish.constrain_request(payload, headers, latest=9, exact=4)
    assert payload["weight_version"] == {"exact_version": 4}
    stitch.publish.constrain_request(payload, headers)
    assert "weight_version" not in payload  # any version
    assert VersionConstraint.from_payload(payload) == VersionConstraint()
    stitch.publish.constrain_request(payload, headers, session_id="s")  # no header name: untouched
    assert headers == {"a": "b", "X-Session-Id": "3"}


# ---- publishing again ----

def test_republishing_the_published_version_with_its_bytes_is_a_logged_no_op(tmp_path, caplog):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    stitch.claim_run(store, RUN)
    v1 = full_version(tmp_path / "a", 1)
    assert stitch.publish_version(store, v1, RUN) == VersionRef(RUN, 1)
    with caplog.at_level(logging.INFO, logger="stitch"):
        assert stitch.publish_version(store, full_version(tmp_path / "b", 1), RUN) == VersionRef(RUN, 1)
    assert "already published" in caplog.text
    assert store.read_pointer() == VersionRef(RUN, 1)


def test_republishing_the_published_version_with_other_bytes_names_the_file(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    stitch.claim_run(store, RUN)
    stitch.publish_version(store, full_version(tmp_path / "a", 1), RUN)
    other = full_version(tmp_path / "b", 1)
    with open(os.path.join(other, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3"}, f)
    with pytest.raises(stitch.StoreError, match='"config.json" differs') as info:
        stitch.publish_version(store, other, RUN)
    assert "publish new weights as weight_v000002" in str(info.value)
    assert "\n" not in str(info.value)
    assert store.read_pointer() == VersionRef(RUN, 1)


def test_a_published_version_directory_carries_its_config_and_tokenizer(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    stitch.claim_run(store, RUN)
    stitch.publish_version(store, full_version(tmp_path / "a", 1), RUN)
    published = store.materialize(1)
    with open(os.path.join(published, "config.json")) as f:
        assert json.load(f) == {"model_type": "llama"}
    assert os.path.isfile(os.path.join(published, "tokenizer.json"))


# ---- stitch.publisher ----

class OriginalComms(stitch.publisher.TrainerComms):
    """An original-style comms: rank, all_gather_object, is_host_leader only,
    ranks as threads."""

    def __init__(self, group, rank):
        self.group, self._rank = group, rank

    def rank(self):
        return self._rank

    def is_host_leader(self):
        return True

    def all_gather_object(self, value):
        g = self.group
        g["slots"][self._rank] = value
        g["barrier"].wait(timeout=60)
        out = list(g["slots"])
        g["barrier"].wait(timeout=60)
        return out


def test_publisher_with_the_originals_signature_claims_publishes_and_wakes(tmp_path):
    store = FsStore(tmp_path / "store", run_id=RUN)
    pool = RecordingPool(["http://r0"])
    pub = stitch.publisher.Publisher(store, pool, run_id=RUN)
    pub.claim(boot_version=0)
    assert pub.publish(full_version(tmp_path / "run", 1)) == VersionRef(RUN, 1)
    assert store.read_pointer() == VersionRef(RUN, 1)
    assert [ref for _, ref in pool.wakes] == [VersionRef(RUN, 0), VersionRef(RUN, 1)]
    # The framework's run directory (a durability boundary in the original).
    assert pub.publish(str(tmp_path / "run")) is None
    assert store.read_pointer() == VersionRef(RUN, 1)


def test_the_default_trainer_comms_is_one_process(tmp_path):
    comms = stitch.publisher.TrainerComms()
    assert comms.rank() is None and comms.is_host_leader()
    assert comms.all_gather_object({"x": 1}) == [{"x": 1}]
    assert stitch.TrainerComms is stitch.publisher.TrainerComms
    store = FsStore(tmp_path / "store", run_id=RUN)
    pub = stitch.publisher.Publisher(store, run_id=RUN, comms=comms)
    pub.claim(boot_version=0)
    assert pub.publish(full_version(tmp_path, 1)) == VersionRef(RUN, 1)


def test_an_original_style_comms_publishes_from_two_ranks(tmp_path):
    root = tmp_path / "store"
    stitch.publish.claim_run(FsStore(root, run_id=RUN), None, RUN)
    version_dir = full_version(tmp_path / "shared", 1)
    g = {"slots": [None, None], "barrier": threading.Barrier(2)}
    results = [None, None]

    def rank_body(rank):
        pub = stitch.publisher.Publisher(FsStore(root, run_id=RUN), run_id=RUN,
                                         comms=OriginalComms(g, rank))
        try:
            results[rank] = pub.publish(version_dir,
                                        files=["model-00001-of-00001.safetensors"] if rank == 0 else [])
        except Exception as e:  # noqa: BLE001 - compared below
            results[rank] = e

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # Rank 1 leads a "host" with no files of its own: a refusal on both
    # ranks or a publish on both, never a split outcome.
    assert results[0] == results[1] == VersionRef(RUN, 1), results
    assert FsStore(root, run_id=RUN).read_pointer() == VersionRef(RUN, 1)


# ---- stitch.stores ----

def test_fs_store_is_usable_where_modal_volume_store_was(tmp_path):
    store = FsStore(tmp_path / "run-dir", run_id=RUN)
    assert isinstance(store, stitch.stores.Store) and store.run_id == RUN
    assert store.read_pointer() is None
    store.refresh()
    store.claim(VersionRef(RUN, 0))
    src = full_version(tmp_path / "src", 1)
    manifest = stitch.types.VersionManifest.from_hf_index(src, run_id=RUN)
    store.publish(manifest, src)
    store.commit()
    assert store.read_pointer() == VersionRef(RUN, 0)  # files first, pointer after
    store.compare_and_advance_pointer(VersionRef(RUN, 0), manifest.ref)
    assert store.read_manifest(manifest.ref) == manifest
    published = store.materialize(manifest.ref)
    assert published == str(tmp_path / "run-dir" / "updates" / "weight_v000001")
    assert os.path.isfile(os.path.join(published, "config.json"))
    store.publish(manifest, full_version(tmp_path / "again", 1))  # same bytes: a no-op
    with pytest.raises(ValueError, match="scoped to run"):
        store.materialize(VersionRef("run-2", 1))
    with pytest.raises(stitch.types.PointerRewind):
        store.advance_pointer(VersionRef(RUN, 1))
    # The flat API takes it too.
    assert stitch.publish_version(store, full_version(tmp_path / "src", 2), RUN) == VersionRef(RUN, 2)


def test_s3_store_takes_the_originals_constructor_and_writes_stitch_sha256(s3, tmp_path, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret_access_key"])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3["region"])
    store = S3Store(f"s3://{s3['bucket']}/orig/ours", cache_dir=tmp_path / "cache", run_id=RUN,
                    endpoint_url=s3["endpoint"])
    assert (store.bucket, store.prefix) == (s3["bucket"], "orig/ours")
    stitch.publish.claim_run(store, None, RUN)
    src = full_version(tmp_path / "src", 1)
    stitch.publish.publish_version(store, None, src, run_id=RUN)

    # What the original's upload check reads back from every object.
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name=s3["region"])
    for name in ("config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors",
                 "tokenizer.json"):
        head = client.head_object(Bucket=s3["bucket"], Key=f"orig/ours/updates/weight_v000001/{name}")
        with open(os.path.join(src, name), "rb") as f:
            assert head["Metadata"]["stitch-sha256"] == hashlib.sha256(f.read()).hexdigest(), name
    latest = client.get_object(Bucket=s3["bucket"], Key="orig/ours/latest")["Body"].read()
    assert latest.decode().strip() == "run-1/weight_v000001"
    with pytest.raises(ValueError, match="s3://BUCKET"):
        S3Store(f"s3://{s3['bucket']}/p?endpoint=x", cache_dir=tmp_path, run_id=RUN)


def test_a_version_the_original_uploaded_is_read_and_retrying_it_is_a_no_op(s3, tmp_path, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret_access_key"])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    store = S3Store(f"{s3['bucket']}/orig/theirs", cache_dir=tmp_path / "cache", run_id=RUN,
                    endpoint_url=s3["endpoint"], region=s3["region"])
    stitch.publish.claim_run(store, None, RUN)
    # The original's upload: every file of the directory, its SHA-256 under
    # `stitch-sha256` and S3's own SHA-256 checksum, then `latest`.
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name=s3["region"])
    src = full_version(tmp_path / "src", 1)
    for name in sorted(os.listdir(src)):
        with open(os.path.join(src, name), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        client.upload_file(os.path.join(src, name), s3["bucket"],
                           f"orig/theirs/updates/weight_v000001/{name}",
                           ExtraArgs={"ChecksumAlgorithm": "SHA256",
                                      "Metadata": {"stitch-sha256": digest}})
    store.compare_and_advance_pointer(VersionRef(RUN, 0), VersionRef(RUN, 1))

    published = store.materialize(VersionRef(RUN, 1))
    assert stitch.verify(published)["version"] == 1
    with open(os.path.join(published, "config.json")) as f:
        assert json.load(f) == {"model_type": "llama"}
    assert stitch.publish.publish_version(store, None, src, run_id=RUN) == VersionRef(RUN, 1)
    assert store.read_pointer() == VersionRef(RUN, 1)


# ---- stitch.pools and stitch.service ----

def test_readiness_gathers_every_replicas_server_info():
    ready = FakeReplica([{"ready": True, "applied": "run-1/weight_v000002", "sync_state": "IDLE"}])
    behind = FakeReplica([{"ready": False, "applied": None, "sync_state": "FETCHING",
                           "reason": "catching up"}])
    try:
        pool = RecordingPool([ready.url, behind.url, closed_port_url()])
        state = asyncio.run(stitch.pools.readiness(pool, timeout=5))
        assert [r.ready for r in state.replicas] == [True, False, False]
        assert state.replicas[0].at(VersionRef(RUN, 2))
        assert state.replicas[1].reason == "catching up"
        assert state.replicas[2].reason  # why it is not ready
        spec_state = asyncio.run(stitch.pools.readiness(f"static:{ready.url}"))
        assert [r.ready for r in spec_state.replicas] == [True]
    finally:
        ready.close()
        behind.close()


def test_await_pool_ready_waits_for_the_floor_then_the_gateway(capsys):
    # Not ready for two probes, then ready; the gateway's first /health is a 503.
    r = FakeReplica(states=[{"ready": False}, {"ready": False}, {"ready": True}], health=[503, 200])
    try:
        pool = RecordingPool([r.url], gateway=r.url)
        assert stitch.service.await_pool_ready(pool, replica_floor=1, interval=0, timeout=60) is True
        assert r.paths.count("/server_info") == 4 and r.paths.count("/health") == 2
        assert "1 of 1 required replicas ready" in capsys.readouterr().out
    finally:
        r.close()


def test_await_pool_ready_needs_three_quarters_of_the_floor():
    replicas = [FakeReplica([{"ready": i < 3}]) for i in range(4)]
    try:
        pool = RecordingPool([r.url for r in replicas])  # no gateway: not checked
        assert stitch.pools.await_pool_ready(pool, replica_floor=4, interval=0, timeout=60)
        with pytest.raises(TimeoutError, match="3 of 4 required replicas ready"):
            stitch.pools.await_pool_ready(pool, replica_floor=5, interval=0, timeout=0.3)
        with pytest.raises(ValueError):
            stitch.pools.await_pool_ready(pool, replica_floor=0)
    finally:
        for r in replicas:
            r.close()


def test_pool_helpers_keep_the_originals_defaults():
    assert stitch.pools.POOL_READY_FRACTION == 0.75
    wait = inspect.signature(stitch.pools.await_pool_ready).parameters
    assert (wait["timeout"].default, wait["interval"].default) == (3600, 30.0)
    assert wait["replica_floor"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(stitch.pools.readiness).parameters["timeout"].default == 15.0
    assert inspect.iscoroutinefunction(stitch.pools.readiness)
    assert stitch.service.await_pool_ready is stitch.pools.await_pool_ready
    assert stitch.service.readiness is stitch.pools.readiness


def test_a_spec_pool_discovers_and_wakes_the_replicas_of_a_spec(replica, tmp_path):
    listing = tmp_path / "replicas.txt"
    listing.write_text(f"{replica.url}\n")
    pool = SpecPool(f"file:{listing}", gateway_url="http://gateway:9000")
    assert pool.discover_replicas() == [replica.url]
    assert pool.gateway_url() == "http://gateway:9000"
    pool.wake(pool.discover_replicas(), VersionRef(RUN, 1))
    assert replica.woken.wait(10)
    with pytest.raises(ValueError):
        SpecPool("gopher:nowhere")


# ---- a whole trainer ----

def run_original_trainer(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, os.path.join(HERE, "original_trainer.py"), *args],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


EXPECTED_RUN = {
    "seen": ["run-orig/weight_v000001", "run-orig/weight_v000002", "run-orig/weight_v000003"],
    "pointer": "run-orig/weight_v000003",
    "kind": "full",
    "files": ["model.safetensors"],
    "config": ["config.json", "model.safetensors.index.json", "tokenizer_config.json"],
    "rewind": "run-orig/weight_v000001",
}


def test_a_trainer_written_against_the_original_runs_unchanged_on_a_filesystem_store(
        tmp_path, replica):
    out = run_original_trainer("fs", str(tmp_path / "store"), str(tmp_path / "work"), replica.url)
    assert out == EXPECTED_RUN
    assert replica.paths.count("/wake") >= 4  # claims and publishes woke the pool


def test_a_trainer_written_against_the_original_runs_unchanged_on_s3(s3, tmp_path, replica,
                                                                     monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret_access_key"])
    monkeypatch.setenv("AWS_REGION", s3["region"])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    out = run_original_trainer("s3", f"s3://{s3['bucket']}/trainer", str(tmp_path / "work"),
                               replica.url, s3["endpoint"])
    assert out == EXPECTED_RUN


def test_a_pool_must_say_how_it_discovers_replicas_and_its_gateway():
    class Incomplete(stitch.pools.Pool):
        def discover_replicas(self):
            return []

    with pytest.raises(TypeError, match="gateway_url"):
        Incomplete()
    assert RecordingPool(gateway=None).gateway_url() is None


def test_claim_run_and_publish_version_take_the_originals_argument_order(tmp_path):
    """`claim_run(store, pool, run_id)` and `publish_version(store, pool, dir,
    run_id=...)`, the original's order, under every name they have here;
    this package's own order and keyword calls keep working."""
    for n, (claim, publish) in enumerate([(stitch.publish.claim_run, stitch.publish.publish_version),
                                          (stitch.claim_run, stitch.publish_version)]):
        store = FsStore(str(tmp_path / f"s{n}"), run_id=RUN)
        replica = FakeReplica()
        pool = SpecPool(f"static:{replica.url}")
        claim(store, None, RUN)
        claim(store, pool, RUN, boot_version=0)
        assert replica.woken.wait(10)
        ref = publish(store, pool, full_version(tmp_path / f"v{n}", 1), run_id=RUN)
        assert ref == VersionRef(RUN, 1)
        assert publish(store, None, full_version(tmp_path / f"w{n}", 2), run_id=RUN) == VersionRef(RUN, 2)
        replica.close()
    store = FsStore(str(tmp_path / "ours"), run_id=RUN)
    assert stitch.claim_run(store, RUN, 0).moved
    assert stitch.claim_run(store=store, run_id=RUN, boot_version=0).moved is False
    assert stitch.publish_version(store, full_version(tmp_path / "o", 1), RUN) == VersionRef(RUN, 1)
    assert stitch.publish_version(store=store, version_dir=full_version(tmp_path / "p", 2),
                                  run_id=RUN) == VersionRef(RUN, 2)
    with pytest.raises(TypeError, match=r"claim_run\(store, pool, run_id"):
        stitch.claim_run(store, RUN, [0])
