"""The chaos run's judge for the answers of a real engine (`stitch chaos
--engine vllm|sglang`, docs/chaos.md): Hugging Face transformers, not our
reference engine, says which versions' weights produced an answer.

The chaos run's versions differ only in the LM head (src/stitch/chaos/
oracle.h), so the hidden states of prompt plus answer are the same under
every version, whichever of them computed the keys and values: one forward
pass of the base checkpoint, then each version's LM head, tells for every
served token which versions' greedy choice it is (within LOGIT_TIE of the
best logit: bf16 kernels differ between an engine and transformers).

Run by `stitch chaos` with the engine's Python (which has torch and
transformers):

    python chaos_judge.py --model BASE_CHECKPOINT --heads DIR

It prints "ready" once the model is loaded, then answers one JSON line per
JSON line it reads:

    in:  {"prompt": [ids], "tokens": [ids], "length": N, "start": S, "end": E,
          "spans": [[offset, version], ...] (optional)}
    out: {"verdict": "same" | "crossed" | "mismatch", "versions": [...],
          "switch_at": [...], "matches": V or null, "spans": true | false | null}

Version v's LM head is DIR/lm_head.v<v>.bin: its bf16 values, row-major
[vocab, hidden], written by the run before it asks about v (versions
start - 8 to end + 8).
"""

import argparse
import json
import os
import sys

LOGIT_TIE = 0.05
# How far from the labels a mismatch looks for the version that made it.
DIAGNOSTIC_RANGE = 8


def explained_by(ok, start, end):
    """The fewest-switch non-decreasing sequence of versions in [start, end]
    such that every token is explained by its version: (versions, switch_at)
    or None. `ok[v][t]` says whether version v explains token t."""
    versions = list(range(start, end + 1))
    n = len(ok[start])
    if n == 0:
        return [start], []
    inf = float("inf")
    # cost[t][v]: fewest switches explaining tokens 0..t with t made by v;
    # prev[t][v]: the version that made token t - 1 then.
    cost = [{v: (0 if ok[v][0] else inf) for v in versions}]
    prev = [{}]
    for t in range(1, n):
        row, came = {}, {}
        for v in versions:
            best, by = inf, None
            if ok[v][t]:
                best, by = cost[t - 1][v], v
                for u in versions:
                    if u < v and cost[t - 1][u] + 1 < best:
                        best, by = cost[t - 1][u] + 1, u
            row[v], came[v] = best, by
        cost.append(row)
        prev.append(came)
    last = min(versions, key=lambda v: (cost[n - 1][v], v))
    if cost[n - 1][last] == inf:
        return None
    path = [last] * n
    for t in range(n - 1, 0, -1):
        path[t - 1] = prev[t][path[t]]
    runs, switch_at = [path[0]], []
    for i in range(1, n):
        if path[i] != path[i - 1]:
            runs.append(path[i])
            switch_at.append(i)
    return runs, switch_at


def judge(request, ok_for):
    """The verdict on one answer; `ok_for(versions)` gives each version's
    per-token explanation of it."""
    tokens, length = request["tokens"], request["length"]
    start, end = request["start"], request["end"]
    out = {"verdict": "mismatch", "versions": [], "switch_at": [], "matches": None,
           "spans": None}
    if len(tokens) != length or start < 0 or end < start:
        return out
    low = max(0, start - DIAGNOSTIC_RANGE)
    ok = ok_for(range(low, end + DIAGNOSTIC_RANGE + 1))
    if start == end and all(ok[start]):
        out.update(verdict="same", versions=[start])
    elif start < end:
        found = explained_by({v: ok[v] for v in range(start, end + 1)}, start, end)
        if found is not None:
            out.update(verdict="crossed", versions=found[0], switch_at=found[1])
    if out["verdict"] == "mismatch":
        out["matches"] = next((v for v in sorted(ok) if all(ok[v])), None)
    spans = request.get("spans")
    if spans is not None:
        out["spans"] = spans_explain(spans, ok, len(tokens))
    return out


def spans_explain(spans, ok, n):
    """Whether [offset, version] spans explain the answer: each names the
    version that produced the tokens from its offset to the next one's."""
    if n == 0:
        return not spans
    if not spans or spans[0][0] != 0:
        return False
    for i, (offset, version) in enumerate(spans):
        stop = spans[i + 1][0] if i + 1 < len(spans) else n
        if not 0 <= offset < stop <= n or version not in ok:
            return False
        if not all(ok[version][offset:stop]):
            return False
    return True


class Model:
    def __init__(self, checkpoint, heads):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
        self.model.eval()
        self.vocab = self.model.config.vocab_size
        self.hidden = self.model.config.hidden_size
        self.heads_dir = heads
        self.heads = {}

    def head(self, version):
        if version not in self.heads:
            path = os.path.join(self.heads_dir, f"lm_head.v{version}.bin")
            with open(path, "rb") as f:
                raw = bytearray(f.read())
            w = self.torch.frombuffer(raw, dtype=self.torch.bfloat16)
            self.heads[version] = w.view(self.vocab, self.hidden).clone()
        return self.heads[version]

    def ok_for(self, request):
        torch = self.torch
        prompt, tokens = request["prompt"], request["tokens"]

        def compute(versions):
            if not tokens:
                return {v: [] for v in versions}
            ids = prompt + tokens
            with torch.no_grad():
                h = self.model.model(torch.tensor([ids[:-1]])).last_hidden_state[0]
            h = h[len(prompt) - 1:]
            chosen = torch.tensor(tokens)
            ok = {}
            for v in versions:
                logits = torch.nn.functional.linear(h, self.head(v)).float()
                gap = logits.max(dim=-1).values - logits.gather(1, chosen[:, None])[:, 0]
                ok[v] = (gap <= LOGIT_TIE).tolist()
            return ok

        return compute


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--heads", required=True)
    args = parser.parse_args()
    model = Model(args.model, args.heads)
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            answer = judge(request, model.ok_for(request))
        except Exception as e:  # a bad request is answered, never fatal
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
