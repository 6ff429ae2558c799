#include "stitch/refengine/hf_tokenizer.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/io/fileio.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

namespace json = boost::json;

constexpr std::string_view kBos = "<|stitch_bos|>";
constexpr std::string_view kEos = "<|stitch_eos|>";

// Renders ApplyChatTemplate's text (tokenizer.h), BOS first. Content given
// as a list of text parts is joined without a separator, as the reference
// engine joins it (and a template that loops over the parts keeps vLLM from
// joining them with newlines itself).
constexpr std::string_view kChatTemplate =
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
    "{{- '<|assistant|>\\n' -}}";

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// GPT-2's reversible map from bytes to printable characters (what a
// ByteLevel pre-tokenizer turns each byte into): printable Latin-1 bytes
// stand for themselves, the others for U+0100 onwards, in byte order.
std::string ByteCharacter(int byte) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      AppendUtf8(printable ? static_cast<char32_t>(b) : next++, t[static_cast<size_t>(b)]);
    }
    return t;
  }();
  return table[static_cast<size_t>(byte)];
}

std::string SpecialName(int64_t id) {
  if (id == kBosToken) return std::string(kBos);
  if (id == kEosToken) return std::string(kEos);
  return absl::StrCat("<|stitch_unused_", id, "|>");
}

json::object Special(std::string_view id) {
  json::object o;
  o["SpecialToken"] = json::object{{"id", id}, {"type_id", 0}};
  return o;
}

json::object Sequence(std::string_view id, int type_id) {
  json::object o;
  o["Sequence"] = json::object{{"id", id}, {"type_id", type_id}};
  return o;
}

std::string TokenizerJson(const ModelConfig& config) {
  json::array added;
  for (int64_t id = kBosToken; id < config.vocab_size; ++id) {
    added.push_back(json::object{{"id", id},
                                 {"content", SpecialName(id)},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  json::object vocab;
  for (int b = 0; b < 256; ++b) vocab[ByteCharacter(b)] = b;
  json::object special_tokens;
  special_tokens[kBos] =
      json::object{{"id", kBos}, {"ids", json::array{kBosToken}}, {"tokens", json::array{kBos}}};
  json::object doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = std::move(added);
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = json::object{{"type", "ByteLevel"},
                                      {"add_prefix_space", false},
                                      {"trim_offsets", true},
                                      {"use_regex", false}};
  doc["post_processor"] =
      json::object{{"type", "TemplateProcessing"},
                   {"single", json::array{Special(kBos), Sequence("A", 0)}},
                   {"pair", json::array{Special(kBos), Sequence("A", 0), Sequence("B", 1)}},
                   {"special_tokens", std::move(special_tokens)}};
  doc["decoder"] = json::object{{"type", "ByteLevel"},
                                {"add_prefix_space", true},
                                {"trim_offsets", true},
                                {"use_regex", true}};
  doc["model"] = json::object{{"type", "BPE"},
                              {"dropout", nullptr},
                              {"unk_token", nullptr},
                              {"continuing_subword_prefix", nullptr},
                              {"end_of_word_suffix", nullptr},
                              {"fuse_unk", false},
                              {"byte_fallback", false},
                              {"ignore_merges", false},
                              {"vocab", std::move(vocab)},
                              {"merges", json::array{}}};
  return json::serialize(doc) + "\n";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> HfTokenizerFiles(const ModelConfig& config) {
  json::object tokenizer_config{{"tokenizer_class", "PreTrainedTokenizerFast"},
                                {"bos_token", kBos},
                                {"eos_token", kEos},
                                {"add_bos_token", true},
                                {"add_eos_token", false},
                                {"clean_up_tokenization_spaces", false},
                                {"model_max_length", config.max_position_embeddings},
                                {"chat_template", kChatTemplate}};
  json::object special_map{{"bos_token", kBos}, {"eos_token", kEos}};
  json::object generation{{"bos_token_id", config.bos_token_id},
                          {"eos_token_id", config.eos_token_id}};
  return {{std::string(kHfTokenizerFiles[0]), TokenizerJson(config)},
          {std::string(kHfTokenizerFiles[1]), json::serialize(tokenizer_config) + "\n"},
          {std::string(kHfTokenizerFiles[2]), json::serialize(special_map) + "\n"},
          {std::string(kHfTokenizerFiles[3]), json::serialize(generation) + "\n"}};
}

absl::Status WriteHfTokenizerFiles(const std::filesystem::path& dir, const ModelConfig& config) {
  for (const auto& [name, text] : HfTokenizerFiles(config)) {
    if (absl::Status s = WriteFileAtomically(dir / name, text); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace stitch
