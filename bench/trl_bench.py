#!/usr/bin/env python3
"""What Stitch costs a TRL GRPO run on the tiny model, in ratios measured in
one run on one local fleet of reference engines (`make bench-trl`):

1. Stitch's time on the trainer's critical path (encode + publish + wake,
   and whatever of it the next step's rollouts do not overlap) against the
   time of a TRL step: with lag 0 (publish, then the fleet, before the next
   rollouts, all on the path) and with lag 1 (the publish runs beside the
   next rollouts; only what is left of it when the optimizer needs the
   weights again is on the path). Goal: <= 5% of a step.
2. The rollouts of a step sent through gateway and sidecar against the same
   calls made straight to the engines, alternated round by round. Goal:
   <= 1.25x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "examples"))
import trl_grpo  # noqa: E402
from local_fleet import LocalFleet, get_json  # noqa: E402


def trainer_share(stitch_bin: str, work: str, lag: int, steps: int) -> dict:
    out = trl_grpo.run(["--stitch", stitch_bin, "--dir", work, "--steps", str(steps),
                        "--lag", str(lag), "--max-staleness", str(lag)])
    h = out["sg"].history[2:]  # the first steps warm caches and connections
    # Medians: this machine is shared, and one slow step says nothing about
    # Stitch.
    med = statistics.median
    return {
        "lag": lag,
        "step_ms": 1e3 * med(b.ended_at - a.ended_at for a, b in zip(h, h[1:])),
        "encode_ms": 1e3 * med(r.encode_s for r in h),
        "publish_wake_ms": 1e3 * med(r.publish_s for r in h),
        "fleet_ms": 1e3 * med(r.fleet_s for r in h if r.fleet_s is not None),
        "blocked_ms": 1e3 * med(r.blocked_s for r in h),
    }


def rollout_round(client, urls, bodies, concurrency: int) -> float:
    def one(i):
        status, data, _ = client.request("POST", urls[i % len(urls)] + "/generate",
                                         json.dumps(bodies[i]).encode(),
                                         {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"{urls[i % len(urls)]}: {status} {data[:200]!r}")
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(bodies))))
    return time.monotonic() - started


def gateway_overhead(stitch_bin: str, work: str, rounds: int, requests: int,
                     concurrency: int, max_new_tokens: int) -> dict:
    from stitch.integrations.trl import _Http  # noqa: PLC0415

    base = trl_grpo.init_model(stitch_bin, os.path.join(work, "base"), "reference", 0)
    fleet = LocalFleet(os.path.join(work, "fleet"), stitch_bin, replicas=2).start(base, "bench")
    try:
        engines = [r.engine_url for r in fleet.replicas]
        prompts = trl_grpo.prompts(requests, 1)

        def body(i, pinned):
            b = {"input_ids": [256, *prompts[i].encode()], "return_logprob": True,
                 "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0,
                                     "seed": i}}
            if pinned:
                b["weight_version"] = {"exact_version": 0}
            return b
        direct_bodies = [body(i, False) for i in range(requests)]
        gateway_bodies = [body(i, True) for i in range(requests)]
        client = _Http(60.0)
        rollout_round(client, engines, direct_bodies, concurrency)  # warm-up
        rollout_round(client, [fleet.gateway], gateway_bodies, concurrency)
        direct, via = [], []
        for _ in range(rounds):
            direct.append(rollout_round(client, engines, direct_bodies, concurrency))
            via.append(rollout_round(client, [fleet.gateway], gateway_bodies, concurrency))
        assert get_json(fleet.gateway + "/health")[0] == 200
    finally:
        fleet.close()
    d, g = statistics.median(direct), statistics.median(via)
    return {"direct_ms": 1e3 * d, "gateway_ms": 1e3 * g, "ratio": g / d, "rounds": rounds,
            "requests": requests, "concurrency": concurrency}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stitch", default=os.path.join(REPO, "build/src/stitch/cli/stitch"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=16, help="rollouts a round (one TRL step)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stitch-trl-bench-")
    rows = [trainer_share(a.stitch, os.path.join(work, f"lag{lag}"), lag, a.steps)
            for lag in (0, 1)]
    overhead = gateway_overhead(a.stitch, os.path.join(work, "overhead"), a.rounds,
                                a.requests, a.concurrency, a.max_new_tokens)
    print("\n== Stitch on the trainer's critical path (TRL GRPO, tiny model, 2 reference replicas;"
          " medians over the steps)")
    print(f"{'lag':>4} {'step':>9} {'encode':>8} {'publish+wake':>13} {'fleet':>8} "
          f"{'on the path':>12} {'share':>7}")
    for r in rows:
        print(f"{r['lag']:>4} {r['step_ms']:>7.1f}ms {r['encode_ms']:>6.2f}ms "
              f"{r['publish_wake_ms']:>11.2f}ms {r['fleet_ms']:>6.1f}ms {r['blocked_ms']:>10.2f}ms "
              f"{r['blocked_ms'] / r['step_ms']:>7.1%}")
    print("   (lag 0: publish, wake and the wait for the fleet are all on the path; "
          "encode + publish + wake alone is "
          f"{(rows[0]['encode_ms'] + rows[0]['publish_wake_ms']) / rows[0]['step_ms']:.1%} of a step)")
    print("\n== Rollouts through gateway and sidecar against straight to the engines")
    print(f"   {overhead['requests']} requests, {overhead['concurrency']} at once, median of "
          f"{overhead['rounds']} alternated rounds: direct {overhead['direct_ms']:.1f} ms, "
          f"through Stitch {overhead['gateway_ms']:.1f} ms: {overhead['ratio']:.2f}x")
    print(json.dumps({"trainer": rows, "rollouts": overhead}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
