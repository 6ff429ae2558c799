"""The sidecar (--engine sglang-stock) in front of a real, stock SGLang on
CPU, judged by transformers as test_vllm.py judges vLLM. One SGLang start
serves the module; the tests run in order.
"""

import contextlib
import json
import socket

import pytest

import harness
from harness import Fleet, Sglang, http, prompt_ids

PROMPT = "The quick brown fox, héllo 日本 🎉"


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    env = harness.Env(str(tmp_path_factory.mktemp("sglang")))
    try:
        env.engine = Sglang(env.ckpt[0], env.work)
        env.engine.wait_healthy()
        env.fleet = Fleet(env.work, env.ckpt[0], "sglang-stock", env.engine.url,
                          sidecar_flags=["--update-mode", "disk"])
        env.fleet.wait_serving(0)
        yield env
    finally:
        env.close()


def generate(f, constraint=None, max_new_tokens=12, stream=False):
    body = {"text": PROMPT, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                "ignore_eos": True}}
    if constraint is not None:
        body["weight_version"] = constraint
    if stream:
        return harness.sse_events(f.fleet.url + "/generate", body)
    return http("POST", f.fleet.url + "/generate", body)


def test_whole_and_streamed_generations_are_stamped_and_made_by_those_weights(f):
    status, body, _ = generate(f, {"exact_version": 0})
    assert status == 200, body
    meta = body["meta_info"]
    assert meta["weight_version_start"] == 0 and meta["weight_version_end"] == 0, meta
    assert meta["weight_version_spans"] == [[0, 0]], meta
    f.assert_made_by(0, prompt_ids(PROMPT), body["output_ids"])

    events = generate(f, {"min_version": 0}, stream=True)
    assert events
    for e in events:
        assert e["meta_info"]["weight_version_start"] == 0, e
    f.assert_made_by(0, prompt_ids(PROMPT), events[-1]["output_ids"])


def test_openai_routes_are_stamped_too(f):
    status, body, _ = http("POST", f.fleet.url + "/v1/completions", {
        "model": "policy", "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
        "weight_version": {"exact_version": 0}})
    assert status == 200, body
    assert body["weight_version_start"] == 0 and body["weight_version_end"] == 0, body
    status, body, _ = http("POST", f.fleet.url + "/v1/chat/completions", {
        "model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "temperature": 0, "cache_salt": "tenant-a"})
    assert status == 200, body
    assert body["weight_version_start"] == 0, body


def test_constraints_and_the_409_body(f):
    status, body, _ = generate(f, {"min_version": 5})
    assert status == 409, body
    assert body["type"] == "WeightVersionNotReady" and body["failed_bound"] == "min_version"
    assert body["applied"] == 0
    status, body, _ = generate(f, {"max_staleness": 0})
    assert status == 200, body


def test_control_routes_in_any_spelling_never_reach_sglang(f):
    for path in ("/pause_generation", "/%70ause_generation", "//pause_generation",
                 "/v1/../pause_generation", "/PAUSE_GENERATION", "/update_weights_from_disk",
                 "/%75pdate_weights_from_disk", "/flush_cache", "/%66lush_cache"):
        status, body, _ = http("POST", f.fleet.url + path, {})
        assert status == 403, (path, body)
    # SGLang (uvicorn) decodes paths: an encoded route that is forwarded
    # reaches what it names, which is why the sidecar judges decoded paths.
    status, body, _ = http("GET", f.fleet.url + "/%67et_model_info")
    assert status == 200 and "model_path" in body, body
    for target in ("/flush_cache?%zz", "/%70ause_generation%zz", "/flush_cache#f"):
        with socket.create_connection(("127.0.0.1", f.fleet.port), timeout=10) as s:
            s.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            assert s.recv(64).startswith(b"HTTP/1.1 400"), target
    status, body, _ = generate(f)
    assert status == 200, body


def test_only_sglangs_read_only_routes_are_forwarded(f):
    """SGLang's control routes the block list does not name (sending the
    weights away, slowing it down, logging, sessions, ...) and its
    generation routes that carry no version are refused too."""
    harness.check_forwarded_routes(f)
    for path in ("/send_weights_to_remote_instance", "/init_weights_send_group_for_remote_instance",
                 "/slow_down", "/configure_logging", "/freeze_gc", "/get_weights_by_name",
                 "/open_session", "/invocations", "/v1/responses"):
        status, body, _ = http("POST", f.fleet.url + path, {})
        assert status == 403 and body["error"]["type"] == "RouteNotForwarded", (path, body)


def test_health_checks_fit_sglangs_slow_health(f):
    """SGLang's /health runs a one-token generation (about a second here):
    the sidecar's checks must not fail on it, so the replica never flaps."""
    before = harness.sidecar_counter(f, "watchdog_failures_total")
    checks = 0

    def enough_checks():
        nonlocal checks
        checks += 1
        assert f.fleet.info().get("ready"), "the replica left rotation"
        return checks >= 25
    harness.wait_until(enough_checks, 60, "25 readiness checks")
    assert harness.sidecar_counter(f, "watchdog_failures_total") == before
    assert "sglang:" in http("GET", f.fleet.url + "/metrics")[1]


def test_full_and_delta_versions_are_followed(f):
    f.fleet.publish_full(1, f.ckpt[1])
    f.fleet.wait_serving(1)
    status, body, _ = generate(f, {"exact_version": 1})
    assert status == 200, body
    f.assert_made_by(1, prompt_ids(PROMPT), body["output_ids"])
    f.fleet.publish_delta(2, f.ckpt[2])
    f.fleet.wait_serving(2)
    status, body, _ = generate(f, {"exact_version": 2})
    assert status == 200, body
    f.assert_made_by(2, prompt_ids(PROMPT), body["output_ids"])
    _, info, _ = f.engine.http("GET", "/get_model_info")
    assert info.get("weight_version") == "r1/weight_v000002", info


def test_the_served_model_name_survives_disk_loads(f):
    """SGLang's disk load renames the served model after the load's path;
    through the sidecar, clients keep seeing the name it was served as."""
    assert len(f.fleet.published) > 1, "runs after a disk load"
    status, body, _ = http("GET", f.fleet.url + "/v1/models")
    assert status == 200, body
    assert [m["id"] for m in body["data"]] == ["policy"], body
    status, body, _ = http("GET", f.fleet.url + "/model_info")
    assert status == 200 and body["served_model_name"] == "policy", body


def test_the_engines_api_key_guards_it_and_the_sidecar_presents_it(f):
    for key in (None, "wrong"):
        status, body, _ = f.engine.http("GET", "/model_info", key=key)
        assert status == 401, body
    status, body, _ = http("GET", f.fleet.url + "/model_info",
                           headers={"Authorization": "Bearer wrong"})
    assert status == 200, body


@contextlib.contextmanager
def frozen(f):
    """Holds SGLang's running requests where they are (an in-place pause),
    so that what the test does next lands inside them; the sidecar's next
    commit continues the engine."""
    status, body, _ = f.engine.http("POST", "/pause_generation", {"mode": "in_place"})
    assert status == 200, body
    try:
        yield
    finally:  # whatever happened, the engine serves again
        f.engine.http("POST", "/continue_generation", {})


def long_generation(f, text, max_new_tokens=64):
    return harness.Stream(f.fleet.url + "/generate", {
        "text": text, "stream": True, "weight_version": {"min_version": max(f.fleet.published)},
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                            "ignore_eos": True}})


def read_generation(events):
    return events[-1]["output_ids"], events[-1]["meta_info"]


def test_an_in_place_commit_inside_a_streamed_generation(f):
    """A DELTA committed while a generation streams: the generation goes on
    under the new weights, its stamps name both versions, and its spans are
    exact or "unknown", never wrong. (SGLang's own `weight_versions` put the
    switch a token late here: its overlap scheduler, on by default, had that
    token in flight when the version changed. So the sidecar says
    "unknown".)"""
    text = "Once upon a time"
    stamped = f.commit_inside(frozen, lambda old: long_generation(f, text), read_generation,
                              prompt_ids(text))
    assert stamped["weight_version_spans"] == "unknown", stamped
    # Later answers are the new weights'.
    version = max(f.fleet.published)
    status, body, _ = generate(f, {"exact_version": version})
    assert status == 200, body
    f.assert_made_by(version, prompt_ids(PROMPT), body["output_ids"])


def engine_label(f):
    _, info, _ = f.engine.http("GET", "/model_info")
    return info.get("weight_version")


def test_sparse_deltas_are_committed_in_place_by_stitchs_weight_loader(f):
    """DELTAs that flip 5% of the values become in-place patches applied
    by Stitch's custom weight loader inside SGLang: SGLang's label moves to
    each version with its weights, and transformers agrees with the answers.
    The DELTAs between unrelated models earlier in this module were too
    dense to patch, and FULL versions reload."""
    before = harness.commit_paths(f)
    assert before.get(("reload", "dense"), 0) >= 1, before
    assert before.get(("reload", "full-version"), 0) >= 1, before
    old = max(f.fleet.published)
    for i, target in enumerate(harness.sparse_versions(f, 2)):
        version = old + 1 + i
        f.fleet.publish_delta(version, target)
        f.fleet.wait_serving(version)
        assert engine_label(f) == f"{harness.RUN}/weight_v{version:06d}"
        status, body, _ = generate(f, {"exact_version": version})
        assert status == 200, body
        assert f.oracle.made_by(target, prompt_ids(PROMPT), body["output_ids"])
    after = harness.commit_paths(f)
    assert after.get(("patch", ""), 0) == before.get(("patch", ""), 0) + 2, after


def test_a_stream_across_an_in_place_patch_is_judged_by_transformers(f):
    """A patch (10% of the values) committed while a generation streams: the
    answer is the old weights' up to a switch and the new ones' after it,
    stamped with both versions."""
    patched = harness.commit_paths(f).get(("patch", ""), 0)
    text = "Once upon a time"
    f.commit_inside(frozen, lambda old: long_generation(f, text), read_generation,
                    prompt_ids(text),
                    new_weights=lambda old: harness.sparse_versions(f, 1, fraction=0.1)[0])
    assert harness.commit_paths(f).get(("patch", ""), 0) > patched


def arm_fault(f, after_tensors):
    """Has Stitch's test-only loader (stitch_sglang.arm_fault, which this
    suite's SGLang was started with) make the next patch fail part-way."""
    request = json.dumps({"after_tensors": after_tensors}).encode()
    for path, body in [
            ("/begin_weight_update", {}),
            ("/update_weights_from_tensor", {
                "serialized_named_tensors": [harness.sglang_named_bytes("stitch_sglang.request",
                                                                        request)],
                "load_format": harness.SGLANG_FAULT_LOADER, "flush_cache": False}),
            ("/end_weight_update", {})]:
        status, answer, _ = f.engine.http("POST", path, body)
        assert status == 200, (path, answer)


def test_a_patch_that_fails_part_way_is_undone_and_the_old_version_serves_on(f):
    """A fault armed in the loader fails the next patch after five tensors:
    the loader restores them, the sidecar resumes SGLang on the old version
    with its label, and the version is then committed by a full reload.
    Every answer served meanwhile is made by the weights its stamps name."""
    f.assert_patch_undone_under_load(
        lambda: arm_fault(f, 5), lambda: generate(f, max_new_tokens=8),
        lambda b: (b["meta_info"]["weight_version_start"], b["meta_info"]["weight_version_end"],
                   b["output_ids"]),
        prompt_ids(PROMPT))
    assert "after 5 tensors" in f.fleet.sidecar.tail(400)
    assert engine_label(f) == f"{harness.RUN}/weight_v{max(f.fleet.published):06d}"


def test_a_client_that_leaves_is_aborted_in_sglang_and_no_other(f):
    version = max(f.fleet.published)
    def aborted():
        return harness.engine_metric(f, "sglang:num_aborted_requests_total")
    before = aborted()
    leaving, staying = long_generation(f, "A client that leaves"), long_generation(f, PROMPT)
    assert leaving.next() and staying.next()
    harness.leave_inside(f, frozen, leaving)
    harness.wait_until(lambda: aborted() == before + 1, 60,
                       "SGLang to abort the generation of the client that left")
    events = staying.rest()
    meta = events[-1]["meta_info"]
    assert meta["finish_reason"]["type"] == "length", meta
    assert meta["weight_version_end"] == version, meta
    f.assert_made_by(version, prompt_ids(PROMPT), events[-1]["output_ids"])
    assert aborted() == before + 1


def test_an_engine_killed_and_restarted_under_a_live_sidecar(f):
    def send():
        status, body, _ = generate(f, max_new_tokens=6)
        if status != 200:
            return status, body, None
        meta = body["meta_info"]
        return status, {"start": meta["weight_version_start"],
                        "end": meta["weight_version_end"]}, body["output_ids"]

    figures = harness.restart_under_load(f, send, prompt_ids(PROMPT), max(f.fleet.published))
    print(f"\nSGLang restart: {figures}")


def test_with_the_overlap_scheduler_off_sglangs_own_spans_are_exact(f):
    """The engine restarted with --disable-overlap-schedule under the live
    sidecar: SGLang's `weight_versions` then place an in-place commit
    exactly (transformers agrees), and the sidecar stamps them."""
    f.engine.close()
    f.engine.extra.append("--disable-overlap-schedule")
    f.engine.start()
    f.engine.wait_healthy()
    f.fleet.wait_serving(max(f.fleet.published), timeout=300)
    text = "Once upon a time"
    stamped = f.commit_inside(frozen, lambda old: long_generation(f, text), read_generation,
                              prompt_ids(text))
    assert stamped["weight_version_spans"] != "unknown", stamped
