// GPT-2's byte-level alphabet: every byte maps to one printable code point, so byte-level BPE
// vocabularies (GPT-2, Llama 3, Qwen2, SmolLM2, ...) spell any byte string with visible chars
// ("Ġ" is the space byte). Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dinfer::tokenizer {

// The code point that stands for byte b.
char32_t ByteToChar(uint8_t b);

// The byte a code point stands for, or nullopt when it is not in the alphabet.
std::optional<uint8_t> CharToByte(char32_t c);

// Appends the byte-level spelling of `bytes` (UTF-8) to *out.
void AppendByteLevel(std::string_view bytes, std::string* out);

// The bytes a token spells, HF's ByteLevel decoder rule: if every char of `token` is in the
// alphabet, the bytes they stand for; otherwise `token`'s own UTF-8 bytes unchanged.
std::string DecodeByteLevel(std::string_view token);

}  // namespace dinfer::tokenizer
