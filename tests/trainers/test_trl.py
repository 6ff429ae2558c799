"""TRL's GRPOTrainer driving Stitch (stitch.integrations.trl), run in TRL's
own environment (scripts/install-engines trl) by `make test-trainers`:

- against a fleet of reference engines through the gateway, with a replica
  killed while it serves the run's rollouts;
- against a real vLLM (its CPU build) behind a sidecar;
- with lag, where samples behind the trainer's weights are dropped from the
  loss and counted.

Each run is judged from the outside: the store's pointer and the replicas'
own reports, every sample's stamps against its constraint, and (on a sample
of answers) transformers' log-probabilities of the served tokens under the
weights of each version the store holds, rebuilt from the store: the answer
must match the version it is stamped with.
"""

import contextlib
import os
import random
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "examples"))
import trl_grpo  # noqa: E402
from local_fleet import get_json  # noqa: E402

import stitch  # noqa: E402

STITCH = os.environ.get("STITCH_BIN") or os.path.join(REPO, "build/src/stitch/cli/stitch")
VLLM_PYTHON = os.environ.get("STITCH_VLLM_PYTHON") or os.path.expanduser(
    "~/.cache/stitch/engines/vllm/bin/python")


class VersionWeights:
    """Every published version's complete weights, rebuilt from the store
    (the nearest FULL anchor or the base checkpoint, then the DELTAs), and
    transformers' model of each."""

    def __init__(self, store_uri, run_id, base, work, dtype):
        self.store = stitch.open_store(store_uri, run_id)
        self.base, self.work, self.dtype = base, work, dtype
        self._models = {}

    def directory(self, version):
        if version == 0:
            return self.base
        out = os.path.join(self.work, f"v{version}")
        if os.path.exists(out):
            return out
        deltas, anchor_version = [], version
        while anchor_version > 0:
            d = self.store.materialize(anchor_version)
            if stitch.verify(d)["kind"] == "FULL":
                break
            deltas.insert(0, d)
            anchor_version -= 1
        anchor = self.base if anchor_version == 0 else self.store.materialize(anchor_version)
        if deltas:
            stitch.apply_chain(anchor, deltas, out, run_id=self.store.run_id,
                               anchor_version=anchor_version)
        else:
            shutil.copytree(anchor, out)
        for name in os.listdir(self.base):
            if name.endswith(".json") and not name.startswith("model.safetensors"):
                shutil.copy(os.path.join(self.base, name), out)
        return out

    def model(self, version):
        if version not in self._models:
            import torch
            from transformers import AutoModelForCausalLM

            m = AutoModelForCausalLM.from_pretrained(self.directory(version),
                                                     dtype=getattr(torch, self.dtype))
            m.eval()
            self._models[version] = m
        return self._models[version]

    def gap(self, versions, sample):
        """The largest difference between the served tokens'
        log-probabilities and those the weights of each token's version
        (`versions`, one per completion token) give them. Where the version
        changes inside an answer, the new weights either took over the keys
        and values the old ones computed or recomputed them: the smaller
        difference of the two, run by run."""
        import torch

        prompt, completion = sample.prompt_ids, sample.completion_ids
        ids = prompt + completion
        served = torch.tensor(sample.logprobs)

        def differences(logits, first, end):
            logp = logits.float().log_softmax(-1)
            mine = logp.gather(1, torch.tensor(completion[first:end])[:, None])[:, 0]
            return float((mine - served[first:end]).abs().max())

        runs = [i for i in range(len(versions)) if i == 0 or versions[i] != versions[i - 1]]
        past, fed, worst = None, 0, 0.0
        for n, first in enumerate(runs):
            end = runs[n + 1] if n + 1 < len(runs) else len(versions)
            model = self.model(versions[first])
            # The inputs whose logits choose tokens [first, end).
            lo, hi = len(prompt) + first - 1, len(prompt) + end - 1
            with torch.no_grad():
                out = model(torch.tensor([ids[fed:hi]]), past_key_values=past, use_cache=True)
                kept = differences(out.logits[0][-(hi - lo):], first, end)
                whole = model(torch.tensor([ids[:hi]])).logits[0][lo:hi]
            past, fed = out.past_key_values, hi
            worst = max(worst, min(kept, differences(whole, first, end)))
        return worst


def token_versions(sample):
    """The version that generated each completion token: from the answer's
    spans ([first token, version] pairs) when it reports them, else its
    one version; a sample stamped across a commit without spans has no
    answer, and the judge refuses it."""
    n = len(sample.completion_ids)
    if isinstance(sample.spans, list) and sample.spans:
        out = []
        for i, (first, version) in enumerate(sample.spans):
            end = sample.spans[i + 1][0] if i + 1 < len(sample.spans) else n
            out += [version] * (end - first)
        assert len(out) == n and sample.spans[0][0] == 0, sample
        return out
    assert sample.version_start == sample.version_end, ("unknown spans", sample)
    return [sample.version_start] * n


def judge(out, steps, tolerance, judged=24, killed_step=None, learned=True):
    sg, fleet, summary = out["sg"], out["fleet"], out["summary"]

    # Every step published exactly one version, in order, and the pointer
    # names the last one.
    assert [r.version for r in sg.history] == list(range(1, steps + 1))
    pointer = stitch.open_store(fleet.store, fleet.run_id).read_pointer()
    assert pointer.run_id == fleet.run_id and pointer.version == steps

    # The fleet followed: every replica still alive serves the last version.
    live = [r for r in fleet.replicas if r.sidecar.alive()]
    assert live
    for r in live:
        r.wait_serving(steps)

    # Every sample TRL learned from satisfies its constraint; with lag 0 it
    # was generated on exactly the trainer's version.
    assert len(sg.samples) == summary["samples"] > 0
    for version, s, dropped in sg.samples:
        assert s.version_start <= s.version_end
        if sg.lag == 0:
            assert (s.version_start, s.version_end) == (version, version), (version, s)
            assert not dropped
        else:
            assert s.version_start >= version - sg.lag
            assert dropped == (version - s.version_start > sg.max_staleness)
        if isinstance(s.spans, list):
            assert all(s.version_start <= v <= s.version_end for _, v in s.spans)

    # transformers' judgement, on a sample of answers spread over the run:
    # each token matches the weights of the version that generated it, and the
    # judgement tells versions apart.
    weights = VersionWeights(fleet.store, fleet.run_id, fleet.base,
                             os.path.join(out["dir"], "judge"), sg_dtype(fleet))
    rng = random.Random(0)
    pool = [s for _, s, _ in sg.samples if s.completion_ids]
    distinct = 0
    for s in rng.sample(pool, min(judged, len(pool))):
        # A sample generated across a commit is judged token by token,
        # each under the version its spans name.
        stamped = token_versions(s)
        assert weights.gap(stamped, s) <= tolerance, (stamped, s)
        others = [[v + shift for v in stamped] for shift in (-1, 1)]
        others = [o for o in others if all(0 <= v <= steps for v in o)]
        if others and all(weights.gap(o, s) > tolerance for o in others):
            distinct += 1
    assert distinct >= min(judged, len(pool)) // 2, "the oracle cannot tell versions apart"

    # The reward improved.
    if learned:
        assert summary["reward_last"] > summary["reward_first"] + 0.05, summary

    if killed_step is not None:
        assert out["killed"] == [killed_step]
        status, metrics = get_json_text(fleet.gateway + "/metrics")
        retried = sum(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("stitch_gateway_retried_total"))
        assert retried + summary["retries"] > 0, "the kill cost no retry: was r0 serving?"


def sg_dtype(fleet):
    return "float32" if fleet.engine == "reference" else "bfloat16"


def get_json_text(url):
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as r:
        return r.status, r.read().decode()


@contextlib.contextmanager
def trained(tmp_path, steps, *flags):
    """examples/trl_grpo.py run for `steps` steps with `flags`, every sample
    recorded; its fleet is stopped on leaving."""
    out = trl_grpo.run(["--stitch", STITCH, "--dir", str(tmp_path), "--steps", str(steps),
                        "--record-samples", *flags], keep_fleet=True)
    try:
        yield out
    finally:
        out["fleet"].close()


def test_grpo_learns_from_reference_fleet_through_gateway_and_survives_a_kill(tmp_path):
    steps = 12
    with trained(tmp_path, steps, "--replicas", "3", "--kill-at", "6") as out:
        # float32 on both sides: the engine's log-probabilities are
        # transformers' to rounding.
        judge(out, steps, tolerance=2e-3, killed_step=6)


def test_lag_drops_samples_behind_the_trainer_from_the_loss_and_counts_them(tmp_path):
    steps = 8
    with trained(tmp_path, steps, "--lag", "1", "--max-staleness", "0") as out:
        sg = out["sg"]
        # Mostly stale samples, dropped: nothing to learn from, so the
        # reward is not judged here.
        judge(out, steps, tolerance=2e-3, learned=False)
        stale = [s for v, s, dropped in sg.samples if dropped]
        assert stale, "with lag 1 no sample came from the version before the trainer's"
        assert sg.counters["dropped_stale"] == len(stale)
        assert sum(r.dropped_stale for r in sg.history) == len(stale)
        # TRL masked them: the completion length it logs counts only the
        # tokens its loss sees (env_mask), step by step.
        logged = {e["step"]: e["completions/mean_length"]
                  for e in out["trainer"].state.log_history if "completions/mean_length" in e}
        for step in range(1, steps + 1):
            rollout = [(s, d) for v, s, d in sg.samples if v == step - 1]
            kept = sum(0 if d else len(s.completion_ids) for s, d in rollout) / len(rollout)
            assert logged[step] == pytest.approx(kept), (step, logged[step], kept)


def test_lag_keeps_samples_within_max_staleness_and_learns(tmp_path):
    steps = 12
    with trained(tmp_path, steps, "--lag", "1", "--max-staleness", "1") as out:
        sg = out["sg"]
        judge(out, steps, tolerance=2e-3)
        assert sg.counters["dropped_stale"] == 0
        assert any(v - s.version_start == 1 for v, s, _ in sg.samples), \
            "with lag 1 no sample came from the version before the trainer's"


def test_grpo_learns_from_real_vllm_behind_a_sidecar(tmp_path):
    steps = 10
    with trained(tmp_path, steps, "--engine", "vllm", "--vllm-python", VLLM_PYTHON,
                 "--replicas", "1") as out:
        # bf16 weights on both sides, computed by different kernels.
        judge(out, steps, tolerance=0.15)
        info = get_json(out["fleet"].replicas[0].url + "/server_info")[1]
        assert info["applied_version"] == steps
