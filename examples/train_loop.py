#!/usr/bin/env python3
"""A minimal asynchronous policy-gradient loop in PyTorch (CPU) that publishes
every step through stitch.DeltaEncoder to a local Stitch fleet.

The policy is the reference engine's model (a Llama decoder over a byte-level
tokenizer: token i < 256 is byte i, 256 is BOS, 257 EOS) and the task is the
demo's: continue a prompt with bytes from a target set (the reward is the
fraction of completion bytes in it). Each step:

  1. rollouts: prompts x group completions from the gateway, each request
     constrained to min_version = latest - lag (stitch.constrain_request) and
     kept on one replica per prompt group (session affinity);
  2. learning: group-relative advantages, a clipped policy-gradient step on
     the LM head (or every weight with --train all), samples further behind
     than --lag dropped;
  3. publishing: DeltaEncoder.encode reads the parameters in place (DLPack,
     no copy) and writes the next DELTA (a FULL anchor every --anchor-every),
     stitch.publish_version moves the pointer and wakes the pool.

Run it against the fleet `stitch demo --keep` leaves running:

    stitch demo --keep --dir /tmp/demo        # prints this command with the gateway's URL
    python examples/train_loop.py --store /tmp/demo/store --gateway http://127.0.0.1:PORT \\
        --pool file:/tmp/demo/replicas.txt --model /tmp/demo/base

It continues from the version the store's pointer names (rebuilding those
weights from the store with stitch.apply_chain). Only this module's training
part needs torch; the rest (rewards, requests, weight loading) imports without
it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import stitch

BOS, EOS = 256, 257
INDEX = "model.safetensors.index.json"


# --- the task ---------------------------------------------------------------

def encode_text(text: str) -> List[int]:
    """The byte tokenizer, BOS first (the engine's EncodeText with BOS)."""
    return [BOS, *text.encode("utf-8")]


def byte_set_reward(completion: Sequence[int], targets: bytes) -> float:
    """The fraction of completion tokens that are bytes of `targets`."""
    if not completion:
        return 0.0
    wanted = set(targets)
    return sum(1 for t in completion if t < 256 and t in wanted) / len(completion)


def group_advantages(rewards: Sequence[float], group: int) -> List[float]:
    """Each reward minus its group's mean, over the group's std + 1e-6."""
    out: List[float] = []
    for i in range(0, len(rewards), group):
        g = np.asarray(rewards[i:i + group], dtype=np.float64)
        out.extend(((g - g.mean()) / (g.std() + 1e-6)).tolist())
    return out


def random_prompt(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ") for _ in range(rng.randint(3, 8)))


# --- the fleet ----------------------------------------------------------------

def generate(gateway: str, prompt: List[int], latest: int, lag: int, session: str,
             max_new_tokens: int, seed: int, timeout: float = 60.0) -> Dict[str, Any]:
    """One rollout through the gateway, constrained to latest - lag or newer;
    returns completion ids, behaviour log-probs and the version it ran on."""
    payload = {"input_ids": prompt, "return_logprob": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0,
                                   "seed": seed}}
    payload, headers = stitch.constrain_request(payload, {"Content-Type": "application/json"},
                                                latest=latest, lag=lag, session_id=session,
                                                affinity_header="X-Session-Id")
    req = urllib.request.Request(gateway.rstrip("/") + "/generate",
                                 data=json.dumps(payload).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = json.loads(resp.read())
    lps = out["meta_info"].get("output_token_logprobs") or []
    return {"completion": [int(t[1]) for t in lps], "logprobs": [float(t[0]) for t in lps],
            "version": int(out["meta_info"].get("weight_version", latest))}


# --- weights --------------------------------------------------------------------

def read_checkpoint(directory: str) -> Dict[str, np.ndarray]:
    """name -> array of a safetensors checkpoint directory (bf16 as uint16
    bits, with ml_dtypes' bfloat16 dtype when installed)."""
    import safetensors.numpy  # noqa: PLC0415 - a test requirement, not the package's

    index_path = os.path.join(directory, INDEX)
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = [f for f in sorted(os.listdir(directory)) if f.endswith(".safetensors")]
    tensors: Dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(safetensors.numpy.load_file(os.path.join(directory, name)))
    return tensors


def current_weights(store: stitch.Store, model_dir: str, work: str) -> Tuple[int, str]:
    """(version, directory) of the complete weights of the version the
    pointer names: the boot model, a FULL version, or one rebuilt from the
    nearest anchor and the deltas after it (stitch.apply_chain)."""
    store.refresh()
    pointer = store.read_pointer()
    if pointer is None:
        raise SystemExit("train_loop: the store has no pointer; claim the run first (stitch demo does)")
    latest = pointer.version
    deltas: List[str] = []
    version = latest
    while version > 0:
        directory = store.materialize(version)
        if stitch.verify(directory)["kind"] == "FULL":
            break
        deltas.insert(0, directory)
        version -= 1
    anchor = model_dir if version == 0 else store.materialize(version)
    if not deltas:
        return latest, anchor
    out = os.path.join(work, f"current_v{latest:06d}")
    if not os.path.exists(out):
        stitch.apply_chain(anchor, deltas, out, run_id=store.run_id, anchor_version=version)
    return latest, out


# --- the model and the learning step (PyTorch) --------------------------------

def build_policy(config: Dict[str, Any], arrays: Dict[str, np.ndarray], train: str):
    """The reference engine's Llama as torch Parameters built from `arrays`
    (bf16 weights train in float32). Returns (params, forward)."""
    import torch  # noqa: PLC0415

    params: Dict[str, Any] = {}
    for name, a in arrays.items():
        if a.dtype.name == "bfloat16":
            t = torch.from_numpy(np.array(a.view(np.uint16))).view(torch.bfloat16).float()
        else:
            t = torch.from_numpy(np.array(a))  # one writable copy at load
        learn = train == "all" or name == "lm_head.weight"
        params[name] = torch.nn.Parameter(t, requires_grad=learn)
    c = config
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads", heads)
    hd, eps = hidden // heads, c.get("rms_norm_eps", 1e-5)
    inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    head = params.get("lm_head.weight", params["model.embed_tokens.weight"])

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x, cos, sin):  # Hugging Face's rotate_half convention
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def forward(ids: List[int]):
        """Logits [len(ids), vocab] of one sequence."""
        n = len(ids)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
        x = params["model.embed_tokens.weight"][torch.tensor(ids)]
        mask = torch.full((n, n), float("-inf")).triu(1)
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rms(x, params[p + "input_layernorm.weight"])
            q = (h @ params[p + "self_attn.q_proj.weight"].T).view(n, heads, hd)
            k = (h @ params[p + "self_attn.k_proj.weight"].T).view(n, kv_heads, hd)
            v = (h @ params[p + "self_attn.v_proj.weight"].T).view(n, kv_heads, hd)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            att = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5 + mask
            o = torch.einsum("hqk,khd->qhd", att.softmax(-1), v).reshape(n, hidden)
            x = x + o @ params[p + "self_attn.o_proj.weight"].T
            h = rms(x, params[p + "post_attention_layernorm.weight"])
            gate = torch.nn.functional.silu(h @ params[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ params[p + "mlp.up_proj.weight"].T)) @ params[p + "mlp.down_proj.weight"].T
        return rms(x, params["model.norm.weight"]) @ head.T

    return params, forward


def learn(params, forward, samples: List[Dict[str, Any]], lr: float, clip: float = 0.2) -> float:
    """One clipped policy-gradient step; returns the objective."""
    import torch  # noqa: PLC0415

    learnable = [p for p in params.values() if p.requires_grad]
    objective = torch.zeros(())
    tokens = sum(len(s["completion"]) for s in samples) or 1
    for s in samples:
        if not s["completion"] or s["weight"] == 0:
            continue
        ids = s["prompt"] + s["completion"]
        logits = forward(ids)[len(s["prompt"]) - 1:-1]
        logp = logits.log_softmax(-1).gather(1, torch.tensor(s["completion"])[:, None])[:, 0]
        ratio = (logp - torch.tensor(s["logprobs"])).exp()
        adv = s["advantage"]
        objective = objective + s["weight"] * torch.minimum(
            ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).sum() / tokens
    for p in learnable:
        p.grad = None
    objective.backward()
    with torch.no_grad():
        for p in learnable:
            if p.grad is not None:
                p.add_(p.grad, alpha=lr)  # ascent
    return float(objective)


def publishable(params, dtypes: Dict[str, str]) -> Dict[str, Any]:
    """What DeltaEncoder reads: the parameters themselves (float32, read in
    place through DLPack) or bf16 copies for a bf16 checkpoint."""
    import torch  # noqa: PLC0415

    return {n: (p.detach() if dtypes[n] != "bfloat16" else p.detach().to(torch.bfloat16))
            for n, p in params.items()}


# --- the loop ---------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="policy gradient on a Stitch fleet (PyTorch, CPU)")
    ap.add_argument("--store", required=True, help="the store the fleet follows")
    ap.add_argument("--run-id", default=None, help="default: the run the pointer names")
    ap.add_argument("--gateway", required=True, help="the gateway URL")
    ap.add_argument("--pool", default=None, help="pool to wake after each publish (file:PATH, ...)")
    ap.add_argument("--model", required=True, help="the boot checkpoint (config.json + safetensors)")
    ap.add_argument("--work", default=None, help="where version directories are written")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lag", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=4.0)
    ap.add_argument("--anchor-every", type=int, default=10)
    ap.add_argument("--targets", default="abcdefghijklmnopqrstuvwxyz ")
    ap.add_argument("--train", choices=["lm_head", "all"], default="lm_head")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    run_id = a.run_id
    if run_id is None:
        with open(os.path.join(a.store.removeprefix("file://"), "latest")) as f:
            run_id = stitch.VersionRef.parse(f.read().strip()).run_id
    store = stitch.open_store(a.store, run_id)
    work = a.work or os.path.join(os.path.dirname(os.path.abspath(a.store)), "train_loop")
    os.makedirs(work, exist_ok=True)
    version, weights_dir = current_weights(store, a.model, work)
    with open(os.path.join(a.model, "config.json")) as f:
        config = json.load(f)
    arrays = read_checkpoint(weights_dir)
    dtypes = {n: arr.dtype.name for n, arr in arrays.items()}
    params, forward = build_policy(config, arrays, a.train)
    encoder = stitch.DeltaEncoder(publishable(params, dtypes), version=version, run_id=run_id)
    print(f"train_loop: run {run_id} at version {version}; {sum(p.numel() for p in params.values())} "
          f"weights, training {a.train}")

    rng = random.Random(a.seed)
    targets = a.targets.encode()
    for step in range(a.steps):
        prompts = [encode_text(random_prompt(rng)) for _ in range(a.prompts)]
        samples = []
        for i, prompt in enumerate(prompts):
            for _ in range(a.group):
                r = generate(a.gateway, prompt, encoder.version, a.lag, f"{run_id}-{step}-{i}",
                             a.max_new_tokens, rng.randrange(1 << 31))
                r["prompt"] = prompt
                r["reward"] = byte_set_reward(r["completion"], targets)
                r["weight"] = 1.0 if encoder.version - r["version"] <= a.lag else 0.0
                samples.append(r)
        for s, adv in zip(samples, group_advantages([s["reward"] for s in samples], a.group)):
            s["advantage"] = adv
        objective = learn(params, forward, samples, a.lr)

        next_version = encoder.version + 1
        out_dir = os.path.join(work, stitch.VersionRef(run_id, next_version).dir_name)
        result = encoder.encode(publishable(params, dtypes), out_dir,
                                full=next_version % a.anchor_every == 0)
        ref = stitch.publish_version(store, result["dir"], run_id, a.pool)
        mean = sum(s["reward"] for s in samples) / len(samples)
        print(f"step {step + 1:3d}: reward {mean:.3f}, objective {objective:+.4f}, published {ref} "
              f"({result['payload_bytes'] if 'payload_bytes' in result else result['checkpoint_bytes']} bytes)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
