#!/usr/bin/env python3
"""Hugging Face TRL's GRPOTrainer learning from a Stitch fleet.

TRL trains the checkpoint `stitch engine init-model` writes (a small Llama
over a byte vocabulary, which transformers loads) on a toy task: continue a
prompt with lowercase letters and spaces (the reward is the share of the
completion's tokens that are). Every generation comes from the fleet through
the Stitch gateway (stitch.integrations.trl's rollout function) and every
optimizer step publishes the next version (its callback), which the fleet
applies before the next step's rollouts, pinned to it.

    python examples/trl_grpo.py --stitch build/src/stitch/cli/stitch
    python examples/trl_grpo.py --stitch ... --engine vllm --vllm-python ENV/bin/python

By default a local fleet of Stitch's reference engines (two replicas with
their sidecars and a gateway, on 127.0.0.1) is started in --dir; with
--engine vllm each replica is a real vLLM server (its CPU build). Each step
prints the reward, the version published, the versions the samples came
from, publish -> fleet time and how long the trainer waited on Stitch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from local_fleet import LocalFleet  # noqa: E402

# TRL warns that rollout_func is experimental; Stitch relies on it knowingly
# (its contract is checked against TRL 1.16 by tests/trainers/).
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TARGETS = frozenset(b"abcdefghijklmnopqrstuvwxyz ")
RUN_ID = "trl-grpo"


def target_reward(completion_ids: List[List[int]], **_: Any) -> List[float]:
    """The share of each completion's tokens that are target bytes (dense,
    so that a random model gets a gradient from its first step)."""
    return [sum(1 for t in ids if t in TARGETS) / len(ids) if ids else 0.0
            for ids in completion_ids]


def prompts(count: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8))) for _ in range(count)]


def init_model(stitch_bin: str, path: str, engine: str, seed: int) -> str:
    """The base checkpoint: float32 for the reference engine, bfloat16 with
    32-dimension heads (what vLLM's CPU attention needs) for vLLM."""
    hidden, dtype = ("64", "float32") if engine == "reference" else ("128", "bfloat16")
    subprocess.run([stitch_bin, "engine", "init-model", path, "--hidden", hidden, "--layers", "2",
                    "--heads", "4", "--max-positions", "256", "--dtype", dtype, "--seed",
                    str(seed)], check=True, stdout=subprocess.DEVNULL)
    return path


class StepPrinter:
    """Prints one line per step from the StitchGRPO's records."""

    def __init__(self, sg: Any, out=sys.stdout) -> None:
        self.sg, self.out, self.printed = sg, out, 0

    def print_ready(self, final: bool = False) -> None:
        for record in self.sg.history[self.printed:]:
            # With lag, a step's version is published while the next step
            # runs: its line waits for it.
            if (record.reward is None or not record.kind) and not final:
                break
            versions = " ".join(f"v{v}:{n}" for v, n in sorted(record.sample_versions.items()))
            fleet = "-" if record.fleet_s is None else f"{record.fleet_s * 1e3:.0f} ms"
            reward = "-" if record.reward is None else f"{record.reward:.3f}"
            print(f"step {record.step:3d}  reward {reward}  published v{record.version} "
                  f"{record.kind} {record.payload_bytes / 1024:.1f}KiB  samples {versions}"
                  f"{f' (dropped {record.dropped_stale} stale)' if record.dropped_stale else ''}"
                  f"  publish->fleet {fleet}  stitch {record.blocked_s * 1e3:.1f} ms"
                  f"  retries {record.retries}", file=self.out, flush=True)
            self.printed += 1


def build_trainer(sg: Any, model_dir: str, work: str, steps: int, seed: int, lr: float,
                  prompts_per_step: int, group: int, max_new_tokens: int, callbacks=()):
    import torch  # noqa: PLC0415
    from datasets import Dataset  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback  # noqa: PLC0415
    from trl import GRPOConfig, GRPOTrainer  # noqa: PLC0415

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = GRPOConfig(
        output_dir=os.path.join(work, "trl"), max_steps=steps, learning_rate=lr,
        per_device_train_batch_size=prompts_per_step * group, num_generations=group,
        gradient_accumulation_steps=1, max_completion_length=max_new_tokens, temperature=1.0,
        beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=seed,
        disable_tqdm=True, dataloader_num_workers=0, bf16=False,
        # Stale samples (lag > 0) keep the engines' log-probabilities, which
        # TRL's off-policy sequence mask compares with the trainer's own.
        off_policy_mask_threshold=0.5 if sg.max_staleness > 0 else None)
    dataset = Dataset.from_dict({"prompt": prompts(prompts_per_step * steps * 2, seed)})
    trainer = GRPOTrainer(model=model, args=config, train_dataset=dataset,
                          reward_funcs=[target_reward], processing_class=tokenizer,
                          rollout_func=sg.rollout_func, callbacks=[sg.callback, *callbacks])
    # One line a step is printed by StepPrinter instead of TRL's dict of logs.
    trainer.remove_callback(PrinterCallback)
    return trainer


def run(argv: Optional[Sequence[str]] = None, keep_fleet: bool = False) -> Dict[str, Any]:
    """Runs the example; returns what the tests judge (the StitchGRPO, the
    fleet, left running with keep_fleet, and the directory)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stitch", default=os.path.join(os.path.dirname(HERE),
                                                      "build/src/stitch/cli/stitch"))
    ap.add_argument("--engine", choices=["reference", "vllm"],
                    default=os.environ.get("STITCH_TRL_ENGINE", "reference"))
    ap.add_argument("--vllm-python", default=os.environ.get("STITCH_VLLM_PYTHON"))
    ap.add_argument("--dir", default=None, help="default: a fresh temporary directory")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lag", type=int, default=0, help="0: every rollout pinned to the "
                    "trainer's version; N: min_version = version - N")
    ap.add_argument("--max-staleness", type=int, default=0,
                    help="samples further behind the trainer are dropped from the loss")
    ap.add_argument("--anchor-every", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-at", type=int, default=0,
                    help="SIGKILL replica r0 (engine and sidecar) while it serves the rollouts "
                    "after this step (0: never)")
    ap.add_argument("--record-samples", action="store_true")
    a = ap.parse_args(argv)

    from transformers import TrainerCallback  # noqa: PLC0415

    from stitch.integrations.trl import StitchGRPO  # noqa: PLC0415

    work = a.dir or tempfile.mkdtemp(prefix="stitch-trl-")
    os.makedirs(work, exist_ok=True)
    model_dir = init_model(a.stitch, os.path.join(work, "base"), a.engine, a.seed)
    print(f"trl_grpo: starting {a.replicas} {a.engine} replicas in {work}", flush=True)
    started = time.monotonic()
    fleet = LocalFleet(os.path.join(work, "fleet"), a.stitch, replicas=a.replicas,
                       engine=a.engine, vllm_python=a.vllm_python).start(model_dir, RUN_ID)
    print(f"trl_grpo: fleet ready in {time.monotonic() - started:.1f} s, gateway "
          f"{fleet.gateway}", flush=True)
    sg = StitchGRPO(store=fleet.store, run_id=fleet.run_id, gateway=fleet.gateway,
                    pool=fleet.pool_spec, work_dir=os.path.join(work, "versions"),
                    checkpoint_dir=model_dir, api="sglang" if fleet.engine == "reference" else "vllm",
                    lag=a.lag, max_staleness=a.max_staleness, anchor_every=a.anchor_every,
                    seed=a.seed, record_samples=a.record_samples)
    printer = StepPrinter(sg)
    killed: List[int] = []

    class Events(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            printer.print_ready()

        def on_step_end(self, args, state, control, **kwargs):
            if a.kill_at and state.global_step == a.kill_at and not killed:
                killed.append(state.global_step)
                threading.Thread(target=kill_while_serving, args=(fleet, 0, state.global_step),
                                 daemon=True).start()

    trainer = build_trainer(sg, model_dir, work, a.steps, a.seed, a.lr, a.prompts, a.group,
                            a.max_new_tokens, callbacks=[Events()])
    started = time.monotonic()
    try:
        trainer.train()
    finally:
        sg.close()
        printer.print_ready(final=True)
        if not keep_fleet:
            fleet.close()
    elapsed = time.monotonic() - started
    summary = summarize(sg, elapsed)
    print(json.dumps(summary) if os.environ.get("STITCH_TRL_JSON") else format_summary(summary),
          flush=True)
    return {"sg": sg, "fleet": fleet, "dir": work, "summary": summary, "killed": killed,
            "trainer": trainer}


def kill_while_serving(fleet: LocalFleet, index: int, step: int, timeout: float = 60.0) -> None:
    """SIGKILL to a replica's engine and sidecar once it has requests of the
    next rollouts in flight (or after `timeout`). The engine is stopped
    (SIGSTOP) while its sidecar is asked, so that what the sidecar counts
    in flight is still in flight when the kill lands."""
    replica = fleet.replicas[index]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replica.engine.kill_group(signal.SIGSTOP)
        if replica.info().get("active_requests"):
            break
        replica.engine.kill_group(signal.SIGCONT)
        time.sleep(0.001)
    fleet.kill(index)
    print(f"trl_grpo: SIGKILL to replica {replica.name} while it served the rollouts after "
          f"step {step}; they carry on on the others", flush=True)


def summarize(sg: Any, elapsed: float) -> Dict[str, Any]:
    h = sg.history
    rewards = [r.reward for r in h if r.reward is not None]
    n = max(1, len(rewards) // 4)
    fleet = sorted(r.fleet_s for r in h if r.fleet_s is not None)
    blocked = [r.blocked_s for r in h]
    return {
        "steps": len(h), "seconds": elapsed, "step_s": elapsed / max(1, len(h)),
        "reward_first": statistics.mean(rewards[:n]) if rewards else None,
        "reward_last": statistics.mean(rewards[-n:]) if rewards else None,
        "published": [r.version for r in h],
        "fleet_p50_ms": 1e3 * fleet[len(fleet) // 2] if fleet else None,
        "fleet_max_ms": 1e3 * fleet[-1] if fleet else None,
        "stitch_blocked_ms_mean": 1e3 * statistics.mean(blocked) if blocked else None,
        "samples": sg.counters["samples"], "dropped_stale": sg.counters["dropped_stale"],
        "retries": sg.counters["retries"],
    }


def format_summary(s: Dict[str, Any]) -> str:
    def ms(v):
        return "-" if v is None else f"{v:.0f} ms"
    return "\n".join([
        f"reward         {s['reward_first']:.3f} -> {s['reward_last']:.3f} "
        "(mean of the first and last quarter of the steps)",
        f"versions       {len(s['published'])} published, v{s['published'][0]}..v{s['published'][-1]}"
        if s["published"] else "versions       none published",
        f"publish->fleet p50 {ms(s['fleet_p50_ms'])}, max {ms(s['fleet_max_ms'])}",
        f"stitch         {s['stitch_blocked_ms_mean']:.1f} ms a step on the trainer's path, "
        f"of {s['step_s'] * 1e3:.0f} ms a step",
        f"samples        {s['samples']} learned from, {s['dropped_stale']} dropped as stale, "
        f"{s['retries']} retries",
    ])


if __name__ == "__main__":
    run()
