"""The sidecar in front of a real vLLM (the CPU build of vLLM 0.32), judged
by transformers: every answer labelled v must be made by version v's
weights. One vLLM start serves the whole module; the tests run in order and
each states what the fleet holds when it ends.
"""

import contextlib
import os
import socket

import pytest

import harness
from harness import Fleet, Vllm, http, prompt_ids, sse_events

PROMPT = "The quick brown fox, héllo 日本 🎉"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    env = harness.Env(str(tmp_path_factory.mktemp("vllm")))
    try:
        env.engine = Vllm(env.ckpt[0], env.work, extra=["--enable-scale-out"])
        env.engine.wait_healthy()
        env.fleet = Fleet(env.work, env.ckpt[0], "vllm", env.engine.url,
                          sidecar_flags=["--patch-commits"])
        env.fleet.wait_serving(0)
        yield env
    finally:
        env.close()


def completion(f, constraint=None, prompt=PROMPT, max_tokens=12, **extra):
    body = {"model": "policy", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}
    if constraint is not None:
        body["weight_version"] = constraint
    return http("POST", f.fleet.url + "/v1/completions", body)


def chat(f, constraint=None, max_tokens=12, **extra):
    body = {"model": "policy", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}
    if constraint is not None:
        body["weight_version"] = constraint
    return http("POST", f.fleet.url + "/v1/chat/completions", body)


def assert_made_by(f, version, prompt, output):
    f.assert_made_by(version, prompt, output)


def test_init_models_tokenizer_files_tokenize_as_the_reference_engine(f):
    harness.hf_tokenizer.check(f.ckpt[0])


def test_whole_answers_are_stamped_with_the_weights_that_made_them(f):
    status, body, _ = completion(f, {"exact_version": 0})
    assert status == 200, body
    assert body["weight_version_start"] == 0 and body["weight_version_end"] == 0
    assert body["weight_version_spans"] == [[0, 0]]
    assert_made_by(f, 0, prompt_ids(PROMPT), body["choices"][0]["token_ids"])

    status, body, _ = chat(f, {"min_version": 0})
    assert status == 200, body
    assert body["weight_version_start"] == 0 and body["weight_version_end"] == 0
    assert_made_by(f, 0, harness.chat_prompt_ids(MESSAGES), body["choices"][0]["token_ids"])


def test_streamed_answers_are_stamped_event_by_event(f):
    for route, body, prompt in (
            ("/v1/completions", {"prompt": PROMPT}, prompt_ids(PROMPT)),
            ("/v1/chat/completions", {"messages": MESSAGES}, harness.chat_prompt_ids(MESSAGES))):
        events = sse_events(f.fleet.url + route, {
            "model": "policy", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True, "weight_version": {"exact_version": 0},
            **body})
        assert events, route
        tokens = []
        for e in events:
            assert e["weight_version_start"] == 0, e
            for c in e.get("choices", []):
                tokens += c.get("token_ids") or []
        assert len(tokens) == 12, (route, events[-1])
        assert_made_by(f, 0, prompt, tokens)


def test_constraints_and_the_409_body(f):
    status, body, _ = completion(f, {"min_version": 5})
    assert status == 409, body
    assert body["type"] == "WeightVersionNotReady"
    assert body["failed_bound"] == "min_version"
    assert body["applied"] == 0 and body["target_version"] == 5
    status, body, _ = completion(f, {"exact_version": 1})
    assert status == 409 and body["failed_bound"] == "exact_version", body
    status, body, _ = completion(f, {"max_staleness": 0})
    assert status == 200, body


def test_a_callers_cache_salt_is_kept_within_vllms_rule(f):
    # vLLM refuses a salt with '/', '@', '\\' or over 128 characters with a
    # 400: what the sidecar makes of the caller's own never is.
    for salt in ("tenant-a", "x" * 128):
        status, body, _ = completion(f, cache_salt=salt)
        assert status == 200, (salt, body)
    # A salt vLLM refuses on its own is still refused, by vLLM.
    status, body, _ = completion(f, cache_salt="a/b")
    assert status == 400, body


def test_control_routes_in_any_spelling_never_reach_vllm(f):
    for path in ("/pause", "/%70ause", "//pause", "/v1/../pause", "/PAUSE",
                 "/collective_rpc", "/%63ollective_rpc", "/update_weight_version"):
        status, body, _ = http("POST", f.fleet.url + path, {})
        assert status == 403, (path, body)
    # vLLM decodes paths: an encoded one the sidecar forwards reaches the
    # route it names, which is why the sidecar judges the decoded path.
    status, body, _ = http("GET", f.fleet.url + "/%76ersion")
    assert status == 200 and "version" in body, body
    for target in ("/pause?%zz", "/%70ause%zz", "/pause#x"):
        with socket.create_connection(("127.0.0.1", f.fleet.port), timeout=10) as s:
            s.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            assert s.recv(64).startswith(b"HTTP/1.1 400"), target
    status, body, _ = f.engine.http("GET", "/is_paused")
    assert body == {"is_paused": False}
    assert completion(f)[0] == 200


def test_only_vllms_read_only_routes_are_forwarded(f):
    """vLLM's routes outside the block list and the read-only set (its
    sleep and pause state, LoRA, responses, pooling, ...) are refused."""
    harness.check_forwarded_routes(f)
    for path in ("/is_paused", "/v1/responses", "/pooling", "/invocations"):
        status, body, _ = http("POST", f.fleet.url + path, {})
        assert status == 403 and body["error"]["type"] == "RouteNotForwarded", (path, body)


def test_metrics_carry_vllms_own_families(f):
    status, text, _ = http("GET", f.fleet.url + "/metrics")
    assert status == 200
    assert "stitch_sidecar_requests_admitted_total" in text
    assert "vllm:prefix_cache_queries_total" in text
    assert "stitch_sidecar_engine_metrics_up" in text


def test_full_and_delta_versions_are_followed(f):
    f.fleet.publish_full(1, f.ckpt[1])
    f.fleet.wait_serving(1)
    status, body, _ = completion(f, {"exact_version": 1})
    assert status == 200, body
    assert body["weight_version_start"] == 1 and body["weight_version_end"] == 1
    assert_made_by(f, 1, prompt_ids(PROMPT), body["choices"][0]["token_ids"])

    f.fleet.publish_delta(2, f.ckpt[2])
    f.fleet.wait_serving(2)
    status, body, _ = chat(f, {"exact_version": 2})
    assert status == 200, body
    assert_made_by(f, 2, harness.chat_prompt_ids(MESSAGES), body["choices"][0]["token_ids"])
    status, body, _ = f.engine.http("GET", "/weight_info")
    assert body == {"weight_version": "r1/weight_v000002"}, body


def prefix_hits(f):
    _, text, _ = f.engine.http("GET", "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def test_the_prefix_cache_never_serves_one_versions_prefix_to_another(f):
    long_prompt = "A long shared system prompt. " * 12  # 348 tokens: two 128-token blocks
    assert completion(f, prompt=long_prompt, max_tokens=1)[0] == 200
    before = prefix_hits(f)
    assert completion(f, prompt=long_prompt, max_tokens=1)[0] == 200
    assert prefix_hits(f) - before >= 128, "the same version reuses its cached prefix"

    f.fleet.publish_delta(3, f.ckpt[0])
    f.fleet.wait_serving(3)
    before = prefix_hits(f)
    status, body, _ = completion(f, {"exact_version": 3}, prompt=long_prompt, max_tokens=4)
    assert status == 200, body
    assert prefix_hits(f) == before, "a new version must not reuse the old version's prefix"
    assert_made_by(f, 3, prompt_ids(long_prompt), body["choices"][0]["token_ids"])
    assert completion(f, prompt=long_prompt, max_tokens=1)[0] == 200
    assert prefix_hits(f) - before >= 128


def test_a_label_changed_behind_the_sidecars_back_is_noticed(f):
    status, _, _ = f.engine.http("POST", "/update_weight_version",
                        {"new_version": "r1/weight_v000009"})
    assert status == 200

    def relabelled_by_the_sidecar():
        return f.engine.http("GET", "/weight_info")[1] == {
            "weight_version": "r1/weight_v000003"}
    harness.wait_until(relabelled_by_the_sidecar, 120, "the sidecar to load v3 again")
    f.fleet.wait_serving(3)
    assert "r1/weight_v000009" in f.fleet.sidecar.tail(200)
    status, body, _ = completion(f, {"exact_version": 3})
    assert status == 200, body
    assert_made_by(f, 3, prompt_ids(PROMPT), body["choices"][0]["token_ids"])


def test_the_engines_api_key_guards_it_and_the_sidecar_presents_it(f):
    body = {"model": "policy", "prompt": PROMPT, "max_tokens": 2}
    for key in (None, "wrong"):
        status, answer, _ = f.engine.http("POST", "/v1/completions", body, key=key)
        assert status == 401, answer
    # Through the sidecar a client needs no engine key, and its own
    # Authorization is not what reaches the engine.
    assert completion(f, max_tokens=2)[0] == 200
    status, answer, _ = http("POST", f.fleet.url + "/v1/completions", body,
                             {"Authorization": "Bearer wrong"})
    assert status == 200, answer


@contextlib.contextmanager
def frozen(f):
    """Holds vLLM's running requests where they are (`/pause?mode=keep`),
    so that what the test does next lands inside them; the sidecar's next
    commit resumes the engine."""
    status, body, _ = f.engine.http("POST", "/pause?mode=keep")
    assert status == 200, body
    try:
        yield
    finally:  # whatever happened, the engine serves again
        f.engine.http("POST", "/resume")


def streamed_tokens(events):
    return [t for e in events for c in e.get("choices", []) for t in c.get("token_ids") or []]


def long_stream(f, prompt, max_tokens=400):
    return harness.Stream(f.fleet.url + "/v1/completions", {
        "model": "policy", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, "stream": True,
        "weight_version": {"min_version": max(f.fleet.published)}})


def read_stream(events):
    return streamed_tokens(events), events[-1]


def test_an_in_place_commit_inside_a_streamed_generation(f):
    """A DELTA committed (/pause?mode=keep) while a long generation streams:
    the generation goes on under the new weights, its stamps say both
    versions, and its spans are exact or "unknown", never wrong."""
    prompt = "Once upon a time"
    f.commit_inside(frozen, lambda old: long_stream(f, prompt), read_stream, prompt_ids(prompt))


def test_vllms_token_route_carries_its_own_exact_spans_across_an_in_place_commit(f):
    """/inference/v1/generate (vLLM's tokens in, tokens out): stamped, the
    client's request_id given back, and across an in-place commit the
    per-token versions vLLM reports become exact spans."""
    old, prompt = max(f.fleet.published), prompt_ids("Once upon a time")
    body = {"token_ids": prompt, "request_id": "mine-1", "weight_version": {"exact_version": old},
            "sampling_params": {"max_tokens": 12, "temperature": 0, "ignore_eos": True}}
    status, answer, _ = http("POST", f.fleet.url + "/inference/v1/generate", body)
    assert status == 200, answer
    assert answer["request_id"] == "generate-tokens-mine-1", answer
    assert answer["weight_version_start"] == old and answer["weight_version_spans"] == [[0, old]]
    assert_made_by(f, old, prompt, answer["choices"][0]["token_ids"])

    def open_stream(old):
        return harness.Stream(f.fleet.url + "/inference/v1/generate", {
            "token_ids": prompt, "stream": True, "weight_version": {"min_version": old},
            "sampling_params": {"max_tokens": 1800, "temperature": 0, "ignore_eos": True}})
    stamped = f.commit_inside(frozen, open_stream, read_stream, prompt)
    assert stamped["weight_version_spans"] != "unknown", stamped


def resumed_on(f, version):
    """The sidecar serves `version` and its commit is over: it resumed the
    engine. Asked of the sidecar, not of vLLM: while vLLM streams, its own
    status calls wait their turn at the engine core, seconds on a loaded
    machine, and the generation runs on meanwhile."""
    info = f.fleet.info()
    return info.get("applied_version") == version and info.get("sync_state") == "IDLE"


def test_three_patched_versions_commit_inside_one_streamed_generation(f):
    """Three sparse DELTAs in a row, each committed as an in-place patch
    (--patch-commits, Stitch's worker extension) while one long generation
    streams on /inference/v1/generate: vLLM's per-token versions become the
    answer's spans, and transformers agrees with every token of every span.
    The DELTAs between unrelated models earlier in this module were too dense
    to patch and were reloaded instead.

    Each commit resumes the engine; the test holds it again as soon as the
    sidecar has resumed it, so that the next commit lands inside the same
    generation (1800 tokens, several seconds here). On a loaded machine the
    hold itself can wait seconds for vLLM and the generation can end first:
    that answer's spans are checked all the same, and the test tries again
    (at most five times)."""
    assert harness.commit_paths(f).get(("reload", "dense"), 0) >= 1, harness.commit_paths(f)
    prompt = prompt_ids("Once upon a time")
    attempts = []
    for _ in range(5):
        old = max(f.fleet.published)
        targets = harness.sparse_versions(f, 3)
        patched = harness.commit_paths(f).get(("patch", ""), 0)
        stream = harness.Stream(f.fleet.url + "/inference/v1/generate", {
            "token_ids": prompt, "stream": True, "weight_version": {"min_version": old},
            "sampling_params": {"max_tokens": 1800, "temperature": 0, "ignore_eos": True}})
        events = [stream.next()]
        try:
            for i, target in enumerate(targets):
                # Held, so the commit lands inside the generation.
                assert f.engine.http("POST", "/pause?mode=keep")[0] == 200
                f.fleet.publish_delta(old + 1 + i, target)
                harness.wait_until(lambda: resumed_on(f, old + 1 + i), 120,
                                   f"v{old + 1 + i} to be committed", every=0.005)
        finally:
            f.engine.http("POST", "/resume")
        tokens, last = read_stream(events + stream.rest())
        assert harness.commit_paths(f).get(("patch", ""), 0) == patched + 3, harness.commit_paths(f)
        spans = last["weight_version_spans"]
        assert spans != "unknown" and spans[0] == [0, old], spans
        assert [v for _, v in spans] == sorted({v for _, v in spans}), spans
        gap = f.oracle.spans_gap([(start, f.fleet.published[v]) for start, v in spans], prompt,
                                 tokens)
        assert gap <= harness.LOGIT_TIE, (spans, gap)
        if spans[-1][1] == old + 3:
            # The spans matter: read as the old version's alone, the answer is not.
            assert not f.oracle.made_by(f.fleet.published[old], prompt, tokens)
            break
        attempts.append(spans)
    else:
        raise AssertionError(f"three commits did not land inside one generation: {attempts}")
    status, body, _ = completion(f, {"exact_version": old + 3})
    assert status == 200, body
    assert f.oracle.made_by(f.fleet.published[old + 3], prompt_ids(PROMPT),
                            body["choices"][0]["token_ids"])


def test_a_patch_that_fails_part_way_is_undone_and_the_old_version_serves_on(f):
    """A fault armed in the worker extension fails the next patch after five
    tensors: the extension restores them, the sidecar resumes the engine on
    the old version with its label, and the version is then committed by a
    full reload. Every answer served meanwhile is made by the weights its
    label names."""
    def arm_fault():
        status, body, _ = f.engine.http("POST", "/collective_rpc", {
            "method": "stitch_patch_arm_fault", "kwargs": {"after_tensors": 5}})
        assert status == 200, body

    f.assert_patch_undone_under_load(
        arm_fault, lambda: completion(f, max_tokens=8),
        lambda b: (b["weight_version_start"], b["weight_version_end"],
                   b["choices"][0]["token_ids"]),
        prompt_ids(PROMPT))


def test_a_client_that_leaves_is_aborted_in_vllm_and_no_other(f):
    """vLLM counts no aborted request in its metrics, so the abort shows in
    the tokens it generates: once both generations are over, fewer than two
    whole ones."""
    version = max(f.fleet.published)
    generated = harness.engine_metric(f, "vllm:generation_tokens_total")
    leaving, staying = long_stream(f, "A client that leaves"), long_stream(f, PROMPT)
    assert leaving.next()
    first = staying.next()
    harness.leave_inside(f, frozen, leaving)
    events = [first] + staying.rest()
    assert events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
    assert events[-1]["weight_version_end"] == version, events[-1]
    tokens = streamed_tokens(events)
    assert len(tokens) == 400
    assert f.oracle.made_by(f.fleet.published[version], prompt_ids(PROMPT), tokens)
    harness.wait_until(lambda: harness.engine_metric(f, "vllm:num_requests_running") == 0, 60,
                       "vLLM to run no request")
    made = harness.engine_metric(f, "vllm:generation_tokens_total") - generated
    assert 400 <= made < 800, f"vLLM generated {made} tokens: the generation left was not aborted"


def test_an_engine_killed_and_restarted_under_a_live_sidecar(f):
    """kill -9 of vLLM's process group under load, a restart on the same
    port: no answer is mislabelled, the rest are retryable, and the replica
    serves again once the engine is back."""
    def send():
        status, body, _ = completion(f, max_tokens=6)
        if status != 200:
            return status, body, None
        return status, {"start": body["weight_version_start"],
                        "end": body["weight_version_end"]}, body["choices"][0]["token_ids"]

    figures = harness.restart_under_load(f, send, prompt_ids(PROMPT), max(f.fleet.published))
    print(f"\nvLLM restart: {figures}")


def committing(f):
    _, text, _ = http("GET", f.fleet.url + "/metrics")
    return 'stitch_sidecar_sync_state{state="COMMITTING"} 1' in text


def test_a_quiesce_commit_lets_the_generations_in_flight_finish_first(f):
    """--commit-mode quiesce (vLLM's /pause?mode=wait), from a new sidecar
    over a new store: a generation in flight when a version is published
    finishes on the weights it began with, and the version is committed
    after it."""
    f.fleet.close()
    work = os.path.join(f.work, "quiesce")
    os.makedirs(work)
    f.fleet = Fleet(work, f.ckpt[0], "vllm", f.engine.url,
                    sidecar_flags=["--commit-mode", "quiesce"])
    f.fleet.wait_serving(0)
    stream = long_stream(f, PROMPT)
    first = stream.next()
    with frozen(f):
        f.fleet.publish_delta(1, f.ckpt[1])
        harness.wait_until(lambda: committing(f), 60, "the sidecar to begin its commit")
    f.fleet.wait_serving(1)
    events = [first] + stream.rest()
    tokens = streamed_tokens(events)
    assert len(tokens) == 400, events[-1]
    assert events[-1]["weight_version_start"] == 0 and events[-1]["weight_version_end"] == 0
    assert events[-1]["weight_version_spans"] == [[0, 0]], events[-1]
    assert_made_by(f, 0, prompt_ids(PROMPT), tokens)
    status, body, _ = completion(f, {"exact_version": 1})
    assert status == 200, body
    assert_made_by(f, 1, prompt_ids(PROMPT), body["choices"][0]["token_ids"])


def field(doc, path):
    for part in path.split("."):
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise KeyError(path)
    return doc


def test_the_adapters_route_list_holds_for_the_installed_vllm(f):
    """tests/data/engine_api/vllm.txt, which the reference engine's vLLM
    dialect is tested against, is what the installed vLLM answers: every
    call gets the status and fields listed, and every route the adapter
    relies on is in vLLM's /openapi.json. (Last: it pauses, relabels and
    reloads the engine behind the sidecar, which is stopped first.)"""
    f.fleet.close()
    listed = os.path.join(harness.REPO, "tests", "data", "engine_api", "vllm.txt")
    _, openapi, _ = f.engine.http("GET", "/openapi.json")
    paths = openapi["paths"]
    failures = []
    with open(listed) as lines:
        for line in lines:
            words = line.split()
            if not words or words[0] not in ("call", "relies"):
                continue
            if words[0] == "relies":
                method, path = words[1], words[2]
                if method.lower() not in paths.get(path, {}):
                    failures.append(f"{line.strip()}: not in vLLM's /openapi.json")
                continue
            method, target, body = words[1], words[2], words[3]
            arrow = words.index("->")
            status, checks = int(words[arrow + 1]), words[arrow + 2:]
            body = None if body == "-" else body.replace("$MODEL", f.ckpt[0]).encode()
            got, answer, _ = f.engine.http(method, target, body)
            if got != status:
                failures.append(f"{line.strip()}: status {got}: {answer}")
                continue
            for check in checks:
                name, _, want = check.partition("=")
                try:
                    value = field(answer, name)
                except (KeyError, IndexError, ValueError, TypeError):
                    failures.append(f"{line.strip()}: no {name} in {answer}")
                    continue
                if want and str(value).lower() != want.lower():
                    failures.append(f"{line.strip()}: {name} is {value!r}")
    assert not failures, "\n".join(failures)
