// Lowering of character classes to byte-level NFA fragments: code point ranges become UTF-8 byte
// range sequences, and inside JSON strings the characters that must be escaped become their
// escape sequences. Also the NFA types the automaton builder assembles. Plain functions.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace dinfer::structured {

struct ByteEdge {
  uint8_t lo, hi;
  uint8_t mark;  // ByteMark bits
  int32_t to;
};

struct NfaState {
  std::vector<int32_t> eps;
  std::vector<ByteEdge> bytes;
  std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, continue-at state)
};

struct Nfa {
  std::vector<NfaState> states;
  std::vector<int32_t> absorbing;  // loop states of absorbing repetitions (Expr::absorbing)
};

// One byte position of a sequence: a set of byte ranges.
using ByteSet = std::vector<std::pair<uint8_t, uint8_t>>;
using ByteSequence = std::vector<ByteSet>;

// The UTF-8 encodings of the code points in [lo, hi] as sequences of byte ranges (each sequence
// a cross product of its positions), in increasing code point order.
std::vector<ByteSequence> Utf8Sequences(uint32_t lo, uint32_t hi);

// Adds edges from `from` to `to` that spell one character of `codepoints` in `encoding`; with
// `mark_chars` the last byte of each character carries ByteMark::kChar.
void LowerChars(const Ranges& codepoints, CharEncoding encoding, bool mark_chars, int32_t from,
                int32_t to, Nfa* nfa);

}  // namespace dinfer::structured
