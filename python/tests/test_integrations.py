"""The slime and Miles hooks against a fake trainer namespace (no slime,
Miles or torch installed: their modules are stand-ins here)."""

import argparse
import asyncio
import http.server
import sys
import threading
import types

import numpy as np
import pytest

import stitch
import stitch.integrations as hooks
from stitch.integrations import miles, slime
from stitch.integrations.torch_comms import TorchDistributedComms

RUN = "run-1"


@pytest.fixture(autouse=True)
def fresh_hooks():
    hooks.reset()
    yield
    hooks.reset()


def trainer_args(tmp_path, *extra, rank=0):
    """What slime's / Miles' parse_args(add_custom_arguments=...) gives."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollout-batch-size", type=int, default=8)  # one of the framework's own
    slime.add_arguments(parser)
    args = parser.parse_args(["--stitch-store", str(tmp_path / "store"), "--stitch-run-id", RUN,
                              *extra])
    args.rank = rank  # Megatron sets it
    return args


def write_version(tmp_path, version, values):
    enc = stitch.DeltaEncoder({"w": np.zeros(16, np.float32)}, version=version - 1, run_id=RUN)
    return enc.encode({"w": np.full(16, values, np.float32)},
                      str(tmp_path / "disk" / str(values) / f"weight_v{version:06d}"), full=True)["dir"]


class WakeRecorder:
    """A replica's /wake endpoint, recording the paths it was POSTed."""

    def __init__(self):
        recorder = self
        self.paths = []
        self.woken = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                recorder.woken.set()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_flags_land_in_the_settings(tmp_path):
    args = trainer_args(tmp_path, "--stitch-lag", "2", "--stitch-pool", "static:http://h:1",
                        "--stitch-multihost")
    s = hooks.settings(args)
    assert (s.run_id, s.lag, s.pool, s.multihost, s.boot_version) == (RUN, 2, "static:http://h:1", True, 0)
    assert s.affinity_header == "X-Session-Id" and s.exact_version is None
    assert args.rollout_batch_size == 8


def test_a_namespace_without_a_store_is_refused():
    with pytest.raises(stitch.InvalidArgument, match="--stitch-store"):
        hooks.settings(argparse.Namespace(rank=0))


def test_launch_claims_and_each_update_publishes_and_wakes_the_pool(tmp_path):
    replica = WakeRecorder()
    try:
        args = trainer_args(tmp_path, "--stitch-pool", f"static:{replica.url}")
        assert slime.claim(args).moved
        store = stitch.open_store(str(tmp_path / "store"), RUN)
        assert store.read_pointer() == stitch.VersionRef(RUN, 0)

        slime.post_write_hook(args, write_version(tmp_path, 1, 1.0), rollout_engines=[])
        assert store.read_pointer() == stitch.VersionRef(RUN, 1)
        assert replica.woken.wait(10) and "/wake" in replica.paths

        miles.post_write_hook(args, write_version(tmp_path, 2, 2.0), None)
        assert store.read_pointer() == stitch.VersionRef(RUN, 2)
        # The published version again with other weights: refused, the
        # pointer stays.
        with pytest.raises(stitch.StoreError, match="publish new weights as weight_v000003"):
            slime.post_write_hook(args, write_version(tmp_path, 2, 3.0), None)
        assert store.read_pointer() == stitch.VersionRef(RUN, 2)
    finally:
        replica.close()


def test_ranks_other_than_zero_leave_the_store_alone(tmp_path):
    args = trainer_args(tmp_path, rank=3)
    assert slime.claim(args) is None
    slime.post_write_hook(args, write_version(tmp_path, 1, 1.0), None)
    assert stitch.open_store(str(tmp_path / "store"), RUN).read_pointer() is None


class FakeDist:
    """torch.distributed's calls TorchDistributedComms makes, for ranks that
    are threads of this process (thread-local rank)."""

    def __init__(self, world):
        self.world, self.local = world, threading.local()
        self.slots, self.barrier = [None] * world, threading.Barrier(world)

    def is_initialized(self):
        return True

    def get_rank(self, group=None):
        return self.local.rank

    def get_world_size(self, group=None):
        return self.world

    def all_gather_object(self, out, obj, group=None):
        self.slots[self.local.rank] = obj
        self.barrier.wait(timeout=60)
        out[:] = list(self.slots)
        self.barrier.wait(timeout=60)


def test_multihost_publish_runs_over_torch_distributed_comms(tmp_path):
    args = trainer_args(tmp_path, "--stitch-multihost")
    slime.claim(args)
    version_dir = write_version(tmp_path, 1, 1.0)
    dist, results = FakeDist(2), [None, None]

    def rank_body(rank):
        dist.local.rank = rank
        comms = TorchDistributedComms(dist=dist, local_rank=rank)  # one rank per host
        try:
            results[rank] = hooks.publish_update(args, version_dir, comms=comms)
        except Exception as e:  # noqa: BLE001 - compared below
            results[rank] = e

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [stitch.VersionRef(RUN, 1)] * 2, results


def test_the_gate_constrains_to_latest_minus_lag_and_caches_the_pointer(tmp_path):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    now = [0.0]
    gate = hooks.RequestGate(store, lag=1, pointer_ttl=5.0, clock=lambda: now[0])
    payload, headers = gate.constrain({"input_ids": [1]}, None, session_id="group-3")
    assert payload == {"input_ids": [1]}  # nothing published yet: no constraint
    assert headers == {"X-Session-Id": "group-3"}

    stitch.claim_run(store, RUN, 0)
    stitch.publish_version(store, write_version(tmp_path, 1, 1.0), RUN)
    stitch.publish_version(store, write_version(tmp_path, 2, 2.0), RUN)
    assert gate.constrain({}, None)[0] == {}  # the cached pointer, until the TTL passes
    now[0] = 5.0
    assert gate.constrain({}, None)[0] == {"weight_version": {"min_version": 1}}
    assert gate.constrain({}, None, exact=2)[0] == {"weight_version": {"exact_version": 2}}


def fake_module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def install(monkeypatch, dotted, module):
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), fake_module(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, dotted, module)


def published(tmp_path, version):
    store = stitch.open_store(str(tmp_path / "store"), RUN)
    stitch.claim_run(store, RUN, 0)
    for v in range(1, version + 1):
        stitch.publish_version(store, write_version(tmp_path, v, float(v)), RUN)


def test_slime_generate_gates_the_request_to_the_router(tmp_path, monkeypatch):
    sent = []

    async def post(url, payload, max_retries=60, headers=None):
        sent.append((url, payload, headers))
        return {"text": "ok"}

    async def generate(args, sample, sampling_params):  # slime's default, reduced
        payload = {"input_ids": [1, 2], "sampling_params": sampling_params, "return_logprob": True}
        sample.response = (await module.post("http://router/generate", payload, headers=None))["text"]
        return sample

    module = fake_module("slime.rollout.sglang_rollout", post=post, generate=generate)
    install(monkeypatch, "slime.rollout.sglang_rollout", module)
    published(tmp_path, 3)
    args = trainer_args(tmp_path, "--stitch-lag", "1")
    sample = types.SimpleNamespace(group_index=5, session_id="s", metadata={}, response=None)

    out = asyncio.run(slime.generate(args, sample, {"max_new_tokens": 4}))
    assert out.response == "ok"
    url, payload, headers = sent[-1]
    assert payload["weight_version"] == {"min_version": 2}
    assert payload["sampling_params"] == {"max_new_tokens": 4}
    assert headers == {"X-Session-Id": "group-5"}

    pinned = types.SimpleNamespace(group_index=None, session_id="abc",
                                   metadata={"stitch_version": 1}, response=None)
    asyncio.run(slime.generate(args, pinned, {}))
    assert sent[-1][1]["weight_version"] == {"exact_version": 1}
    assert sent[-1][2] == {"X-Session-Id": "abc"}

    # Outside the hook the module's post is untouched in behaviour.
    asyncio.run(module.post("http://router/generate", {"x": 1}))
    assert sent[-1] == ("http://router/generate", {"x": 1}, None)


def test_miles_generate_gates_the_request_to_the_router(tmp_path, monkeypatch):
    sent = []

    async def post(url, payload, headers=None):
        sent.append((payload, headers))
        return {"text": "ok"}

    async def generate(input):  # Miles' single_turn.generate, reduced
        await module.post("http://router/generate", {"input_ids": [1]})
        return types.SimpleNamespace(samples=input.sample)

    module = fake_module("miles.rollout.generate_hub.single_turn", post=post, generate=generate)
    install(monkeypatch, "miles.rollout.generate_hub.single_turn", module)
    published(tmp_path, 4)
    args = trainer_args(tmp_path, "--stitch-lag", "2", "--stitch-affinity-header", "X-SMG-Routing-Key")
    sample = types.SimpleNamespace(group_index=1, metadata={})
    out = asyncio.run(miles.generate(types.SimpleNamespace(args=args, sample=sample, sampling_params={})))
    assert out.samples is sample
    assert sent[-1] == ({"input_ids": [1], "weight_version": {"min_version": 2}},
                        {"X-SMG-Routing-Key": "group-1"})


def test_a_custom_generate_function_constrains_its_own_payload(tmp_path):
    published(tmp_path, 2)
    args = trainer_args(tmp_path, "--stitch-exact-version", "2")
    sample = types.SimpleNamespace(group_index=0, metadata={})
    payload, headers = slime.constrain_sample_request(args, sample, {"text": "hi"}, {"A": "b"})
    assert payload == {"text": "hi", "weight_version": {"exact_version": 2}}
    assert headers == {"A": "b", "X-Session-Id": "group-0"}
