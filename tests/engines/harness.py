"""What the real-engine suites share: models that real engines load, a real
engine in its own process group, a store with a sidecar in front of the
engine, and an oracle that is not ours (Hugging Face transformers).

Everything runs on 127.0.0.1 with ports picked free, in temporary
directories; every process started here is stopped by its owner's close().
"""

import base64
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "examples"))
import hf_tokenizer  # noqa: E402
# A process in its own group with its log, free ports and waits: the same
# as the local fleet's that the examples start.
from local_fleet import Process, free_port, wait_until  # noqa: E402,F401

STITCH = os.environ.get("STITCH_BIN") or os.path.join(REPO, "build/src/stitch/cli/stitch")
RUN = "r1"
# A real engine starts in about a minute here; minutes with a large model.
ENGINE_START_TIMEOUT = float(os.environ.get("STITCH_ENGINE_START_TIMEOUT", "600"))
# bf16 kernels differ between an engine and transformers, and a random
# model has near ties between its top logits: a served token is the
# weights' greedy choice when its logit is within LOGIT_TIE of the best one
# that transformers computes for the same prefix.
LOGIT_TIE = 0.05
# Stitch's vLLM worker extension, and where it is importable from. The
# suites' vLLM is started with its fault-injecting form instead, whose
# stitch_patch_arm_fault the production class does not have.
PATCH_EXTENSION = "stitch_vllm.WeightPatchExtension"
FAULT_EXTENSION = "stitch_vllm.FaultInjectingExtension"
PATCH_EXTENSION_PATH = os.path.join(REPO, "python", "src")
SGLANG_PATCH_LOADER = "stitch_sglang.apply_patch"
SGLANG_FAULT_LOADER = "stitch_sglang.arm_fault"


def http(method, url, body=None, headers=None, timeout=120):
    """(status, parsed JSON or text, headers) of one request; never raises
    for an HTTP error status."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw, hdrs = r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        status, raw, hdrs = e.code, e.read(), dict(e.headers)
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text), hdrs
    except ValueError:
        return status, text, hdrs


def sse_events(url, body, timeout=120):
    """The JSON events of a streamed answer (`data: [DONE]` ends it)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events


class Stream:
    """A streamed answer read event by event (its JSON events; None once
    `data: [DONE]` or the end came)."""

    def __init__(self, url, body, timeout=120):
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        self.response = urllib.request.urlopen(req, timeout=timeout)

    def next(self):
        for line in self.response:
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            return None if payload == "[DONE]" else json.loads(payload)
        return None

    def rest(self):
        events = []
        while (e := self.next()) is not None:
            events.append(e)
        return events

    def close(self):
        self.response.close()


def stitch(*args, check=True):
    r = subprocess.run([STITCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"stitch {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def make_model(path, seed):
    """A Llama checkpoint both the reference engine and real engines load
    (`stitch engine init-model` writes Hugging Face tokenizer files of the
    reference engine's byte vocabulary beside the weights): head dimension
    32 (vLLM's CPU attention needs at least 32), bf16."""
    stitch("engine", "init-model", path, "--hidden", "128", "--layers", "2", "--heads", "4",
           "--dtype", "bfloat16", "--seed", str(seed))
    return path


# The engines run with an API key, which the sidecar presents
# (--engine-token-file); requests made here straight to an engine carry it
# through EngineServer.http.
ENGINE_KEY = "stitch-engine-test-key"


def rewrite_tensors(source, path, edit):
    """A copy of checkpoint `source` at `path` whose tensors `edit(name,
    tensor)` changed in place, file by file, in name order."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(source, path)
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        file = os.path.join(path, name)
        with safe_open(file, framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        for key in sorted(tensors):
            edit(key, tensors[key])
        save_file(tensors, file, metadata=metadata)
    return path


def make_sparse_variant(source, path, fraction, seed):
    """A copy of checkpoint `source` in which `fraction` of every tensor's
    values change sign: the kind of sparse version a trainer's step makes,
    that a weight patch carries. A flip keeps every value's magnitude, so a
    chain of any length keeps the model's scale. (Values drawn at random
    compound: with three times the tensor's spread, the weights doubled
    every ten versions, the norms' gains went negative, and near ties
    between the engine's bf16 logits and transformers' grew with them.)"""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def flip(_, tensor):
        flat = tensor.view(-1)
        picked = torch.randperm(flat.numel(), generator=gen)[:max(1, int(flat.numel() * fraction))]
        flat[picked] = -flat[picked]
    return rewrite_tensors(source, path, flip)


class EngineServer:
    """A real engine serving `model` as "policy" on 127.0.0.1 behind
    ENGINE_KEY, in its own process group; start() again after a kill
    restarts it on its port."""

    name = "engine"

    def __init__(self, model, workdir, port=None, extra=()):
        self.model, self.workdir = model, workdir
        self.extra = ["--api-key", ENGINE_KEY, *extra]
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = None
        self.start()

    def command(self):
        raise NotImplementedError

    def environment(self):
        return None

    def start(self):
        self.process = Process(self.command(),
                               os.path.join(self.workdir, f"{self.name}-{self.port}.log"),
                               env=self.environment())

    def wait_healthy(self, timeout=ENGINE_START_TIMEOUT):
        def healthy():
            if not self.process.alive():
                raise AssertionError(f"{self.name} exited before /health:\n{self.process.tail()}")
            try:
                return http("GET", self.url + "/health", timeout=10)[0] == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                return False
        wait_until(healthy, timeout, f"{self.name}'s /health")

    def http(self, method, path, body=None, key=ENGINE_KEY):
        """A request straight to the engine, with its API key."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return http(method, self.url + path, body, headers)

    def close(self):
        if self.process is not None:
            self.process.close()


class Vllm(EngineServer):
    """vLLM's CPU build, through scripts/vllm_serve.py (run by this
    environment's python: the suite runs in the engine's environment), with
    Stitch's worker extension (python/src/stitch_vllm) for in-place
    patches, in the form that tests can make fail part-way."""

    name = "vllm"

    def command(self):
        return [sys.executable, os.path.join(REPO, "scripts", "vllm_serve.py"), "serve", self.model,
                "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", "policy",
                "--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager",
                "--max-num-seqs", "8", "--enable-prefix-caching",
                "--worker-extension-cls", FAULT_EXTENSION, *self.extra]

    def environment(self):
        return {"PYTHONPATH": PATCH_EXTENSION_PATH}


class Sglang(EngineServer):
    """Stock SGLang on CPU, through sglang_serve.sh, labelled with the boot
    version so that the sidecar verifies it instead of reloading, with
    Stitch's custom weight loader (python/src/stitch_sglang) for in-place
    patches and the test-only loader that arms a fault."""

    name = "sglang"

    def command(self):
        return ["bash", os.path.join(HERE, "sglang_serve.sh"), self.model, str(self.port),
                "--served-model-name", "policy", "--weight-version", f"{RUN}/weight_v000000",
                "--enable-metrics", "--custom-weight-loader", SGLANG_PATCH_LOADER,
                SGLANG_FAULT_LOADER, *self.extra]

    def environment(self):
        return {"PYTHONPATH": PATCH_EXTENSION_PATH}


class Fleet:
    """A store of run r1 (claimed at version 0 = `base`) and one sidecar in
    front of an engine."""

    def __init__(self, workdir, base, engine, engine_url, sidecar_flags=()):
        self.workdir, self.base = workdir, base
        self.store = os.path.join(workdir, "store")
        stitch("claim", "--store", self.store, "--run-id", RUN, "--boot-version", "0")
        key_file = os.path.join(workdir, "engine.key")
        with open(key_file, "w") as out:
            out.write(ENGINE_KEY + "\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["sidecar", "--store", self.store, "--run-id", RUN, "--engine", engine,
                     "--engine-url", engine_url, "--base-checkpoint", base,
                     "--local-checkpoint", os.path.join(workdir, "local"),
                     "--reconcile-interval", "0.5", "--watchdog-interval", "0.5",
                     "--engine-token-file", key_file, "--port", str(self.port),
                     *sidecar_flags]
        self.sidecar = Process([STITCH, *self.args], os.path.join(workdir, "sidecar.log"))
        self.published = {0: base}  # version -> the checkpoint whose weights it holds

    def info(self):
        status, body, _ = http("GET", self.url + "/server_info", timeout=10)
        return body if status == 200 else {}

    def applied(self):
        try:
            return self.info().get("applied_version")
        except (urllib.error.URLError, ConnectionError, OSError):
            return None

    def wait_serving(self, version, timeout=120):
        def serving():
            if not self.sidecar.alive():
                raise AssertionError(f"the sidecar exited:\n{self.sidecar.tail()}")
            try:
                return self.info().get("ready") and self.applied() == version
            except (urllib.error.URLError, ConnectionError, OSError):
                return False
        wait_until(serving, timeout, f"the sidecar to serve v{version}")

    def publish_full(self, version, checkpoint):
        out = os.path.join(self.workdir, "out", f"weight_v{version:06d}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        stitch("delta", "full", "--checkpoint", checkpoint, "--out", out, "--version",
               str(version), "--run-id", RUN)
        stitch("publish", "--store", self.store, "--run-id", RUN, "--pool", f"static:{self.url}",
               out)
        self.published[version] = checkpoint

    def publish_delta(self, version, target):
        """DELTA `version` from the previous version's weights to `target`'s."""
        base = self.published[version - 1]
        out = os.path.join(self.workdir, "out", f"weight_v{version:06d}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        stitch("delta", "encode", "--base", base, "--target", target, "--out", out,
               "--version", str(version), "--base-version", str(version - 1), "--run-id", RUN)
        stitch("publish", "--store", self.store, "--run-id", RUN, "--base", base,
               "--pool", f"static:{self.url}", out)
        self.published[version] = target

    def close(self):
        self.sidecar.close()


class Oracle:
    """transformers' judgement of which weights produced an answer: fed the
    prompt and the served tokens, each served token must be the weights'
    greedy choice (within LOGIT_TIE of the best logit)."""

    def __init__(self):
        self._models = {}

    def _model(self, checkpoint):
        if checkpoint not in self._models:
            import torch
            from transformers import AutoModelForCausalLM

            m = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
            m.eval()
            self._models[checkpoint] = m
        return self._models[checkpoint]

    def worst_gap(self, checkpoint, prompt_ids, output_ids):
        """How far below the weights' best logit the worst served token is."""
        import torch

        if not output_ids:
            return 0.0
        m = self._model(checkpoint)
        with torch.no_grad():
            logits = m(torch.tensor([prompt_ids + output_ids])).logits[0].float()
        logits = logits[len(prompt_ids) - 1:-1]
        return max(float(logits[i].max() - logits[i][t]) for i, t in enumerate(output_ids))

    def made_by(self, checkpoint, prompt_ids, output_ids):
        return self.worst_gap(checkpoint, prompt_ids, output_ids) <= LOGIT_TIE

    def switched_gap(self, old, new, prompt_ids, output_ids, k):
        """worst_gap for an answer whose first `k` tokens `old`'s weights
        made and the rest `new`'s. An engine switched in place keeps the keys
        and values `old` computed for the positions before the switch; one
        that recomputes them (a retracted request, a flushed cache) uses
        `new`'s: the smaller gap of the two."""
        import torch

        if k == 0:
            return self.worst_gap(new, prompt_ids, output_ids)
        before = self.worst_gap(old, prompt_ids, output_ids[:k])
        if k == len(output_ids):
            return before
        recomputed = self.worst_gap(new, prompt_ids + output_ids[:k], output_ids[k:])
        ids = prompt_ids + output_ids
        split = len(prompt_ids) + k - 1  # inputs the old weights processed
        with torch.no_grad():
            past = self._model(old)(torch.tensor([ids[:split]]), use_cache=True).past_key_values
            logits = self._model(new)(torch.tensor([ids[split:-1]]), past_key_values=past,
                                      use_cache=True).logits[0].float()
        kept = max(float(logits[j].max() - logits[j][t]) for j, t in enumerate(output_ids[k:]))
        return max(before, min(kept, recomputed))

    def spans_gap(self, spans, prompt_ids, output_ids):
        """worst_gap for an answer switched in place at every span's start:
        `spans` is [(first token, checkpoint), ...] from token 0 on. As in
        switched_gap, each span's weights either take over the keys and
        values computed before it or recompute them: the smaller gap of the
        two, span by span."""
        import torch

        ids = prompt_ids + output_ids
        past, fed, worst = None, 0, 0.0
        for i, (start, checkpoint) in enumerate(spans):
            end = spans[i + 1][0] if i + 1 < len(spans) else len(output_ids)
            if end <= start:
                continue
            # The inputs whose logits choose tokens [start, end).
            lo, hi = len(prompt_ids) + start - 1, len(prompt_ids) + end - 1
            with torch.no_grad():
                out = self._model(checkpoint)(torch.tensor([ids[fed:hi]]), past_key_values=past,
                                              use_cache=True)
            past, fed = out.past_key_values, hi
            logits = out.logits[0].float()[-(hi - lo):]
            kept = max(float(logits[j].max() - logits[j][t])
                       for j, t in enumerate(output_ids[start:end]))
            recomputed = self.worst_gap(checkpoint, prompt_ids + output_ids[:start],
                                        output_ids[start:end])
            worst = max(worst, min(kept, recomputed))
        return worst

    def switch_points(self, old, new, prompt_ids, output_ids, lowest=0):
        """The token offsets (>= lowest) at which an in-place switch from
        `old` to `new` explains the answer."""
        return [k for k in range(lowest, len(output_ids) + 1)
                if self.switched_gap(old, new, prompt_ids, output_ids, k) <= LOGIT_TIE]

    def which(self, checkpoints, prompt_ids, output_ids):
        """The versions (keys of `checkpoints`) whose weights could have
        produced the answer."""
        return sorted(v for v, c in checkpoints.items() if self.made_by(c, prompt_ids, output_ids))


def prompt_ids(text):
    """The token ids the reference engine and real engines make of a text
    prompt (BOS, then its UTF-8 bytes)."""
    return hf_tokenizer.ref_encode(text)


def chat_prompt_ids(messages):
    return hf_tokenizer.ref_encode(hf_tokenizer.ref_chat(messages))


class Env:
    """One suite's engine, fleet, checkpoints (by seed) and oracle."""

    def __init__(self, work, seeds=(0, 1, 2)):
        self.work = work
        self.ckpt = {s: make_model(os.path.join(work, f"seed{s}"), s) for s in seeds}
        self.oracle = Oracle()
        self.engine = None
        self.fleet = None

    def assert_made_by(self, version, prompt, output):
        """The answer is version `version`'s greedy output, and, when those
        are one of the suite's unrelated checkpoints, no other of them could
        have made it (the oracle tells them apart; a sparse variant of one
        may answer as it does)."""
        weights = self.fleet.published[version]
        if weights not in self.ckpt.values():
            assert self.oracle.made_by(weights, prompt, output), (
                f"tokens {output} should be v{version}'s ({weights})")
            return
        makers = [self.ckpt[s] for s in self.oracle.which(self.ckpt, prompt, output)]
        assert makers == [weights], (
            f"tokens {output} should be v{version}'s ({weights}) alone: {makers}")

    def commit_inside(self, frozen, open_stream, read, prompt, attempts=3, new_weights=None):
        """Publishes the next version (a DELTA to other weights) while a
        long generation streams, the engine held (`frozen(env)`, a context)
        so that the commit lands inside it, and checks the answer: made by
        the old weights up to a switch after the tokens read before the
        commit and by the new ones after it, stamped with both, its spans
        exact or "unknown". Returns the last event's stamps.

        `open_stream(old)` opens the stream (harness.Stream); `read(events)`
        gives (tokens, stamps of the last event); `new_weights(old)`, the
        checkpoint the DELTA goes to (default: another seed's weights). On a loaded machine the
        generation may end before the engine is held (this model makes 400
        tokens in about a second; a stream with exact spans, judged in one
        pass, can ask for thousands): such an answer must be the old
        version's alone, and another attempt is made."""
        for _ in range(attempts):
            old = max(self.fleet.published)
            stream = open_stream(old)
            first = stream.next()
            seen = len(read([first])[0])
            target = (new_weights(old) if new_weights else
                      next(c for c in self.ckpt.values() if c != self.fleet.published[old]))
            with frozen(self):
                self.fleet.publish_delta(old + 1, target)
                self.fleet.wait_serving(old + 1)
            tokens, stamped = read([first] + stream.rest())
            if stamped["weight_version_end"] == old + 1:
                self._assert_switched_inside(old, prompt, tokens, seen, stamped)
                return stamped
            assert stamped["weight_version_spans"] == [[0, old]], stamped
            self.assert_made_by(old, prompt, tokens)
        raise AssertionError(f"no commit landed inside a generation in {attempts} attempts")

    def wrong_answers(self, prompt, answers):
        """Of `answers` [(start version, end version, tokens)], those that the
        weights their stamps name did not make (a switch from start to end
        somewhere inside for answers stamped with two)."""
        wrong = []
        for start, end, tokens in answers:
            if start == end:
                ok = self.oracle.made_by(self.fleet.published[start], prompt, tokens)
            else:
                ok = bool(self.oracle.switch_points(self.fleet.published[start],
                                                    self.fleet.published[end], prompt, tokens))
            if not ok:
                wrong.append((start, end, tokens))
        return wrong

    def assert_patch_undone_under_load(self, arm_fault, send, stamps, prompt):
        """Publishes a sparse DELTA whose in-place patch fails part-way
        (`arm_fault()` arms the engine's fault) while `send()` sends request
        after request, and checks what follows: the patch undone and counted,
        the old version served on, then the version committed by a full
        reload, and every answer (`stamps(body)`: start and end versions,
        tokens) made by the weights its stamps name."""
        old = max(self.fleet.published)
        [target] = sparse_versions(self, 1)
        before = commit_paths(self)
        undone = sidecar_counter(self, "commits_undone_total")
        arm_fault()
        answers, stop = [], threading.Event()

        def load():
            while not stop.is_set():
                answers.append(send())

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        self.fleet.publish_delta(old + 1, target)
        self.fleet.wait_serving(old + 1)
        wait_until(lambda: any(stamps(b)[0] == old + 1 for s, b, _ in answers if s == 200), 60,
                   "an answer of the new version")
        stop.set()
        thread.join(60)

        after = commit_paths(self)
        assert after.get(("patch-undone", ""), 0) == before.get(("patch-undone", ""), 0) + 1, after
        assert (after.get(("reload", "patch-failed"), 0)
                == before.get(("reload", "patch-failed"), 0) + 1), after
        assert sidecar_counter(self, "commits_undone_total") == undone + 1
        assert "undone" in self.fleet.sidecar.tail(400)
        assert all(s in (200, 503) for s, _, _ in answers), [
            a for a in answers if a[0] not in (200, 503)]
        served = [stamps(b) for s, b, _ in answers if s == 200]
        assert any(start == old for start, _, _ in served)
        assert not self.wrong_answers(prompt, served)

    def _assert_switched_inside(self, old, prompt, output, seen, stamped):
        new = old + 1
        assert stamped["weight_version_start"] == old, stamped
        spans = stamped["weight_version_spans"]
        if spans != "unknown":
            # Exact spans name the switch: judged there alone (one pass, so
            # that a generation of thousands of tokens stays cheap to judge).
            assert len(spans) == 2 and spans[0] == [0, old] and spans[1][1] == new, spans
            assert seen <= spans[1][0] < len(output), (spans, seen, len(output))
            gap = self.oracle.spans_gap([(0, self.fleet.published[old]),
                                         (spans[1][0], self.fleet.published[new])],
                                        prompt, output)
            assert gap <= LOGIT_TIE, (spans, gap)
            assert not self.oracle.made_by(self.fleet.published[old], prompt, output), (
                "the new weights made none of it: no switch inside")
            return
        points = self.oracle.switch_points(self.fleet.published[old], self.fleet.published[new],
                                           prompt, output, lowest=seen)
        assert points, "the answer is neither version's, nor a switch from one to the other"
        assert len(output) not in points, "the new weights made none of it: no switch inside"

    def close(self):
        if self.fleet is not None:
            self.fleet.close()
        if self.engine is not None:
            self.engine.close()


def commit_paths(env):
    """The sidecar's engine_commits_total, as {(path, reason): count}."""
    _, text, _ = http("GET", env.fleet.url + "/metrics")
    paths = {}
    for line in text.splitlines():
        if line.startswith("stitch_sidecar_engine_commits_total{"):
            labels, value = line.rsplit(" ", 1)
            key = (re.search(r'path="([^"]*)"', labels).group(1),
                   re.search(r'reason="([^"]*)"', labels).group(1))
            paths[key] = float(value)
    return paths


def sparse_versions(env, count, fraction=0.05):
    """`count` checkpoints, each changing `fraction` of the values of the one
    before, from the weights of the latest version published."""
    latest = max(env.fleet.published)
    checkpoints, last = [], env.fleet.published[latest]
    for i in range(count):
        last = make_sparse_variant(
            last, os.path.join(env.work, f"sparse-v{latest + i + 1}-{fraction}"), fraction,
            seed=latest + i)
        checkpoints.append(last)
    return checkpoints


def sglang_named_bytes(name, data):
    """SGLang's `serialized_named_tensors` entry for [(name, uint8 tensor of
    `data`)], as the sidecar writes it (SglangNamedBytesPayload): a protocol
    2 pickle that names only torch.ByteTensor, base64."""
    p = b"\x80\x02](X" + struct.pack("<I", len(name.encode())) + name.encode()
    p += b"ctorch\nByteTensor\n](" + b"".join(b"K" + bytes([c]) for c in data)
    return base64.b64encode(p + b"e\x85R\x86e.").decode()


def sidecar_counter(env, name):
    """A counter of the sidecar's /metrics (`stitch_sidecar_<name>`)."""
    _, text, _ = http("GET", env.fleet.url + "/metrics")
    for line in text.splitlines():
        if line.startswith(f"stitch_sidecar_{name} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no stitch_sidecar_{name} in the sidecar's /metrics")


VERSIONED_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions",
                    "/inference/v1/generate")
# The sidecar answers these itself (docs/sidecar.md); they never reach the
# engine whatever it serves under the same path.
SIDECAR_ROUTES = ("/health", "/server_info", "/metrics", "/wake", "/peer/v1/file")
REFUSED = ("RouteBlocked", "RouteNotForwarded")


def check_forwarded_routes(env):
    """The sidecar's allow-list against the running engine's own route table
    (its /openapi.json): every read-only route the sidecar forwards is one
    the engine serves, and every route of the engine that is neither
    versioned nor on that list is refused by the sidecar, in every method
    the engine takes, without reaching the engine."""
    import re

    status, body, _ = http("POST", env.fleet.url + "/stitch_no_such_route", {})
    assert status == 403 and body["error"]["type"] == "RouteNotForwarded", body
    listed = re.search(r"the engine's read-only routes \(([^)]*)\)", body["error"]["message"])
    assert listed, body
    allowed = [r.strip() for r in listed.group(1).split(",")]
    status, schema, _ = env.engine.http("GET", "/openapi.json")
    assert status == 200, schema
    table = {path: [m.upper() for m in ops] for path, ops in schema["paths"].items()}

    def allowed_match(path):
        return any(path == a or (a.endswith("<id>") and path.startswith(a[:-4]) and
                                 len(path) > len(a) - 4) for a in allowed)

    for route in allowed:
        if route == "/metrics":  # mounted beside the route table
            assert http("GET", env.fleet.url + route)[0] == 200
            continue
        concrete = route.replace("<id>", "{")
        assert any(p == route or (route.endswith("<id>") and p.startswith(concrete))
                   for p in table), f"{route} is forwarded but the engine has no such route"
    before = sidecar_counter(env, "forwarded_requests_total")
    refused = 0
    for path, methods in sorted(table.items()):
        concrete = re.sub(r"\{[^}]*\}", "x", path)
        if path in VERSIONED_ROUTES or path in SIDECAR_ROUTES or allowed_match(concrete):
            continue
        for method in methods:
            status, answer, _ = http(method, env.fleet.url + concrete,
                                     {} if method in ("POST", "PUT", "PATCH") else None)
            assert status == 403 and answer["error"]["type"] in REFUSED, (method, path, answer)
            refused += 1
    assert refused > 0
    assert sidecar_counter(env, "forwarded_requests_total") == before  # none reached it


def leave_inside(env, frozen, leaving):
    """The client of stream `leaving` leaves while the engine holds its
    generation (`frozen(env)`, a context), until the sidecar has seen it
    leave; then the engine runs again."""
    left = sidecar_counter(env, "client_disconnects_total")
    with frozen(env):
        leaving.close()
        wait_until(lambda: sidecar_counter(env, "client_disconnects_total") == left + 1, 30,
                   "the sidecar to see the client leave")


def engine_metric(env, family, match=""):
    """The sum of an engine /metrics family's samples whose line holds `match`."""
    _, text, _ = env.engine.http("GET", "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(family) and line[len(family)] in "{ " and match in line)


def restart_under_load(env, send, prompt, served_version):
    """kill -9 of the engine's process group while `send()` (a request
    through the sidecar: (status, body, tokens), the body's "start" and
    "end" its versions) runs in a loop, then the engine started again on
    its port. Returns the figures; asserts that no answer was mislabelled
    (made by other weights than its versions say), that the others were
    retryable 503s, and that the replica serves `served_version` again."""
    answers, stop = [], threading.Event()

    sent_at = []  # when each answer's request was sent, in monotonic seconds

    def load():
        while not stop.is_set():
            sent_at.append(time.monotonic())
            try:
                answers.append(send())
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                answers.append(("error", str(e), None))
            if answers[-1][0] != 200:
                time.sleep(0.2)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    wait_until(lambda: len(answers) >= 5, 60, "answers before the kill")
    env.engine.process.kill_group()
    env.engine.process.proc.wait()
    killed_at = time.monotonic()
    wait_until(lambda: not env.fleet.info().get("ready"), 30, "the replica to leave rotation")
    env.engine.process.close()
    env.engine.start()
    env.engine.wait_healthy()
    env.fleet.wait_serving(served_version, timeout=300)
    back_after = time.monotonic() - killed_at
    wait_until(lambda: answers[-1][0] == 200, 60, "answers again")
    stop.set()
    thread.join(60)

    served = [(i, b, t) for i, (s, b, t) in enumerate(answers) if s == 200]
    retryable = [b for s, b, _ in answers if s == 503]
    other = [(s, b) for s, b, _ in answers if s not in (200, 503)]
    mislabelled, straddled = [], 0
    for i, body, tokens in served:
        start, end = body["start"], body["end"]
        old, new = env.fleet.published[start], env.fleet.published[end]
        if start == end:
            honest = env.oracle.made_by(old, prompt, tokens)
        else:
            # Back in rotation at the boot version, the replica commits the
            # head in place while answers run: one that started on the old
            # weights and ended on the new says so, and must be explained
            # by one switch between them.
            straddled += 1
            honest = bool(env.oracle.switch_points(old, new, prompt, tokens))
        if not honest:
            gaps = {v: round(env.oracle.worst_gap(c, prompt, tokens), 3)
                    for v, c in env.fleet.published.items()}
            mislabelled.append(f"answer {i} sent {sent_at[i] - killed_at:+.1f} s from the kill, "
                               f"labelled {start}..{end}, tokens {tokens}, gap by version {gaps}")
    figures = (f"{len(answers)} answers, {len(served)} served ({straddled} across a commit), "
               f"{len(retryable)} retryable, {len(other)} other, {len(mislabelled)} mislabelled, "
               f"back in rotation {back_after:.0f} s after the kill")
    assert not mislabelled, "\n".join([figures, *mislabelled, env.fleet.sidecar.tail(80)])
    assert all(b.get("error", {}).get("retryable") for b in retryable), retryable[:3]
    assert not other, other[:3]
    assert env.fleet.sidecar.alive()
    return figures
