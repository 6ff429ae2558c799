"""Checks, with transformers, the Hugging Face tokenizer files that
`stitch engine init-model` writes (src/stitch/refengine/hf_tokenizer.h), and
gives the reference engine's own encoding for the suites' oracle.

    python tests/engines/hf_tokenizer.py DIR

Run it with a python that has `transformers` (the environments that
scripts/install-engines makes have it).

The reference engine's vocabulary is byte-level (src/stitch/refengine/
tokenizer.h): id b < 256 is the byte b, 256 is BOS and 257 is EOS, and ids
from 258 to vocab_size - 1 are never produced and are dropped when decoding.
A text prompt is encoded as BOS followed by the text's UTF-8 bytes (for
/generate, /v1/completions and chat alike). Real engines load a tokenizer
from the checkpoint directory: check() asserts that it encodes, decodes and
renders chats exactly as the reference engine does, except that a text
spelling a special token's name ("<|stitch_bos|>") is that special id.
"""

import argparse
import json
import os
import sys

BOS_ID, EOS_ID, BYTE_COUNT = 256, 257, 256
BOS = "<|stitch_bos|>"

SAMPLES = [
    "",
    "a",
    "Hello, world!",
    "  two  spaces\tand a tab\nnewline\r\n",
    "héllo wörld — “quotes” ½ €",
    "日本語のテキスト",
    "emoji 🎉👩‍👩‍👧 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|user|> <s> </s> <|endoftext|> look like specials",
    "\x00\x01\x7f control bytes",
    "".join(chr(c) for c in range(1, 0x800, 7)),
]


def ref_encode(text, bos=True):
    """The reference engine's EncodeText."""
    return ([BOS_ID] if bos else []) + list(text.encode("utf-8"))


def ref_decode(ids):
    """The reference engine's DecodeTokens."""
    return bytes(i for i in ids if 0 <= i < BYTE_COUNT).decode("utf-8", errors="replace")


def ref_chat(messages):
    """The reference engine's ApplyChatTemplate (text parts concatenated)."""
    out = ""
    for m in messages:
        c = m["content"]
        if not isinstance(c, str):
            c = "".join(p["text"] for p in c)
        out += f"<|{m['role']}|>\n{c}\n"
    return out + "<|assistant|>\n"


def check(ckpt):
    from transformers import AutoTokenizer

    config = json.load(open(os.path.join(ckpt, "config.json")))
    tok = AutoTokenizer.from_pretrained(ckpt)
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    expect("bos_token_id", tok.bos_token_id, BOS_ID)
    expect("eos_token_id", tok.eos_token_id, EOS_ID)
    expect("len(tokenizer)", len(tok), config["vocab_size"])
    for text in SAMPLES:
        ids = tok(text)["input_ids"]
        expect(f"encode {text!r}", ids, ref_encode(text))
        expect(f"encode (no specials) {text!r}", tok(text, add_special_tokens=False)["input_ids"],
               ref_encode(text, bos=False))
        expect(f"decode {text!r}", tok.decode(ids + [EOS_ID], skip_special_tokens=True), text)
        # Token by token, as an engine streams (each byte alone), joined.
        expect(f"bytes {text!r}", b"".join(
            bytes([i]) for i in ids if i < BYTE_COUNT), text.encode("utf-8"))
    # Ill-formed UTF-8 and ids past EOS decode as in the reference engine.
    odd = [0x61, 0xE6, 0x97, 0x62, 0xC0, 0xAF, 0xF0, 0x9F, 0x8E, BOS_ID, 0xFF, 0x63, 0xE2, 0x82]
    odd += list(range(EOS_ID + 1, config["vocab_size"]))
    expect("decode ill-formed", tok.decode(odd, skip_special_tokens=True), ref_decode(odd))
    chats = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief.\n"}, {"role": "user", "content": "日本 🎉"},
         {"role": "assistant", "content": ""}, {"role": "tool", "content": "<|user|>x"}],
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    ]
    for chat in chats:
        for gen in (True, False):
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            expect(f"chat text {chat!r}", text, BOS + ref_chat(chat))
            ids = tok(text, add_special_tokens=False)["input_ids"]
            expect(f"chat ids {chat!r}", ids, ref_encode(ref_chat(chat)))
    assert not failures, f"{ckpt}: " + "\n".join(failures)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="checkpoint directory made by `stitch engine init-model`")
    args = p.parse_args()
    check(args.dir)
    print(f"{args.dir}: the tokenizer files tokenize as the reference engine does")


if __name__ == "__main__":
    main()
