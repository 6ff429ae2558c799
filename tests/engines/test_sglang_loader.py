"""Stitch's SGLang custom weight loader (python/src/stitch_sglang) on a
stand-in model laid out as SGLang lays out a Llama (`stacked_params_mapping`
fusing q/k/v and gate/up), called as SGLang's scheduler calls a custom
loader: `loader(model, [(name, tensor)])`, the one tensor a uint8 request.
Runs in the SGLang environment without starting SGLang: what the
real-engine suite (test_sglang.py) cannot reach on purpose, a checksum that
disagrees, a patch that is not for these weights, a request that is not the
sidecar's.
"""

import json
import os
import sys

import pytest
import torch

import harness
from patch_models import Model, versions, with_wrong_checksum  # noqa: F401: a fixture

sys.path.insert(0, harness.PATCH_EXTENSION_PATH)
import stitch_sglang  # noqa: E402


def call(loader, model, request):
    """What SGLang does with /update_weights_from_tensor's one tensor."""
    data = torch.tensor(list(json.dumps(request).encode()), dtype=torch.uint8)
    loader(model, [(stitch_sglang.REQUEST_NAME, data)])


def patch(model, tmp_path, path, verify="checksums", source="r/weight_v000000",
          target="r/weight_v000001"):
    """Calls apply_patch and reads the answer it wrote."""
    answer = str(tmp_path / "answer.json")
    if os.path.exists(answer):
        os.remove(answer)
    call(stitch_sglang.apply_patch, model, {"patch": path, "answer": answer, "verify": verify,
                                            "from": source, "to": target})
    with open(answer) as f:
        return json.load(f)


def test_the_loader_patches_sglangs_fused_parameters_exactly(versions, tmp_path):
    v0, v1, path = versions
    model = Model(v0, engine="sglang")
    answer = patch(model, tmp_path, path)
    assert answer["applied"] is True and answer["to"] == "r/weight_v000001", answer
    assert answer["verified"] == "checksums" and answer["tensors"] == len(v0), answer
    assert model.holds(v1)
    # The same patch again finds the new values, not the old: refused, nothing written.
    answer = patch(model, tmp_path, path)
    assert answer["applied"] is False and "does not hold r/weight_v000000" in answer["error"]
    assert model.holds(v1)


def test_the_padded_mlp_of_sglangs_cpu_path_is_patched_and_its_padding_left_alone(
        versions, tmp_path):
    """On CPU, SGLang pads the MLP's width (here 48 to 64): gate and up each
    take half of `gate_up_proj`'s rows, `down_proj` has more columns than the
    checkpoint's tensor."""
    v0, v1, path = versions
    model = Model(v0, engine="sglang", inter=64)
    answer = patch(model, tmp_path, path)
    assert answer["applied"] is True, answer
    assert model.holds(v1)
    call(stitch_sglang.arm_fault, model, {"after_tensors": 4})
    failing = Model(v0, engine="sglang", inter=64)
    answer = patch(failing, tmp_path, path)
    assert answer["applied"] is False and "after 4 tensors" in answer["error"], answer
    assert failing.holds(v0)
    # Parts of unequal sizes cannot be told apart once padded: refused.
    odd = Model(v0, engine="sglang", inter=64)
    odd.params["model.layers.0.self_attn.qkv_proj.weight"] = torch.nn.Parameter(
        torch.zeros(80, 32, dtype=torch.bfloat16), requires_grad=False)
    answer = patch(odd, tmp_path, path)
    assert answer["applied"] is False and "cannot tell where" in answer["error"], answer


@pytest.mark.parametrize("after", [0, 3])
def test_a_failure_part_way_is_undone(versions, tmp_path, after):
    v0, _, path = versions
    model = Model(v0, engine="sglang")
    call(stitch_sglang.arm_fault, model, {"after_tensors": after})
    answer = patch(model, tmp_path, path)
    assert answer["applied"] is False and answer["undone"] is True, answer
    assert f"after {after} tensors" in answer["error"]
    assert model.holds(v0)
    # The fault was for one patch only.
    assert patch(model, tmp_path, path)["applied"] is True


def test_a_checksum_that_disagrees_is_undone(versions, tmp_path):
    v0, _, path = versions
    name = "model.layers.0.self_attn.k_proj.weight"
    wrong = with_wrong_checksum(path, str(tmp_path / "wrong.safetensors"), name)
    model = Model(v0, engine="sglang")
    answer = patch(model, tmp_path, wrong)
    assert answer["applied"] is False and answer["undone"] is True, answer
    assert name in answer["error"] and "xxh3-128" in answer["error"]
    assert model.holds(v0)
    # Without the hash, nothing checks the recorded checksum.
    assert patch(model, tmp_path, wrong, verify="values")["applied"] is True


def test_a_patch_that_is_not_the_one_asked_for_is_refused_before_any_write(versions, tmp_path):
    v0, _, path = versions
    model = Model(v0, engine="sglang")
    for asked in [{"source": "r/weight_v000001", "target": "r/weight_v000002"},
                  {"target": "other/weight_v000001"}, {"verify": "none"}, {"verify": None}]:
        answer = patch(model, tmp_path, path, **asked)
        assert answer["applied"] is False and answer["undone"] is True, (asked, answer)
        assert model.holds(v0), asked
    assert "goes from r/weight_v000000 to r/weight_v000001" in patch(
        model, tmp_path, path, target="r/weight_v000002")["error"]
    not_a_patch = os.path.join(os.path.dirname(path), "v0", "model.safetensors")
    assert "not a Stitch weight patch" in patch(model, tmp_path, not_a_patch)["error"]
    assert model.holds(v0)


def test_a_request_that_is_not_the_sidecars_changes_nothing_and_never_raises(versions):
    v0, v1, path = versions
    model = Model(v0, engine="sglang")
    # An exception here would end SGLang's scheduler: a wrong call is logged, not raised.
    stitch_sglang.apply_patch(model, [("model.embed_tokens.weight", torch.zeros(3))])
    stitch_sglang.apply_patch(model, [(stitch_sglang.REQUEST_NAME,
                                       torch.tensor(list(b"not json"), dtype=torch.uint8))])
    for request in [[1, 2], {"patch": path, "verify": "values"}]:
        call(stitch_sglang.apply_patch, model, request)
    assert model.holds(v0)
    # An answer that cannot be written is logged: the sidecar, finding none,
    # takes the weights as not known.
    call(stitch_sglang.apply_patch, model, {"patch": path, "answer": "/nonexistent/dir/answer",
                                            "verify": "values", "from": "r/weight_v000000",
                                            "to": "r/weight_v000001"})
    assert not os.path.exists("/nonexistent/dir/answer")
    assert model.holds(v1)


def test_sglang_finds_the_loaders_by_the_names_given_at_its_start():
    from sglang.srt.utils import dynamic_import

    assert dynamic_import("stitch_sglang.apply_patch") is stitch_sglang.apply_patch
    assert dynamic_import("stitch_sglang.arm_fault") is stitch_sglang.arm_fault
