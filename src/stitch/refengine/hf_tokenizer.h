// The reference engine's byte vocabulary (tokenizer.h) as Hugging Face
// tokenizer files, so that real engines (vLLM, SGLang) and transformers load
// a checkpoint the reference engine writes and tokenize exactly as it does:
//
//   tokenizer.json           a byte-level BPE with no merges (GPT-2's
//                            byte-to-character map, no regex split, no
//                            prefix space): each UTF-8 byte of a text is one
//                            token whose id is the byte; BOS first when
//                            special tokens are added; BOS, EOS and the unused
//                            ids above them are special tokens, dropped when
//                            decoding with skip_special_tokens; the
//                            ByteLevel decoder turns ill-formed UTF-8 into
//                            U+FFFD as DecodeTokens does
//   tokenizer_config.json    the special tokens and a chat template that
//                            renders ApplyChatTemplate's text with BOS in
//                            front (engines tokenize a rendered chat without
//                            adding special tokens)
//   special_tokens_map.json, generation_config.json   BOS and EOS
//
// One difference remains: a text that spells a special token's name
// ("<|stitch_bos|>", "<|stitch_unused_300|>") is that one special id to a
// Hugging Face tokenizer, and its bytes to the reference engine.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "stitch/refengine/config.h"

namespace stitch {

// The names of the files above.
inline constexpr std::string_view kHfTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"};

// The files above for `config`, as (name, contents), in that order; the same
// configuration gives the same bytes. REQUIRES: config.Validate() is OK.
std::vector<std::pair<std::string, std::string>> HfTokenizerFiles(const ModelConfig& config);

// Writes HfTokenizerFiles(config) into `dir` (an existing directory), each
// file atomically.
[[nodiscard]] absl::Status WriteHfTokenizerFiles(const std::filesystem::path& dir,
                                                 const ModelConfig& config);

}  // namespace stitch
