"""stitch.integrations.trl's side of its contracts, without a fleet: what
it sends, how it reads answers and retries, when it refuses, and what it
hands TRL for stale samples. The answers come from a small HTTP server in
this process that speaks as Stitch's gateway does (the fleet itself is
tested in test_trl.py)."""

import http.server
import json
import os
import subprocess
import threading
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

import stitch  # noqa: E402
from stitch.integrations.trl import RolloutFailed, StitchGRPO  # noqa: E402

STITCH = os.environ.get("STITCH_BIN") or os.path.join(REPO, "build/src/stitch/cli/stitch")


class Gateway:
    """Answers POSTs from a script: a list of (status, body, headers), one
    per request, the last repeated; records every request."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - the library's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append((self.path, dict(self.headers), json.loads(body)))
                i = min(len(owner.requests), len(owner.script)) - 1
                status, answer, headers = owner.script[i]
                data = json.dumps(answer).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def generate_answer(tokens, start, end):
    return {"text": "", "meta_info": {
        "output_token_logprobs": [[-0.5, t, None] for t in tokens],
        "weight_version_start": start, "weight_version_end": end,
        "weight_version_spans": [[0, start]]}}


NOT_READY = (409, {"error": {"type": "WeightVersionNotReady", "message": "not yet",
                             "retryable": True}}, {})


class ByteTokenizer:
    """The reference engine's vocabulary: BOS, then the text's bytes."""

    def __call__(self, text):
        return {"input_ids": [256, *text.encode()]}


def trainer(step=0, group=2):
    """What rollout_func reads of TRL's GRPOTrainer."""
    args = types.SimpleNamespace(max_completion_length=4, temperature=1.0, top_p=1.0, top_k=None)
    return types.SimpleNamespace(processing_class=ByteTokenizer(), args=args,
                                 model=types.SimpleNamespace(training=True),
                                 num_generations=group, state=types.SimpleNamespace(global_step=step))


def grpo(tmp_path, gateway, **kw):
    return StitchGRPO(store=str(tmp_path / "store"), run_id="run", gateway=gateway.url,
                      work_dir=str(tmp_path / "versions"), retry_deadline=kw.pop("deadline", 10),
                      **kw)


def test_on_policy_requests_are_pinned_grouped_and_retried_until_served(tmp_path):
    gw = Gateway([NOT_READY, (503, {"error": {"type": "EngineUnavailable", "message": "x",
                                              "retryable": True}}, {"Retry-After": "0"}),
                  (200, generate_answer([97, 98], 3, 3), {"X-Stitch-Replica": "http://r1"})])
    sg = grpo(tmp_path, gw, boot_version=0, seed=7)
    try:
        out = sg.rollout_func(["ab", "ab"], trainer(step=3, group=2))
    finally:
        sg.close()
        gw.close()
    assert out["prompt_ids"] == [[256, 97, 98]] * 2
    assert out["completion_ids"] == [[97, 98]] * 2 and out["logprobs"] == [[-0.5, -0.5]] * 2
    assert out["stitch_version_start"] == [3, 3] and out["stitch_staleness"] == [0, 0]
    assert "env_mask" not in out
    paths = {p for p, _, _ in gw.requests}
    assert paths == {"/generate"}
    bodies = [b for _, _, b in gw.requests]
    assert all(b["weight_version"] == {"exact_version": 3} for b in bodies)
    assert all(b["sampling_params"]["max_new_tokens"] == 4 for b in bodies)
    # One group, one session; every prompt its own seed.
    sessions = {h["X-Session-Id"] for _, h, _ in gw.requests}
    assert len(sessions) == 1
    assert sg.counters["retries"] == len(gw.requests) - 2 >= 2


def test_an_unreadable_retry_after_falls_back_to_the_clients_backoff(tmp_path):
    gw = Gateway([(503, {"error": {"type": "Overloaded", "message": "x", "retryable": True}},
                   {"Retry-After": "soon"}),
                  (200, generate_answer([97], 1, 1), {})])
    sg = grpo(tmp_path, gw)
    try:
        out = sg.rollout_func(["a"], trainer(step=1, group=1))
    finally:
        sg.close()
        gw.close()
    assert out["completion_ids"] == [[97]] and len(gw.requests) == 2


def test_lagging_samples_beyond_max_staleness_get_a_zero_env_mask(tmp_path):
    gw = Gateway([(200, generate_answer([97, 98, 99], 4, 4), {})])
    sg = grpo(tmp_path, gw, lag=2, max_staleness=0, api="sglang")
    try:
        out = sg.rollout_func(["a"], trainer(step=5, group=1))
    finally:
        sg.close()
        gw.close()
    assert gw.requests[0][2]["weight_version"] == {"min_version": 3}
    assert out["stitch_staleness"] == [1]
    assert out["env_mask"] == [[0, 0, 0]]
    assert sg.counters["dropped_stale"] == 1


def test_vllm_requests_ask_for_token_ids_and_log_probabilities(tmp_path):
    answer = {"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -2.0]}}],
              "weight_version_start": 0, "weight_version_end": 0}
    gw = Gateway([(200, answer, {})])
    sg = grpo(tmp_path, gw, api="vllm", served_model="policy")
    try:
        out = sg.rollout_func(["x"], trainer(step=0, group=1))
    finally:
        sg.close()
        gw.close()
    path, _, body = gw.requests[0]
    assert path == "/v1/completions"
    assert body["model"] == "policy" and body["prompt"] == [256, 120]
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["weight_version"] == {"exact_version": 0}
    assert out["completion_ids"] == [[5, 6]] and out["logprobs"] == [[-1.0, -2.0]]


@pytest.mark.parametrize("answer,words", [
    ((400, {"error": {"type": "BadRequest", "message": "bad field"}}, {}), "bad field"),
    ((200, {"text": "", "meta_info": {"output_token_logprobs": []}}, {}), "weight_version_start"),
    ((200, generate_answer([1], 2, 2), {}), "breaks its constraint"),
])
def test_refusals_and_broken_promises_raise(tmp_path, answer, words):
    gw = Gateway([answer])
    sg = grpo(tmp_path, gw)
    try:
        with pytest.raises(RolloutFailed, match=words):
            sg.rollout_func(["a"], trainer(step=1, group=1))
        assert len(gw.requests) == 1  # never retried
    finally:
        sg.close()
        gw.close()


def test_a_version_that_never_comes_fails_at_the_deadline(tmp_path):
    gw = Gateway([NOT_READY])
    sg = grpo(tmp_path, gw, deadline=0.5)
    try:
        with pytest.raises(RolloutFailed, match="still refused after"):
            sg.rollout_func(["a"], trainer(step=1, group=1))
        assert len(gw.requests) >= 2
    finally:
        sg.close()
        gw.close()


def test_bad_settings_are_refused():
    for kw in ({"api": "tgi"}, {"lag": -1}, {"max_staleness": -1}, {"concurrency": 0},
               {"anchor_every": -1}):
        with pytest.raises(stitch.InvalidArgument):
            StitchGRPO(store="/tmp/s", run_id="r", gateway="http://x", work_dir="/tmp/w", **kw)


def test_a_run_already_past_the_boot_version_is_refused(tmp_path):
    """The model holds the boot version's weights; a pointer further on
    means the fleet serves others, and the trainer must not label its
    deltas against them."""
    base = str(tmp_path / "base")
    subprocess.run([STITCH, "engine", "init-model", base, "--hidden", "32", "--layers", "1",
                    "--heads", "2", "--dtype", "float32"], check=True, stdout=subprocess.DEVNULL)
    store = str(tmp_path / "store")
    subprocess.run([STITCH, "claim", "--store", store, "--run-id", "run", "--boot-version", "4"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sg = StitchGRPO(store=store, run_id="run", gateway="http://127.0.0.1:9", work_dir=str(tmp_path),
                    checkpoint_dir=base)
    with pytest.raises(stitch.StitchError, match="boot_version=4"):
        sg._begin(model=None, trainer_state=types.SimpleNamespace(global_step=0), is_main=True)
    sg.close()


def test_unknown_dtypes_and_missing_tensors_are_refused(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    base = str(tmp_path / "base")
    subprocess.run([STITCH, "engine", "init-model", base, "--hidden", "32", "--layers", "1",
                    "--heads", "2", "--dtype", "float32"], check=True, stdout=subprocess.DEVNULL)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    sg = StitchGRPO(store=str(tmp_path / "store"), run_id="run", gateway="http://127.0.0.1:9",
                    work_dir=str(tmp_path / "w"), checkpoint_dir=base)
    state = types.SimpleNamespace(global_step=0)
    sg._begin(model, state, is_main=True)  # claims v0, snapshots the model
    assert stitch.open_store(str(tmp_path / "store"), "run").read_pointer().version == 0
    sg._dtypes["model.no_such.weight"] = "float32"
    with pytest.raises(stitch.InvalidArgument, match="model.no_such.weight"):
        sg._publishable(model)
    sg.close()
