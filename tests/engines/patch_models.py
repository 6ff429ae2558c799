"""What the in-place patch tests of both engines share (test_vllm_extension.py,
test_sglang_loader.py): a Llama-shaped checkpoint, a version of it with some
values nudged, the patch between them as `stitch delta patch` writes it, and
a stand-in model holding the weights as an engine lays them out."""

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import harness

HIDDEN, KV, INTER, VOCAB, PADDED = 32, 16, 48, 40, 64


def checkpoint(path, seed):
    """A Llama-shaped checkpoint (one layer), bf16, as a lone model.safetensors."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)
    tensors = {
        "model.embed_tokens.weight": rand(VOCAB, HIDDEN),
        "model.layers.0.self_attn.q_proj.weight": rand(HIDDEN, HIDDEN),
        "model.layers.0.self_attn.k_proj.weight": rand(KV, HIDDEN),
        "model.layers.0.self_attn.v_proj.weight": rand(KV, HIDDEN),
        "model.layers.0.mlp.gate_proj.weight": rand(INTER, HIDDEN),
        "model.layers.0.mlp.up_proj.weight": rand(INTER, HIDDEN),
        "model.layers.0.mlp.down_proj.weight": rand(HIDDEN, INTER),
        "model.layers.0.input_layernorm.weight": rand(HIDDEN),
    }
    os.makedirs(path)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return tensors


def nudged(tensors, fraction, seed):
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in tensors.items():
        bits = t.clone().view(torch.int16).view(-1)
        picked = torch.randperm(bits.numel(), generator=gen)[:max(1, int(bits.numel() * fraction))]
        bits[picked] ^= torch.randint(1, 128, (picked.numel(),), generator=gen, dtype=torch.int16)
        out[name] = bits.view(torch.bfloat16).view(t.shape)
    return out


def layout(ckpt, inter=INTER):
    """The checkpoint's tensors as an engine holds them: q/k/v rows fused in
    `qkv_proj`, gate/up rows in `gate_up_proj`, the vocabulary padded, and
    the MLP's width padded to `inter` (SGLang's CPU path pads it) with zeros
    after each part."""
    pre = "model.layers.0."
    embed = torch.zeros(PADDED, HIDDEN, dtype=torch.bfloat16)
    embed[:VOCAB] = ckpt["model.embed_tokens.weight"]
    gate_up = torch.zeros(2 * inter, HIDDEN, dtype=torch.bfloat16)
    gate_up[:INTER] = ckpt[pre + "mlp.gate_proj.weight"]
    gate_up[inter:inter + INTER] = ckpt[pre + "mlp.up_proj.weight"]
    down = torch.zeros(HIDDEN, inter, dtype=torch.bfloat16)
    down[:, :INTER] = ckpt[pre + "mlp.down_proj.weight"]
    return {
        "model.embed_tokens.weight": embed,
        pre + "self_attn.qkv_proj.weight": torch.cat(
            [ckpt[pre + f"self_attn.{p}_proj.weight"] for p in "qkv"]),
        pre + "mlp.gate_up_proj.weight": gate_up,
        pre + "mlp.down_proj.weight": down,
        pre + "input_layernorm.weight": ckpt[pre + "input_layernorm.weight"].clone(),
    }


class Model(torch.nn.Module):
    """A stand-in engine model holding `layout(ckpt, inter)`. The engine names
    the fusion its own way: vLLM's `packed_modules_mapping` or SGLang's
    `stacked_params_mapping`."""

    def __init__(self, ckpt, engine="vllm", inter=INTER):
        super().__init__()
        self.inter = inter
        if engine == "vllm":
            self.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                           "gate_up_proj": ["gate_proj", "up_proj"]}
        else:
            self.stacked_params_mapping = [
                (".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
                (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
                (".gate_up_proj", ".up_proj", 1)]
        self.params = {name: torch.nn.Parameter(t.clone(), requires_grad=False)
                       for name, t in layout(ckpt, inter).items()}
        for i, p in enumerate(self.params.values()):
            self.register_parameter(f"p{i}", p)

    def named_parameters(self, *args, **kwargs):
        return iter(self.params.items())

    def holds(self, ckpt):
        """Whether the parameters are `ckpt`'s tensors, padding untouched."""
        want = layout(ckpt, self.inter)
        return (set(want) == set(self.params)
                and all(torch.equal(want[k], p.data) for k, p in self.params.items()))


@pytest.fixture
def versions(tmp_path):
    """v0 and v1 (5% of every tensor's values nudged), and the patch from v0 to v1."""
    v0 = checkpoint(str(tmp_path / "v0"), 1)
    v1 = nudged(v0, 0.05, 2)
    os.makedirs(tmp_path / "v1")
    save_file(v1, str(tmp_path / "v1" / "model.safetensors"), metadata={"format": "pt"})
    delta, local, patch = tmp_path / "delta", tmp_path / "local", tmp_path / "patch.safetensors"
    harness.stitch("delta", "encode", "--base", str(tmp_path / "v0"), "--target",
                   str(tmp_path / "v1"), "--out", str(delta), "--version", "1",
                   "--base-version", "0", "--run-id", "r")
    harness.stitch("delta", "apply", "--anchor", str(tmp_path / "v0"), "--anchor-version", "0",
                   "--run-id", "r", "--out", str(local), str(delta))
    harness.stitch("delta", "patch", "--target", str(local), "--out", str(patch), "--from", "0",
                   str(delta))
    return v0, v1, str(patch)


def with_wrong_checksum(patch, out, name):
    """A copy of `patch` at `out` whose recorded checksum of `name` is wrong."""
    with safe_open(patch, framework="pt") as f:
        meta = json.loads(f.metadata()["stitch_patch"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta["tensors"][name]["checksum"] = "0" * 32
    save_file(tensors, out, metadata={"stitch_patch": json.dumps(meta)})
    return out
