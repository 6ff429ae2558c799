"""Adds Hugging Face tokenizer files to a checkpoint made by `stitch engine init-model`.

    python tests/engines/hf_tokenizer.py DIR           write the files
    python tests/engines/hf_tokenizer.py DIR --check   write them, then check them

Run it with a python that has `tokenizers` (and, for --check, `transformers`):
the vLLM environment of scripts/install-engines has both.

The reference engine's vocabulary is byte-level (src/stitch/refengine/
tokenizer.h): id b < 256 is the byte b, 256 is BOS and 257 is EOS, and ids
from 258 to vocab_size - 1 are never produced and are dropped when decoding.
A text prompt is encoded as BOS followed by the text's UTF-8 bytes (for
/generate, /v1/completions and chat alike). Real engines (vLLM, SGLang) load
a tokenizer from the checkpoint directory, so this writes one that encodes
and decodes exactly as the reference engine does:

- tokenizer.json: the GPT-2 byte-to-character mapping (a ByteLevel
  pre-tokenizer without its regex split) over a BPE model with no merges, so
  that every UTF-8 byte of the text is one token whose id is the byte value;
  a post-processor that puts BOS first when special tokens are added; a
  ByteLevel decoder, which turns ill-formed UTF-8 into U+FFFD as the
  reference engine does. BOS, EOS and the unused ids are special tokens, so
  decoding with skip_special_tokens drops them.
- tokenizer_config.json: the special tokens and a chat template that renders
  what ApplyChatTemplate in src/stitch/refengine/tokenizer.cc renders, with
  BOS in front (engines tokenize a rendered chat without adding special
  tokens, so BOS must come from the template's text).

One difference remains: text that spells a special token's name
("<|stitch_bos|>", "<|stitch_eos|>", "<|stitch_unused_N|>") is encoded as
that one special id, where the reference engine encodes its bytes. Setting
split_special_tokens would fix that but also stop the chat template's BOS
from being recognised; the names are chosen not to occur in test texts.
- special_tokens_map.json and generation_config.json (BOS/EOS, for the
  loaders that read them).
"""

import argparse
import json
import os
import sys

BOS_ID, EOS_ID, BYTE_COUNT = 256, 257, 256
BOS, EOS = "<|stitch_bos|>", "<|stitch_eos|>"

# The reference engine's template: "<|role|>\n" + content + "\n" per message,
# then "<|assistant|>\n" whatever add_generation_prompt says. Content given as
# a list of text parts is concatenated without a separator, as the reference
# engine does; the loop over parts also makes vLLM pass such lists through
# as they are instead of joining them with newlines itself.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}{{- part['text'] -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{{- '<|assistant|>\\n' -}}"
)


def byte_chars():
    """GPT-2's reversible byte -> printable character mapping (what the
    ByteLevel pre-tokenizer turns each byte into)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for b in range(BYTE_COUNT):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def special_names(vocab_size):
    names = {BOS_ID: BOS, EOS_ID: EOS}
    for i in range(EOS_ID + 1, vocab_size):
        names[i] = f"<|stitch_unused_{i}|>"
    return names


def build_tokenizer(vocab_size):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {c: b for b, c in byte_chars().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    # No regex split (it would only cut the text into words; every byte is
    # a token anyway) and no prefix space: the bytes stay exactly the text's.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, BOS_ID)]
    )
    names = special_names(vocab_size)
    added = tok.add_special_tokens(
        [AddedToken(names[i], special=True, normalized=False) for i in sorted(names)]
    )
    assert added == len(names)
    for i, name in names.items():
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name), i)
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    return tok


def write_files(ckpt):
    with open(os.path.join(ckpt, "config.json")) as f:
        config = json.load(f)
    vocab_size = config["vocab_size"]
    if config.get("bos_token_id") != BOS_ID or config.get("eos_token_id") != EOS_ID:
        sys.exit(f"{ckpt}/config.json: BOS/EOS are not {BOS_ID}/{EOS_ID}")
    build_tokenizer(vocab_size).save(os.path.join(ckpt, "tokenizer.json"))

    def dump(name, doc):
        with open(os.path.join(ckpt, name), "w") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump(
        "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": config.get("max_position_embeddings", 2048),
            "chat_template": CHAT_TEMPLATE,
        },
    )
    dump("special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS})
    dump("generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID})


# --- --check ------------------------------------------------------------------

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
    if failures:
        print("\n".join(failures))
        sys.exit(f"{len(failures)} tokenizer checks failed")
    print(f"{ckpt}: tokenizer matches the reference engine ({len(SAMPLES)} texts, {len(chats)} chats)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="checkpoint directory made by `stitch engine init-model`")
    p.add_argument("--check", action="store_true", help="then check the files with transformers")
    args = p.parse_args()
    write_files(args.dir)
    if args.check:
        check(args.dir)


if __name__ == "__main__":
    main()
