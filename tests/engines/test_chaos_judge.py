"""The chaos run's transformers judge (chaos_judge.py), through the protocol
`stitch chaos` speaks to it: versions that differ only in the LM head, as in
a chaos run, and answers made here by transformers' own greedy decoding."""

import json
import os
import subprocess
import sys

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = harness.prompt_ids("Once upon a time")
LENGTH = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    work = tmp_path_factory.mktemp("judge")
    base = harness.make_model(str(work / "base"), 0)
    heads = work / "heads"
    heads.mkdir()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    model.eval()
    shape = model.lm_head.weight.shape
    weights = {}
    for v in range(0, 20):  # the judge reads versions up to end + 8
        g = torch.Generator().manual_seed(1000 + v)
        w = (torch.randn(shape, generator=g) * 0.5).to(torch.bfloat16)
        weights[v] = w
        (heads / f"lm_head.v{v}.bin").write_bytes(w.view(torch.int16).numpy().tobytes())

    def greedy(v, prefix, n):
        """`n` tokens of version v's greedy continuation of PROMPT + prefix."""
        ids = PROMPT + prefix
        with torch.no_grad():
            model.lm_head.weight.copy_(weights[v])
            for _ in range(n):
                ids = ids + [int(model(torch.tensor([ids])).logits[0, -1].float().argmax())]
        return ids[len(PROMPT) + len(prefix):]

    judge = subprocess.Popen([sys.executable, os.path.join(HERE, "chaos_judge.py"), "--model",
                              base, "--heads", str(heads)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert judge.stdout.readline().strip() == "ready"

    def ask(tokens, start, end, spans=None):
        q = {"prompt": PROMPT, "tokens": tokens, "length": LENGTH, "start": start, "end": end}
        if spans is not None:
            q["spans"] = spans
        judge.stdin.write(json.dumps(q) + "\n")
        judge.stdin.flush()
        answer = json.loads(judge.stdout.readline())
        assert "error" not in answer, answer
        return answer

    yield greedy, ask
    judge.stdin.close()
    judge.wait(timeout=30)


def test_a_versions_greedy_answer_is_that_version_and_no_other(setup):
    greedy, ask = setup
    answer = greedy(3, [], LENGTH)
    assert ask(answer, 3, 3, spans=[[0, 3]]) == {
        "verdict": "same", "versions": [3], "switch_at": [], "matches": None, "spans": True}
    wrong = ask(answer, 5, 5, spans=[[0, 5]])
    assert wrong["verdict"] == "mismatch"
    assert wrong["matches"] == 3  # the diagnosis names the version that made it
    assert wrong["spans"] is False


def test_an_answer_across_a_commit_is_explained_by_its_switch(setup):
    greedy, ask = setup
    k = 10
    first = greedy(6, [], k)
    answer = first + greedy(7, first, LENGTH - k)
    crossed = ask(answer, 6, 7, spans=[[0, 6], [k, 7]])
    assert crossed["verdict"] == "crossed"
    assert crossed["versions"] == [6, 7]
    assert crossed["spans"] is True
    # Labelled with one of the two versions alone, it is wrong.
    assert ask(answer, 7, 7)["verdict"] == "mismatch"
    assert ask(answer, 6, 6)["verdict"] == "mismatch"
    # Spans that put the whole answer on the new version do not explain it.
    assert ask(answer, 6, 7, spans=[[0, 7]])["spans"] is False


def test_a_short_or_garbled_answer_is_a_mismatch(setup):
    greedy, ask = setup
    answer = greedy(2, [], LENGTH)
    assert ask(answer[:-1], 2, 2)["verdict"] == "mismatch"
    garbled = list(answer)
    garbled[5] = (garbled[5] + 1) % 256
    assert ask(garbled, 0, 11)["verdict"] == "mismatch"
