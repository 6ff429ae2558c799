#include "stitch/refengine/tokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stitch {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::vector<int32_t> Bytes(std::string_view s) { return EncodeText(s, BosMode::kNone); }

TEST(Tokenizer, EncodesBytesAndRoundTripsUtf8) {
  const std::string text = "h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80\n\t\x01";
  const std::vector<int32_t> ids = EncodeText(text, BosMode::kPrepend);
  ASSERT_EQ(ids.size(), text.size() + 1);
  EXPECT_EQ(ids[0], kBosToken);
  EXPECT_EQ(ids[1], 'h');
  EXPECT_EQ(ids[2], 0xC3);
  EXPECT_EQ(DecodeTokens(ids), text);
  EXPECT_EQ(Bytes("").size(), 0u);
}

TEST(Tokenizer, DecodeDropsSpecialAndExtraIds) {
  EXPECT_EQ(DecodeTokens(std::vector<int32_t>{kBosToken, 'a', kEosToken, 300, 'b', 258, -1}), "ab");
}

TEST(Tokenizer, IllFormedBytesBecomeOneReplacementPerMaximalSubpart) {
  // Expected values are Python's bytes.decode("utf-8", errors="replace").
  struct Case {
    std::string bytes;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"a\xFF"
       "b",
       "a" + kFffd + "b"},
      {"\xC3", kFffd},      // truncated 2-byte character at the end
      {"\xE2\x82", kFffd},  // truncated 3-byte character: one U+FFFD
      {"\xE2\x82z", kFffd + "z"},
      {"\xF0\x80\x80", kFffd + kFffd + kFffd},              // F0 needs 90..BF next
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},              // a surrogate
      {"\xC0\xAF", kFffd + kFffd},                          // an overlong form
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // above U+10FFFF
      {"\xF0\x9F\x98", kFffd},
      {"\x80", kFffd},
  };
  for (const Case& c : cases)
    EXPECT_EQ(DecodeTokens(Bytes(c.bytes)), c.text) << testing::PrintToString(c.bytes);
}

TEST(TokenStreamDecoder, PiecesConcatenateToTheWholeDecode) {
  uint64_t state = 1;
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    const int n = round % 17;
    for (int i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      // Mostly bytes that form or break multi-byte characters, some specials.
      const uint32_t r = static_cast<uint32_t>(state >> 33);
      const int32_t choices[] = {0x41, 0xC3, 0xA9, 0xE2, 0x82, 0xAC,
                                 0xF0, 0x9F, 0x98, 0x80, 0xFF, kEosToken};
      ids.push_back(choices[r % 12]);
    }
    TokenStreamDecoder d;
    std::string streamed;
    for (int32_t id : ids) streamed += d.Push(id);
    streamed += d.Finish();
    EXPECT_EQ(streamed, DecodeTokens(ids)) << "round " << round;
  }
}

TEST(TokenStreamDecoder, HoldsASplitCharacterUntilComplete) {
  TokenStreamDecoder d;
  EXPECT_EQ(d.Push(0xE2), "");
  EXPECT_EQ(d.Push(0x82), "");
  EXPECT_EQ(d.Push(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(d.Push('x'), "x");
  EXPECT_EQ(d.Push(0xF0), "");
  EXPECT_EQ(d.Finish(), kFffd);
  EXPECT_EQ(d.Finish(), "");
}

TEST(ChatTemplate, RendersRolesAndPromptsTheAssistant) {
  const std::vector<ChatMessage> messages = {{"system", "be brief"}, {"user", "hi\nthere"}};
  auto text = ApplyChatTemplate(messages);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|system|>\nbe brief\n<|user|>\nhi\nthere\n<|assistant|>\n");
}

TEST(ChatTemplate, RefusesBadRolesAndNoMessages) {
  EXPECT_FALSE(ApplyChatTemplate({}).ok());
  for (const std::string& role :
       std::vector<std::string>{"", "User", "a|b", "user\n", std::string(33, 'a')}) {
    const std::vector<ChatMessage> m = {{"user", "ok"}, {role, "x"}};
    auto r = ApplyChatTemplate(m);
    ASSERT_FALSE(r.ok()) << role;
    EXPECT_NE(std::string(r.status().message()).find("messages[1].role"), std::string::npos);
  }
}

}  // namespace
}  // namespace stitch
