"""Publisher, alone and with two simulated ranks over threads."""

import logging
import os
import threading

import numpy as np
import pytest

import delta_reference
import stitch

RUN = "run-1"


class ThreadComms(stitch.TrainerComms):
    """Ranks as threads of one process; all_gather over a barrier."""

    def __init__(self, group, rank, ranks_per_host):
        super().__init__()
        self.group, self._rank, self.ranks_per_host = group, rank, ranks_per_host

    def rank(self):
        return self._rank

    def world_size(self):
        return self.group["n"]

    def is_host_leader(self):
        return self._rank % self.ranks_per_host == 0

    def all_gather(self, value):
        g = self.group
        g["slots"][self._rank] = value
        g["barrier"].wait(timeout=60)
        result = list(g["slots"])
        g["barrier"].wait(timeout=60)
        return result


def group(n):
    return {"n": n, "slots": [None] * n, "barrier": threading.Barrier(n)}


def test_single_process_publisher_claims_and_publishes(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    pub = stitch.Publisher(store, run_id=RUN)
    assert pub.claim(0).moved
    w = {"w": np.ones(10, np.float32)}
    d = stitch.DeltaEncoder(w, version=0, run_id=RUN).encode(w, str(tmp_path / "weight_v000001"), full=True)
    assert pub.publish(d["dir"]) == stitch.VersionRef(RUN, 1) == store.read_pointer()


def run_ranks(n, fn):
    results, threads = [None] * n, []

    def body(rank):
        try:
            results[rank] = fn(rank)
        except Exception as e:  # noqa: BLE001 - every rank's outcome is compared
            results[rank] = e

    for rank in range(n):
        threads.append(threading.Thread(target=body, args=(rank,)))
        threads[-1].start()
    for t in threads:
        t.join(timeout=120)
    return results


def test_two_ranks_publish_one_version_over_a_shared_directory(tmp_path):
    uri = str(tmp_path / "store")
    stitch.claim_run(stitch.open_store(uri, RUN), RUN, 0)
    w = {"w": np.arange(100, dtype=np.float32)}
    version_dir = stitch.DeltaEncoder(w, version=0, run_id=RUN).encode(
        w, str(tmp_path / "weight_v000001"), full=True)["dir"]
    g = group(2)

    def rank_body(rank):
        pub = stitch.Publisher(stitch.open_store(uri, RUN), comms=ThreadComms(g, rank, 2))
        return pub.publish(version_dir)

    results = run_ranks(2, rank_body)
    assert results == [stitch.VersionRef(RUN, 1)] * 2, results
    assert stitch.open_store(uri, RUN).read_pointer() == stitch.VersionRef(RUN, 1)

    # Every rank retrying the published version: a no-op, the same answer.
    g = group(2)
    results = run_ranks(2, rank_body)
    assert results == [stitch.VersionRef(RUN, 1)] * 2, results

    # A rewind is refused on every rank, before anything moves.
    v2 = stitch.DeltaEncoder(w, version=1, run_id=RUN).encode(
        w, str(tmp_path / "weight_v000002"), full=True)["dir"]
    g = group(2)
    assert run_ranks(2, lambda rank: stitch.Publisher(
        stitch.open_store(uri, RUN), comms=ThreadComms(g, rank, 2)).publish(v2)) == \
        [stitch.VersionRef(RUN, 2)] * 2
    g = group(2)
    results = run_ranks(2, rank_body)
    assert all(isinstance(r, stitch.PointerRewind) for r in results), results
    assert stitch.open_store(uri, RUN).read_pointer() == stitch.VersionRef(RUN, 2)


def test_a_failing_all_gather_fails_the_publish(tmp_path):
    class Broken(ThreadComms):
        def all_gather(self, value):
            raise RuntimeError("network down")

    uri = str(tmp_path / "store")
    stitch.claim_run(stitch.open_store(uri, RUN), RUN, 0)
    w = {"w": np.zeros(4, np.float32)}
    d = stitch.DeltaEncoder(w, version=0, run_id=RUN).encode(w, str(tmp_path / "weight_v000001"), full=True)
    pub = stitch.Publisher(stitch.open_store(uri, RUN), comms=Broken(group(1), 0, 1))
    with pytest.raises(stitch.StoreError, match="network down"):
        pub.publish(d["dir"])


# Retention after each publish (keep_last / keep_every).

def full_version(tmp_path, version, seed=0):
    rng = np.random.default_rng(seed + version)
    w = {"w": rng.standard_normal((8, 16), dtype=np.float32)}
    enc = stitch.DeltaEncoder(w, version=version - 1, run_id=RUN)
    return enc.encode(w, str(tmp_path / "work" / f"weight_v{version:06d}"), full=True)["dir"]


def stored_versions(root):
    updates = root / "updates"
    return sorted(n for n in os.listdir(updates) if n.startswith("weight_v"))


def publish_fulls(tmp_path, versions, **retention):
    root = tmp_path / "store"
    store = stitch.open_store(str(root), RUN)
    pub = stitch.Publisher(store, run_id=RUN, **retention)
    assert pub.claim(0).moved
    for v in versions:
        assert pub.publish(full_version(tmp_path, v)) == stitch.VersionRef(RUN, v)
    return root, store


def test_publisher_with_keep_last_deletes_what_no_version_needs(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="stitch")
    root, store = publish_fulls(tmp_path, range(1, 6), keep_last=2)
    assert stored_versions(root) == ["weight_v000004", "weight_v000005"]
    assert store.read_pointer() == stitch.VersionRef(RUN, 5)
    assert "retention deleted" in caplog.text
    # What is left is whole: the pointer's version materializes.
    assert os.path.isdir(store.materialize(5))
    assert stitch.verify(store.materialize(4))["kind"] == "FULL"


def test_publisher_without_keep_last_keeps_every_version(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="stitch")
    root, store = publish_fulls(tmp_path, range(1, 6))
    assert stored_versions(root) == [f"weight_v{v:06d}" for v in range(1, 6)]
    assert store.read_pointer() == stitch.VersionRef(RUN, 5)
    assert "retention" not in caplog.text


def test_publisher_keep_every_keeps_milestones(tmp_path):
    root, store = publish_fulls(tmp_path, range(1, 6), keep_last=1, keep_every=2)
    assert stored_versions(root) == ["weight_v000002", "weight_v000004", "weight_v000005"]
    assert store.read_pointer() == stitch.VersionRef(RUN, 5)


def test_publisher_retention_keeps_the_chains_of_kept_versions(tmp_path):
    """FULL 1, DELTA 2 3, FULL 4 (the anchor budget), DELTA 5: the last two
    are 4 and 5, whose chain starts at 4; versions 1-3 go."""
    root = tmp_path / "store"
    store = stitch.open_store(str(root), RUN)
    pub = stitch.Publisher(store, run_id=RUN, keep_last=2)
    pub.claim(0)
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal((16, 16), dtype=np.float32)}
    enc = stitch.DeltaEncoder(w, version=0, run_id=RUN, anchor_every=2)
    steps = {}
    for v in range(1, 6):
        w = {"w": w["w"] + np.float32(v)}
        steps[v] = w
        result = enc.encode(w, str(tmp_path / "work" / f"weight_v{v:06d}"), full=(v == 1))
        assert result["anchor"] is (v == 4)
        pub.publish(result["dir"])
        if v == 3:
            # The last two (2, 3) need their chain back to 1: nothing goes.
            assert stored_versions(root) == [f"weight_v{n:06d}" for n in (1, 2, 3)]
    assert stored_versions(root) == ["weight_v000004", "weight_v000005"]
    assert store.read_pointer() == stitch.VersionRef(RUN, 5)
    stitch.apply_chain(store.materialize(4), [store.materialize(5)], str(tmp_path / "out"))
    got = delta_reference.read_checkpoint(str(tmp_path / "out"))
    assert np.array_equal(got["w"][2], steps[5]["w"].reshape(-1).view(np.uint8))


def test_a_failing_retention_is_logged_and_the_version_stays_published(tmp_path, caplog,
                                                                       monkeypatch):
    from stitch import publisher

    def broken(store, keep_last, keep_every):
        raise stitch.StoreError("stitch: cannot list the store", "UNAVAILABLE")

    monkeypatch.setattr(publisher._stitch, "apply_retention", broken)
    caplog.set_level(logging.WARNING, logger="stitch")
    root, store = publish_fulls(tmp_path, range(1, 4), keep_last=1)
    assert store.read_pointer() == stitch.VersionRef(RUN, 3)
    assert stored_versions(root) == [f"weight_v{v:06d}" for v in range(1, 4)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("cannot list the store" in r.getMessage() for r in warnings)


def test_publisher_refuses_a_bad_retention_rule(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    for bad in ({"keep_last": 0}, {"keep_last": -3}, {"keep_last": 2, "keep_every": -1}):
        with pytest.raises(stitch.InvalidArgument) as info:
            stitch.Publisher(store, run_id=RUN, **bad)
        assert info.value.code == "INVALID_ARGUMENT"
    assert not (tmp_path / "store").exists()
