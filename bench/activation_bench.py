"""The activation pause of a real engine (vLLM or stock SGLang): a full
reload against an in-place patch of the values that changed, with the floor
measured in the same run.

Run with the Python of the engine's environment that scripts/install-engines
makes (`make bench-activation ENGINE=vllm|sglang` does):

    <engines dir>/vllm/bin/python bench/activation_bench.py --stitch build/src/stitch/cli/stitch
    <engines dir>/sglang/bin/python bench/activation_bench.py --engine sglang --stitch ...

For each model size (random-weight Llamas written by `stitch engine
init-model`, bf16) one engine starts with Stitch's patch code (vLLM with the
worker extension python/src/stitch_vllm, SGLang with the custom weight
loader python/src/stitch_sglang). For each share of values changed, a
version is made from the boot weights (that share of every tensor's values
nudged in the low mantissa bits), encoded as a DELTA, materialized, and
turned into a weight patch (`stitch delta patch`). Then, each repeated and
the median taken:

  reload   the engine's pause, its reload of the materialized checkpoint
           (vLLM: /pause?mode=keep, /collective_rpc reload_weights; SGLang:
           /pause_generation in_place, /update_weights_from_disk), the label
           (/update_weight_version) and the resume: a commit without patches;
  patch    the same pause around the patch (vLLM: /collective_rpc
           stitch_patch_apply, after stitch_patch_stage outside the pause;
           SGLang: /begin_weight_update, /update_weights_from_tensor naming
           the loader, /end_weight_update, the loader reading the patch
           inside the pause), with verify=checksums (every patched tensor
           hashed in the engine, the default) and verify=values;
  native   vLLM only: the same pause around vLLM 0.32's own sparse patches
           (load_checkpoint_weight_patches, through the bench-only extension
           bench/vllm_native_patch.py) of the same changed values, read
           outside the pause; checked afterwards to have written them;
  floor    in this process, the same changed values XORed into tensors of the
           model's shapes in memory (torch index ops, no engine, no HTTP).

The pause is timed from the pause request to the resume's answer. "Reading
the patch" is vLLM's staging (outside the pause) or SGLang's loader reading
and checking the patch (inside it). Between measurements the engine reloads
the boot weights (not timed).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "engines"))
import harness  # noqa: E402
from harness import http  # noqa: E402


def run(*cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr}")
    return r.stdout


def nudged_copy(base, path, fraction, seed):
    """`base` with `fraction` of each tensor's values changed (all of them at
    1.0) in their low mantissa bits, as a training step nudges weights."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def nudge(_, tensor):
        bits = tensor.view(torch.int16).view(-1)
        if fraction >= 1:
            bits ^= 1
            return
        picked = torch.randint(0, bits.numel(), (max(1, int(bits.numel() * fraction)),),
                               generator=gen)
        bits[picked] ^= torch.randint(1, 128, (picked.numel(),), generator=gen, dtype=torch.int16)
    return harness.rewrite_tensors(base, path, nudge)


class Engine:
    """One engine serving `model`; `pause_around(action, label)` times the
    paused moment of a commit: from the pause request to the answer that
    the engine runs again, `action()` and the label inside it."""

    name = "engine"

    def __init__(self, command, env, work):
        self.port = harness.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = harness.Process(command(self.port),
                                       os.path.join(work, f"{self.name}-{self.port}.log"), env=env)

        def healthy():
            if not self.process.alive():
                raise SystemExit(f"{self.name} exited:\n{self.process.tail()}")
            try:
                return http("GET", self.url + "/health", timeout=10)[0] == 200
            except OSError:
                return False
        harness.wait_until(healthy, 1800, f"{self.name}'s /health", every=1)

    def post(self, path, body=None, timeout=1800):
        status, answer, _ = http("POST", self.url + path, body, timeout=timeout)
        if status != 200:
            raise SystemExit(f"POST {path}: {status} {answer}")
        return answer

    def close(self):
        self.process.close()


class Vllm(Engine):
    """vLLM with Stitch's worker extension (python/src/stitch_vllm)."""

    name = "vllm"

    def __init__(self, model, work):
        super().__init__(lambda port: [
            sys.executable, os.path.join(REPO, "scripts", "vllm_serve.py"), "serve", model,
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "policy",
            "--dtype", "bfloat16", "--max-model-len", "256", "--enforce-eager",
            "--max-num-seqs", "4", "--worker-extension-cls",
            "vllm_native_patch.NativePatchBenchExtension"],
            {"PYTHONPATH": os.pathsep.join([harness.PATCH_EXTENSION_PATH, HERE])}, work)
        cpus = self.rpc("worker_cpus")["results"][0]
        print(f"vLLM's worker may run on cores {cpus['cpus']} with {cpus['threads']} torch "
              f"thread(s)", flush=True)

    def rpc(self, method, **kwargs):
        return self.post("/collective_rpc", {"method": method, "kwargs": kwargs})

    def pause_around(self, action, label):
        start = time.perf_counter()
        self.post("/pause?mode=keep")
        answer = action()
        self.post("/update_weight_version", {"new_version": label})
        self.post("/resume")
        return time.perf_counter() - start, answer

    def load(self, path):
        self.rpc("reload_weights", weights_path=path)

    def patch(self, patch, verify, label):
        """(pause seconds, staging seconds outside the pause, the engine's
        apply seconds, its threads)."""
        staged = self.post("/collective_rpc", {"method": "stitch_patch_stage", "args": [patch]})
        s, answer = self.pause_around(lambda: self.rpc("stitch_patch_apply", verify=verify), label)
        result = answer["results"][0]
        if not result["applied"]:
            raise SystemExit(f"the patch failed: {answer}")
        staged = staged["results"][0]
        return s, staged["seconds"], result["seconds"], staged["threads"]

    def native(self, patch, label):
        """vLLM's own sparse patches of the same values: (pause seconds, its
        load's seconds)."""
        self.rpc("native_patch_stage", path=patch)
        s, answer = self.pause_around(lambda: self.rpc("native_patch_apply"), label)
        check = self.rpc("native_patch_check", path=patch)["results"][0]
        if check["wrong_tensors"]:
            raise SystemExit(f"vLLM's own patch left old values in {check['wrong_tensors']}")
        return s, answer["results"][0]["seconds"]


class Sglang(Engine):
    """Stock SGLang with Stitch's custom weight loader (python/src/stitch_sglang)."""

    name = "sglang"

    def __init__(self, model, work):
        super().__init__(lambda port: [
            "bash", os.path.join(REPO, "tests", "engines", "sglang_serve.sh"), model, str(port),
            "--served-model-name", "policy", "--custom-weight-loader",
            harness.SGLANG_PATCH_LOADER,
            # Room for the larger model's weights besides the KV cache.
            "--mem-fraction-static", "0.3"], {"PYTHONPATH": harness.PATCH_EXTENSION_PATH}, work)

    def pause_around(self, action, label):
        start = time.perf_counter()
        self.post("/pause_generation", {"mode": "in_place"})
        answer = action()
        self.post("/update_weight_version", {"new_version": label, "abort_all_requests": False})
        self.post("/continue_generation", {})
        return time.perf_counter() - start, answer

    def load(self, path):
        self.post("/update_weights_from_disk", {"model_path": path, "flush_cache": False})

    def patch(self, patch, verify, label):
        """As Vllm.patch; nothing is staged outside the pause (SGLang has no
        way in while it serves), so the staging time is the loader's reading
        of the patch inside it."""
        import json

        answer_file = patch + ".answer.json"
        request = {"patch": patch, "answer": answer_file, "verify": verify,
                   "from": "bench/weight_v000000", "to": "bench/weight_v000001"}

        def apply():
            self.post("/begin_weight_update", {})
            self.post("/update_weights_from_tensor", {
                "serialized_named_tensors": [harness.sglang_named_bytes(
                    "stitch_sglang.request", json.dumps(request).encode())],
                "load_format": harness.SGLANG_PATCH_LOADER, "flush_cache": False})
            self.post("/end_weight_update", {})
            with open(answer_file) as f:
                return json.load(f)
        s, answer = self.pause_around(apply, label)
        os.remove(answer_file)
        if not answer["applied"]:
            raise SystemExit(f"the patch failed: {answer}")
        return s, answer["read_seconds"], answer["seconds"], None


ENGINES = {"vllm": Vllm, "sglang": Sglang}


def floor_seconds(patch_path, reps, threads=None):
    """The same changed values XORed into in-memory tensors of the model's
    shapes: the least any in-place apply can take (on `threads` torch
    threads; by default torch's own choice, every core)."""
    import json

    import torch

    if threads is not None:
        default = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return floor_seconds(patch_path, reps)
        finally:
            torch.set_num_threads(default)
    from safetensors import safe_open

    with safe_open(patch_path, framework="pt") as f:
        meta = json.loads(f.metadata()["stitch_patch"])
        parts = []
        for name, info in sorted(meta["tensors"].items()):
            numel = 1
            for d in info["shape"]:
                numel *= d
            parts.append((torch.zeros(numel, dtype=torch.int16),
                          f.get_tensor(name + "::idx"), f.get_tensor(name + "::xor")))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for flat, idx, xor in parts:
            flat.put_(idx, torch.take(flat, idx) ^ xor)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_size(args, hidden, layers, work):
    base = os.path.join(work, "base")
    run(args.stitch, "engine", "init-model", base, "--hidden", str(hidden), "--layers",
        str(layers), "--heads", str(hidden // 32), "--dtype", "bfloat16", "--seed", "1")
    model_bytes = sum(os.path.getsize(os.path.join(base, n)) for n in os.listdir(base)
                      if n.endswith(".safetensors"))
    print(f"\nmodel hidden {hidden}, {layers} layers: {model_bytes / 2**30:.2f} GiB of bf16 "
          f"weights; starting {args.engine}", flush=True)
    engine = ENGINES[args.engine](base, work)
    rows = []
    try:
        for fraction in args.fractions:
            tag = f"{fraction:g}"
            target = nudged_copy(base, os.path.join(work, f"target-{tag}"), fraction, 7)
            delta = os.path.join(work, f"delta-{tag}")
            local = os.path.join(work, f"local-{tag}")
            patch = os.path.join(work, f"patch-{tag}.safetensors")
            run(args.stitch, "delta", "encode", "--base", base, "--target", target, "--out", delta,
                "--version", "1", "--base-version", "0", "--run-id", "bench")
            run(args.stitch, "delta", "apply", "--anchor", base, "--anchor-version", "0",
                "--run-id", "bench", "--out", local, delta)
            shutil.rmtree(target)
            dense = fraction > args.max_patch_fraction
            if not dense:
                out = run(args.stitch, "delta", "patch", "--target", local, "--out", patch,
                          "--from", "0", "--max-density", "1", delta)
                changed = int(out.split(": ", 1)[1].split(" of ")[0])
            reload_s, patch_s, values_s, stage_s, apply_s = [], [], [], [], []
            native_s, native_apply_s = [], []
            label = "bench/weight_v000001"
            for _ in range(args.reps):
                s, _ = engine.pause_around(lambda: engine.load(local), label)
                reload_s.append(s)
                engine.load(base)
                if dense:
                    continue
                for verify, into in (("checksums", patch_s), ("values", values_s)):
                    s, staged, applied, threads = engine.patch(patch, verify, label)
                    into.append(s)
                    stage_s.append(staged)
                    if verify == "values":
                        apply_s.append(applied)
                    engine.load(base)
                if hasattr(engine, "native"):
                    s, applied = engine.native(patch, label)
                    native_s.append(s)
                    native_apply_s.append(applied)
                    engine.load(base)
            row = {"size": f"{hidden}x{layers}", "gib": model_bytes / 2**30, "fraction": fraction,
                   "reload": statistics.median(reload_s)}
            if not dense:
                row.update(changed=changed, patch=statistics.median(patch_s),
                           values=statistics.median(values_s),
                           stage=statistics.median(stage_s), apply=statistics.median(apply_s),
                           threads=threads, patch_file=patch)
                if native_s:
                    row.update(native=statistics.median(native_s),
                               native_apply=statistics.median(native_apply_s))
            rows.append(row)
            shutil.rmtree(delta)
            shutil.rmtree(local)
    finally:
        engine.close()
    # The floors once the engine is gone (a live engine's threads compete
    # for the same cores).
    for row in rows:
        if "patch" in row:
            row["floor"] = floor_seconds(row["patch_file"], max(args.reps, 3))
            if row["threads"]:
                row["floor_threads"] = floor_seconds(row["patch_file"], max(args.reps, 3),
                                                     row["threads"])
            os.remove(row.pop("patch_file"))
        print_row(row, flush=True)
    return rows


HEADER = ("| model | changed | values changed | reload pause | patch pause (checksums) | "
          "patch pause (values) | of which the engine's apply | reading the patch | floor | "
          "checksums / reload | "
          "checksums / floor | values / reload | values / floor |")


def print_row(row, flush=False):
    model = f"{row['size']} ({row['gib']:.2f} GiB)"
    if "patch" not in row:
        print(f"| {model} | {row['fraction'] * 100:g}% | all | {row['reload'] * 1e3:.0f} ms | "
              "dense: reloads | | | | | | | | |", flush=flush)
        return
    threads = f" ({row['threads']} threads)" if row["threads"] else ""
    print(f"| {model} | {row['fraction'] * 100:g}% | {row['changed']} | "
          f"{row['reload'] * 1e3:.0f} ms | {row['patch'] * 1e3:.1f} ms | "
          f"{row['values'] * 1e3:.1f} ms | {row['apply'] * 1e3:.1f} ms{threads} | "
          f"{row['stage'] * 1e3:.1f} ms | "
          f"{row['floor'] * 1e3:.1f} ms | "
          f"{row['patch'] / row['reload']:.3f} | {row['patch'] / row['floor']:.2f} | "
          f"{row['values'] / row['reload']:.3f} | {row['values'] / row['floor']:.2f} |",
          flush=flush)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stitch", required=True, help="the stitch binary")
    p.add_argument("--engine", choices=sorted(ENGINES), default="vllm",
                   help="the engine (run this script with that engine's Python)")
    p.add_argument("--sizes", default="1024x16,2048x16",
                   help="models as HIDDENxLAYERS, comma-separated")
    p.add_argument("--fractions", default="0.001,0.01,0.1,1",
                   type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--max-patch-fraction", type=float, default=0.3,
                   help="shares above this take the reload only (as the sidecar does)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--work", help="scratch directory (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="stitch-activation-")
    rows = []
    try:
        print(f"engine: {args.engine}")
        print(HEADER)
        print("|" + " --- |" * HEADER.count(" |"))
        for size in args.sizes.split(","):
            hidden, layers = (int(x) for x in size.split("x"))
            d = os.path.join(work, size)
            os.makedirs(d)
            rows += measure_size(args, hidden, layers, d)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + HEADER)
    print("|" + " --- |" * HEADER.count(" |"))
    for row in rows:
        print_row(row)
    native = [r for r in rows if "native" in r]
    if native:
        print("\nvLLM's own sparse patches (load_checkpoint_weight_patches) against Stitch's "
              "extension (values), the same patch in the same pause; the floor also on the "
              "worker's torch threads:\n")
        print("| model | changed | pause, vLLM's own | of which its load | pause, Stitch's | "
              "of which the apply | vLLM's own / Stitch's | vLLM's own / reload | "
              "floor on the worker's threads | Stitch's apply / that floor |")
        print("|" + " --- |" * 10)
        for r in native:
            print(f"| {r['size']} ({r['gib']:.2f} GiB) | {r['fraction'] * 100:g}% | "
                  f"{r['native'] * 1e3:.1f} ms | {r['native_apply'] * 1e3:.1f} ms | "
                  f"{r['values'] * 1e3:.1f} ms | {r['apply'] * 1e3:.1f} ms | "
                  f"{r['native'] / r['values']:.2f} | {r['native'] / r['reload']:.2f} | "
                  f"{r['floor_threads'] * 1e3:.1f} ms ({r['threads']}) | "
                  f"{r['apply'] / r['floor_threads']:.2f} |")
    per_value = [(r["size"], r["fraction"], r["values"] / r["changed"] * 1e9)
                 for r in rows if "patch" in r]
    print("\npatch pause (values) per changed value: " + ", ".join(
        f"{s} at {f * 100:g}%: {ns:.0f} ns" for s, f, ns in per_value))


if __name__ == "__main__":
    main()
