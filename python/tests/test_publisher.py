"""Publisher, alone and with two simulated ranks over threads."""

import threading

import numpy as np
import pytest

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
