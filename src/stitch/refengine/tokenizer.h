// The reference engine's byte-level tokenizer: token i < 256 is byte i, 256
// is BOS and 257 is EOS. Vocabularies larger than 258 have extra ids that
// encoding never produces and decoding drops, as it drops BOS and EOS.
//
// Decoded text is always valid UTF-8: byte sequences that are not UTF-8
// become U+FFFD, one per maximal ill-formed subsequence (the Unicode
// recommendation, and what Python's bytes.decode(errors="replace") does), so
// responses can go into JSON as they are.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stitch {

inline constexpr int32_t kBosToken = 256;
inline constexpr int32_t kEosToken = 257;

enum class BosMode { kNone, kPrepend };

// The text's bytes as token ids, after BOS when asked.
std::vector<int32_t> EncodeText(std::string_view text, BosMode bos);

// The bytes of the byte tokens, everything else dropped, as valid UTF-8.
std::string DecodeTokens(std::span<const int32_t> ids);

// Decodes a token stream piece by piece, for streaming responses. Each Push
// returns the text that is complete so far; a character split across tokens
// is held until its last byte arrives (or it turns out ill-formed). The
// concatenation of every Push and the final Finish equals DecodeTokens of all
// the ids.
class TokenStreamDecoder {
 public:
  std::string Push(int32_t id);
  // Flushes a held incomplete character as U+FFFD.
  std::string Finish();

 private:
  std::string pending_;
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// The reference engine's chat template: each message as "<|role|>\n"
// followed by its content and "\n", then "<|assistant|>\n" to prompt the
// reply. Roles are non-empty, at most 32 bytes of [a-z_] ("system", "user",
// "assistant", "tool", ...). InvalidArgument names the message at fault; no
// messages is an error too.
[[nodiscard]] absl::StatusOr<std::string> ApplyChatTemplate(std::span<const ChatMessage> messages);

}  // namespace stitch
