// Unicode helpers the tokenizer needs: UTF-8 decoding with the "maximal subpart" rule for invalid
// bytes (what HF's from_utf8_lossy does), White_Space, and NFC normalization (Qwen2's normalizer).
// Stateless functions over immutable tables; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dinfer::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

enum class Utf8Status : uint8_t {
  kValid,       // a complete, well-formed sequence
  kInvalid,     // ill-formed: `length` bytes (>= 1) form one maximal subpart, replaced by U+FFFD
  kIncomplete,  // well-formed so far but cut off by the end of the input
};

struct Utf8Char {
  char32_t code_point = 0;  // meaningful only when status == kValid
  uint32_t length = 1;      // bytes consumed
  Utf8Status status = Utf8Status::kValid;
};

// Decodes the sequence that starts at text[pos] (pos < text.size()).
Utf8Char DecodeUtf8(std::string_view text, size_t pos);

void AppendUtf8(char32_t code_point, std::string* out);

// Valid UTF-8 as is; each maximal ill-formed subpart (and a truncated tail) becomes U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Unicode White_Space (Rust's char::is_whitespace).
bool IsWhitespace(char32_t c);

// NFC. Returns false, leaving *out alone, when `text` is already NFC (the common case, checked
// fast). Ill-formed bytes pass through unchanged and block composition across them.
bool NormalizeNfc(std::string_view text, std::string* out);

}  // namespace dinfer::tokenizer
