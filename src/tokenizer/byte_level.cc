#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace dinfer::tokenizer {
namespace {

// Printable bytes stand for themselves; the others (controls, space, DEL, NBSP, soft hyphen) take
// the code points 256, 257, ... in byte order.
constexpr bool StandsForItself(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr std::array<char16_t, 256> MakeByteToChar() {
  std::array<char16_t, 256> table{};
  char16_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = StandsForItself(b) ? char16_t(b) : next++;
  return table;
}

constexpr std::array<char16_t, 256> kByteToChar = MakeByteToChar();

// Inverse over [0, 324): every alphabet code point is below 256 + 68.
constexpr int kAlphabetLimit = 324;
constexpr std::array<int16_t, kAlphabetLimit> MakeCharToByte() {
  std::array<int16_t, kAlphabetLimit> table{};
  for (auto& v : table) v = -1;
  for (int b = 0; b < 256; ++b) table[kByteToChar[b]] = static_cast<int16_t>(b);
  return table;
}

constexpr std::array<int16_t, kAlphabetLimit> kCharToByte = MakeCharToByte();

}  // namespace

char32_t ByteToChar(uint8_t b) { return kByteToChar[b]; }

std::optional<uint8_t> CharToByte(char32_t c) {
  if (c >= kAlphabetLimit || kCharToByte[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(kCharToByte[c]);
}

void AppendByteLevel(std::string_view bytes, std::string* out) {
  for (char ch : bytes) AppendUtf8(kByteToChar[static_cast<uint8_t>(ch)], out);
}

std::string DecodeByteLevel(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Char ch = DecodeUtf8(token, pos);
    std::optional<uint8_t> b;
    if (ch.status == Utf8Status::kValid) b = CharToByte(ch.code_point);
    if (!b) return std::string(token);
    bytes.push_back(static_cast<char>(*b));
    pos += ch.length;
  }
  return bytes;
}

}  // namespace dinfer::tokenizer
