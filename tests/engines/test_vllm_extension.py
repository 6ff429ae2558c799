"""Stitch's vLLM worker extension (python/src/stitch_vllm) on a stand-in
worker: a torch model laid out as vLLM lays out a Llama (q/k/v rows fused in
`qkv_proj`, gate/up rows in `gate_up_proj`, the vocabulary padded), patched
with patches that `stitch delta patch` wrote. Runs in the vLLM environment,
without starting vLLM: what the real-engine suite (test_vllm.py) cannot
reach on purpose, a checksum that disagrees, a base that is not the
engine's, a failure at every step of an apply, what importing the extension
and looking it up do to vLLM.
"""

import json
import os
import subprocess
import sys
import types

import pytest
import torch

import harness
from patch_models import Model, versions, with_wrong_checksum  # noqa: F401: a fixture

sys.path.insert(0, harness.PATCH_EXTENSION_PATH)
import stitch_vllm  # noqa: E402


class Worker(stitch_vllm.WeightPatchExtension):
    def __init__(self, model):
        self.model_runner = types.SimpleNamespace(model=model)


class FaultyWorker(Worker, stitch_vllm.FaultInjectingExtension):
    """A worker with the extension the suites' vLLM is started with."""


def test_a_patch_brings_the_fused_parameters_to_the_new_version_exactly(versions):
    v0, v1, patch = versions
    model = Model(v0)
    worker = Worker(model)
    staged = worker.stitch_patch_stage(patch)
    assert staged["staged"] == "r/weight_v000001" and staged["tensors"] == len(v0)
    assert model.holds(v0), "staging changes nothing"
    answer = worker.stitch_patch_apply(verify="checksums")
    assert answer["applied"] is True, answer
    assert model.holds(v1)
    # Applied once: a second apply has nothing staged and changes nothing.
    assert worker.stitch_patch_apply()["applied"] is False
    assert model.holds(v1)


@pytest.mark.parametrize("after", [0, 2, 5])
def test_a_failure_part_way_is_undone(versions, after):
    v0, _, patch = versions
    model = Model(v0)
    worker = FaultyWorker(model)
    worker.stitch_patch_stage(patch)
    worker.stitch_patch_arm_fault(after)
    answer = worker.stitch_patch_apply()
    assert answer["applied"] is False and answer["undone"] is True, answer
    assert f"after {after} tensors" in answer["error"]
    assert model.holds(v0)


def test_a_checksum_that_disagrees_is_undone(versions, tmp_path):
    v0, _, patch = versions
    name = "model.layers.0.mlp.up_proj.weight"
    wrong = with_wrong_checksum(patch, str(tmp_path / "wrong.safetensors"), name)
    model = Model(v0)
    worker = Worker(model)
    worker.stitch_patch_stage(wrong)
    answer = worker.stitch_patch_apply(verify="checksums")
    assert answer["applied"] is False and answer["undone"] is True, answer
    assert name in answer["error"] and "xxh3-128" in answer["error"]
    assert model.holds(v0)
    # Without the hash, nothing checks the recorded checksum.
    worker.stitch_patch_stage(wrong)
    assert worker.stitch_patch_apply(verify="values")["applied"] is True


def test_weights_that_are_not_the_old_versions_are_refused(versions):
    v0, v1, patch = versions
    model = Model(v1)  # already the new version
    worker = Worker(model)
    with pytest.raises(stitch_vllm.PatchError, match="does not hold r/weight_v000000"):
        worker.stitch_patch_stage(patch)
    # Changed between staging and the pause: nothing is written.
    model = Model(v0)
    worker = Worker(model)
    worker.stitch_patch_stage(patch)
    qkv = model.params["model.layers.0.self_attn.qkv_proj.weight"]
    qkv.data.view(torch.int16).view(-1).add_(1)
    before = {k: p.detach().clone() for k, p in model.params.items()}
    answer = worker.stitch_patch_apply()
    assert answer["applied"] is False and answer["undone"] is True
    assert "changed since staging" in answer["error"]
    assert all(torch.equal(before[k], p) for k, p in model.params.items())


def test_a_tensor_the_engine_cannot_place_is_refused(versions):
    v0, _, patch = versions
    model = Model(v0)
    del model.params["model.layers.0.input_layernorm.weight"]
    with pytest.raises(stitch_vllm.PatchError, match="no parameter"):
        Worker(model).stitch_patch_stage(patch)
    not_a_patch = os.path.join(os.path.dirname(patch), "v0", "model.safetensors")
    with pytest.raises(stitch_vllm.PatchError, match="not a Stitch weight patch"):
        Worker(Model(v0)).stitch_patch_stage(not_a_patch)


def test_a_verify_that_is_neither_checksums_nor_values_is_refused_before_any_write(versions):
    v0, v1, patch = versions
    model = Model(v0)
    worker = Worker(model)
    worker.stitch_patch_stage(patch)
    for verify in ["checksum", "none", "", None]:
        with pytest.raises(ValueError, match="'checksums', 'values'"):
            worker.stitch_patch_apply(verify=verify)
        assert model.holds(v0)
    # Refused, not consumed: the staged patch still applies.
    answer = worker.stitch_patch_apply(verify="checksums")
    assert answer["applied"] is True and answer["verified"] == "checksums", answer
    assert model.holds(v1)


# Run in a fresh interpreter, as vLLM's worker starts: what importing the
# extension does to vLLM, then what vLLM's own look-up of the class named by
# --worker-extension-cls does (resolve_obj_by_qualname, as init_worker calls it).
IMPORT_THEN_LOOK_UP = """
import json, os, sys
environ = dict(os.environ)
import stitch_vllm
seen = {"imports_vllm": any(m == "vllm" or m.startswith("vllm.") for m in sys.modules),
        "changes_environ": dict(os.environ) != environ}
import vllm.model_executor.layers.utils as layer_utils
from vllm.platforms import current_platform
from vllm.utils.import_utils import resolve_obj_by_qualname
seen["cpu"] = current_platform.is_cpu()
seen["before"] = layer_utils.dispatch_cpu_unquantized_gemm.__module__
resolve_obj_by_qualname(sys.argv[1])
seen["after"] = layer_utils.dispatch_cpu_unquantized_gemm.__module__
print(json.dumps(seen))
"""


def test_importing_the_extension_changes_nothing_in_vllm_until_vllm_looks_it_up():
    env = {**os.environ, "PYTHONPATH": harness.PATCH_EXTENSION_PATH, "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run([sys.executable, "-c", IMPORT_THEN_LOOK_UP, harness.PATCH_EXTENSION],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["cpu"], "vLLM's CPU build is the one under test"
    assert not seen["imports_vllm"] and not seen["changes_environ"], seen
    assert seen["before"] == "vllm.model_executor.layers.utils", seen
    assert seen["after"] == "stitch_vllm", seen


def test_a_production_engines_collective_rpc_cannot_arm_a_fault(versions):
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.serial_utils import run_method

    v0, v1, patch = versions
    assert not hasattr(resolve_obj_by_qualname(harness.PATCH_EXTENSION), "stitch_patch_arm_fault")
    assert hasattr(resolve_obj_by_qualname(harness.FAULT_EXTENSION), "stitch_patch_arm_fault")
    model = Model(v0)
    worker = Worker(model)
    worker.stitch_patch_stage(patch)
    # What /collective_rpc does with a method's name.
    with pytest.raises(NotImplementedError, match="stitch_patch_arm_fault"):
        run_method(worker, "stitch_patch_arm_fault", (), {"after_tensors": 0})
    assert worker.stitch_patch_apply()["applied"] is True
    assert model.holds(v1)
