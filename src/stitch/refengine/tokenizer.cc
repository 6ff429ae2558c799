#include "stitch/refengine/tokenizer.h"

#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

enum class Input { kMore, kEnd };

// Appends the valid UTF-8 form of `bytes` to `out` and returns how many bytes
// it consumed. With Input::kMore, an incomplete but so far well-formed
// character at the end is left unconsumed for the next call.
size_t AppendUtf8(std::string_view bytes, Input input, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      out.append(kReplacement);
      ++i;
      continue;
    }
    int have = 0;  // continuation bytes that fit
    while (have < need && i + 1 + have < bytes.size()) {
      const auto b = static_cast<unsigned char>(bytes[i + 1 + have]);
      const unsigned char min = have == 0 ? lo : 0x80;
      const unsigned char max = have == 0 ? hi : 0xBF;
      if (b < min || b > max) break;
      ++have;
    }
    if (have == need) {
      out.append(bytes.substr(i, 1 + need));
      i += 1 + need;
    } else if (i + 1 + have == bytes.size() && input == Input::kMore) {
      break;
    } else {
      out.append(kReplacement);
      i += 1 + have;
    }
  }
  return i;
}

bool IsRoleChar(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

}  // namespace

std::vector<int32_t> EncodeText(std::string_view text, BosMode bos) {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (bos == BosMode::kPrepend) ids.push_back(kBosToken);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string DecodeTokens(std::span<const int32_t> ids) {
  std::string bytes;
  bytes.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) bytes.push_back(static_cast<char>(id));
  }
  std::string out;
  out.reserve(bytes.size());
  AppendUtf8(bytes, Input::kEnd, out);
  return out;
}

std::string TokenStreamDecoder::Push(int32_t id) {
  if (id < 0 || id >= 256) return {};
  pending_.push_back(static_cast<char>(id));
  std::string out;
  pending_.erase(0, AppendUtf8(pending_, Input::kMore, out));
  return out;
}

std::string TokenStreamDecoder::Finish() {
  std::string out;
  AppendUtf8(pending_, Input::kEnd, out);
  pending_.clear();
  return out;
}

absl::StatusOr<std::string> ApplyChatTemplate(std::span<const ChatMessage> messages) {
  if (messages.empty()) return absl::InvalidArgumentError("messages must not be empty");
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    bool ok = !role.empty() && role.size() <= 32;
    for (char c : role) ok = ok && IsRoleChar(c);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "].role \"", role,
          "\" is not a role: use lowercase letters and '_' (system, user, assistant, tool)"));
    }
    absl::StrAppend(&out, "<|", role, "|>\n", messages[i].content, "\n");
  }
  out += "<|assistant|>\n";
  return out;
}

}  // namespace stitch
