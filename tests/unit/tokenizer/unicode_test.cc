// UTF-8, NFC and byte-level alphabet unit tests.

#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"

namespace dinfer::tokenizer {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, DecodeStatuses) {
  EXPECT_EQ(DecodeUtf8("é", 0).code_point, U'é');
  EXPECT_EQ(DecodeUtf8("é", 0).length, 2u);
  EXPECT_EQ(DecodeUtf8("\xF0\x9F\x98\x80", 0).code_point, U'😀');
  EXPECT_EQ(DecodeUtf8("\xF0\x9F\x98", 0).status, Utf8Status::kIncomplete);
  EXPECT_EQ(DecodeUtf8("\xF0\x9F"
                       "a",
                       0)
                .status,
            Utf8Status::kInvalid);
  EXPECT_EQ(DecodeUtf8("\xF0\x9F"
                       "a",
                       0)
                .length,
            2u);
  EXPECT_EQ(DecodeUtf8("\x80", 0).status, Utf8Status::kInvalid);
  EXPECT_EQ(DecodeUtf8("\xC0\xAF", 0).length, 1u);          // overlong lead byte
  EXPECT_EQ(DecodeUtf8("\xED\xA0\x80", 0).length, 1u);      // surrogate: ED takes only 80..9F
  EXPECT_EQ(DecodeUtf8("\xF4\x90\x80\x80", 0).length, 1u);  // beyond U+10FFFF
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  // The same results as Rust's String::from_utf8_lossy (what HF's decoders use).
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"
                      "a"),
            kFffd + "a");
  EXPECT_EQ(Utf8Lossy("\xE0\x80\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy("a\xE2\x82"), "a" + kFffd);
  EXPECT_EQ(Utf8Lossy("\xFF\xFE"), kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy(std::string("\0x", 2)), std::string("\0x", 2));
}

TEST(UnicodeTest, Whitespace) {
  for (char32_t c : {U' ', U'\t', U'\n', U'\v', U'\f', U'\r', U'\u0085', U'\u00A0', U'\u2000',
                     U'\u200A', U'\u2028', U'\u3000'}) {
    EXPECT_TRUE(IsWhitespace(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'a', U'\u180E', U'\u200B', U'\u001C', U'\uFEFF'}) {
    EXPECT_FALSE(IsWhitespace(c)) << static_cast<uint32_t>(c);
  }
}

std::string Nfc(std::string_view s) {
  std::string out;
  return NormalizeNfc(s, &out) ? out : std::string(s);
}

TEST(NfcTest, Composes) {
  EXPECT_EQ(Nfc("cafe\u0301"), "café");
  EXPECT_EQ(Nfc("A\u030A"), "Å");
  EXPECT_EQ(Nfc("\u212B"), "Å");               // singleton decomposition
  EXPECT_EQ(Nfc("\u1100\u1161\u11A8"), "각");  // Hangul L V T
  EXPECT_EQ(Nfc("\uAC00\u11A8"), "각");        // Hangul LV T
  EXPECT_EQ(Nfc("\u0344"), "\u0308\u0301");    // excluded from composition
  EXPECT_EQ(Nfc("\uF900"), "\u8C48");          // CJK compatibility ideograph
}

TEST(NfcTest, ReordersMarks) {
  EXPECT_EQ(Nfc("q\u0307\u0323"), "q\u0323\u0307");
  EXPECT_EQ(Nfc("\u1E9B\u0323"), "\u1E9B\u0323");
  EXPECT_EQ(Nfc("s\u0307\u0323"), "\u1E69");         // dot below composes first, then dot above
  EXPECT_EQ(Nfc("\u0301\u0301a"), "\u0301\u0301a");  // leading marks have nothing to join
}

TEST(NfcTest, AlreadyNfcIsReportedUnchanged) {
  std::string out = "untouched";
  EXPECT_FALSE(NormalizeNfc("plain ASCII", &out));
  EXPECT_FALSE(NormalizeNfc("café 中文 한국어 😀", &out));
  EXPECT_EQ(out, "untouched");
}

TEST(NfcTest, IllFormedBytesPassThrough) {
  EXPECT_EQ(Nfc("e\xFF\u0301"), "e\xFF\u0301");
  EXPECT_EQ(Nfc("e\u0301\xFF"), "é\xFF");
}

TEST(ByteLevelTest, Alphabet) {
  EXPECT_EQ(ByteToChar(' '), U'Ġ');
  EXPECT_EQ(ByteToChar('\n'), U'Ċ');
  EXPECT_EQ(ByteToChar('a'), U'a');
  EXPECT_EQ(ByteToChar(0xAD), 0x143u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(CharToByte(ByteToChar(static_cast<uint8_t>(b))), b);
  EXPECT_FALSE(CharToByte(U' ').has_value());
  EXPECT_FALSE(CharToByte(U'中').has_value());
  std::string spelled;
  AppendByteLevel(" é\n", &spelled);
  EXPECT_EQ(spelled, "ĠÃ©Ċ");
  EXPECT_EQ(DecodeByteLevel("ĠÃ©Ċ"), " é\n");
  EXPECT_EQ(DecodeByteLevel("<|im_start|>"), "<|im_start|>");
  EXPECT_EQ(DecodeByteLevel("a b"), "a b");  // ' ' is not in the alphabet: kept as text
  EXPECT_EQ(DecodeByteLevel("中文"), "中文");
}

}  // namespace
}  // namespace dinfer::tokenizer
