#include "structured/lowering.h"

#include <algorithm>
#include <string>

namespace dinfer::structured {
namespace {

void SplitSameLength(uint32_t lo, uint32_t hi, int len, std::vector<ByteSequence>* out) {
  // Split until every continuation position spans whole 6-bit blocks, so that the range is the
  // cross product of per-byte ranges.
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitSameLength(lo, lo | m, len, out);
        SplitSameLength((lo | m) + 1, hi, len, out);
        return;
      }
      if ((hi & m) != m) {
        SplitSameLength(lo, (hi & ~m) - 1, len, out);
        SplitSameLength(hi & ~m, hi, len, out);
        return;
      }
    }
  }
  std::string a, b;
  AppendUtf8(lo, &a);
  AppendUtf8(hi, &b);
  ByteSequence seq;
  for (size_t k = 0; k < a.size(); ++k) {
    seq.push_back({{static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])}});
  }
  out->push_back(std::move(seq));
}

void AddSequence(const ByteSequence& seq, uint8_t last_mark, int32_t from, int32_t to, Nfa* nfa) {
  int32_t cur = from;
  for (size_t i = 0; i < seq.size(); ++i) {
    int32_t next = to;
    if (i + 1 < seq.size()) {
      nfa->states.emplace_back();
      next = static_cast<int32_t>(nfa->states.size() - 1);
    }
    const uint8_t mark = i + 1 == seq.size() ? last_mark : 0;
    for (const auto& [lo, hi] : seq[i]) nfa->states[cur].bytes.push_back({lo, hi, mark, next});
    cur = next;
  }
}

ByteSet Byte(char c) { return {{static_cast<uint8_t>(c), static_cast<uint8_t>(c)}}; }

const ByteSet& HexDigit() {
  static const ByteSet kHex = {{'0', '9'}, {'A', 'F'}, {'a', 'f'}};
  return kHex;
}

// One hex digit of value v, either case.
ByteSet HexOf(uint32_t v) {
  const char* kLower = "0123456789abcdef";
  const char* kUpper = "0123456789ABCDEF";
  ByteSet set = Byte(kLower[v]);
  if (v >= 10) set.push_back(Byte(kUpper[v])[0]);
  return set;
}

}  // namespace

std::vector<ByteSequence> Utf8Sequences(uint32_t lo, uint32_t hi) {
  static constexpr uint32_t kLast[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  std::vector<ByteSequence> out;
  for (int n = 0; n < 4; ++n) {
    const uint32_t first = n == 0 ? 0 : kLast[n - 1] + 1;
    const uint32_t a = std::max(lo, first), b = std::min(hi, kLast[n]);
    if (a <= b) SplitSameLength(a, b, n + 1, &out);
  }
  return out;
}

void LowerChars(const Ranges& codepoints, CharEncoding encoding, bool mark_chars, int32_t from,
                int32_t to, Nfa* nfa) {
  const uint8_t mark = mark_chars ? static_cast<uint8_t>(ByteMark::kChar) : 0;
  if (encoding == CharEncoding::kUtf8) {
    for (const auto& [lo, hi] : codepoints) {
      for (const ByteSequence& seq : Utf8Sequences(lo, hi)) AddSequence(seq, mark, from, to, nfa);
    }
    return;
  }
  // Characters that JSON lets through as themselves.
  const Ranges raw =
      IntersectRanges(codepoints, {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}});
  for (const auto& [lo, hi] : raw) {
    for (const ByteSequence& seq : Utf8Sequences(lo, hi)) AddSequence(seq, mark, from, to, nfa);
  }
  auto contains = [&](uint32_t cp) {
    return std::any_of(codepoints.begin(), codepoints.end(),
                       [&](const auto& r) { return r.first <= cp && cp <= r.second; });
  };
  auto escape = [&](char c) { AddSequence({Byte('\\'), Byte(c)}, mark, from, to, nfa); };
  if (contains('"')) escape('"');
  if (contains('\\')) escape('\\');
  if (contains('/')) escape('/');
  static constexpr std::pair<uint32_t, char> kShort[] = {
      {0x08, 'b'}, {0x0C, 'f'}, {0x0A, 'n'}, {0x0D, 'r'}, {0x09, 't'}};
  for (uint32_t cp = 0; cp < 0x20; ++cp) {
    if (!contains(cp)) continue;
    for (const auto& [c, letter] : kShort) {
      if (c == cp) escape(letter);
    }
    AddSequence({Byte('\\'), Byte('u'), Byte('0'), Byte('0'), HexOf(cp >> 4), HexOf(cp & 15)}, mark,
                from, to, nfa);
  }
  if (encoding != CharEncoding::kJsonStringAnyEscape) return;
  // Any character as \uXXXX: BMP characters other than surrogates, and surrogate pairs.
  const ByteSet not_d = {{'0', '9'}, {'A', 'C'}, {'E', 'F'}, {'a', 'c'}, {'e', 'f'}};
  const ByteSet d = {{'D', 'D'}, {'d', 'd'}};
  const ByteSet& h = HexDigit();
  AddSequence({Byte('\\'), Byte('u'), not_d, h, h, h}, mark, from, to, nfa);
  AddSequence({Byte('\\'), Byte('u'), d, {{'0', '7'}}, h, h}, mark, from, to, nfa);
  AddSequence({Byte('\\'),
               Byte('u'),
               d,
               {{'8', '9'}, {'A', 'B'}, {'a', 'b'}},
               h,
               h,
               Byte('\\'),
               Byte('u'),
               d,
               {{'C', 'F'}, {'c', 'f'}},
               h,
               h},
              mark, from, to, nfa);
}

}  // namespace dinfer::structured
