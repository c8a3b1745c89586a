#include "tokenizer/jinja/text.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace dinfer::tokenizer::jinja {

Text::Text(std::string s, bool trusted) : str_(std::move(s)) {
  if (!str_.empty()) runs_.push_back({str_.size(), trusted});
}

bool Text::AllTrusted() const {
  return std::all_of(runs_.begin(), runs_.end(), [](const Run& r) { return r.trusted; });
}

void Text::Append(std::string_view s, bool trusted) {
  if (s.empty()) return;
  str_.append(s);
  if (!runs_.empty() && runs_.back().trusted == trusted) {
    runs_.back().end = str_.size();
  } else {
    runs_.push_back({str_.size(), trusted});
  }
}

void Text::Append(const Text& t) {
  size_t begin = 0;
  for (const Run& r : t.runs_) {
    Append(std::string_view(t.str_).substr(begin, r.end - begin), r.trusted);
    begin = r.end;
  }
}

Text Text::Slice(size_t begin, size_t end) const {
  Text out;
  end = std::min(end, str_.size());
  if (begin >= end) return out;
  out.str_.reserve(end - begin);
  size_t run_begin = 0;
  for (const Run& r : runs_) {
    const size_t lo = std::max(run_begin, begin), hi = std::min(r.end, end);
    if (lo < hi) out.Append(std::string_view(str_).substr(lo, hi - lo), r.trusted);
    run_begin = r.end;
    if (run_begin >= end) break;
  }
  return out;
}

Text Text::MapCodePoints(char32_t (*map)(char32_t c, char32_t previous)) const {
  Text out;
  size_t run_begin = 0;
  char32_t previous = 0;
  for (const Run& r : runs_) {
    std::string mapped;
    for (size_t pos = run_begin; pos < r.end;) {
      size_t len = 0;
      const char32_t c = CodePointAt(str_, pos, &len);
      if (c == kReplacementChar && str_.compare(pos, len, "\xEF\xBF\xBD") != 0) {
        mapped.append(str_, pos, len);  // ill-formed bytes pass through
      } else {
        AppendUtf8(map(c, previous), &mapped);
      }
      previous = c;
      pos += len;
    }
    out.Append(mapped, r.trusted);
    run_begin = r.end;
  }
  return out;
}

char32_t CodePointAt(std::string_view s, size_t pos, size_t* length) {
  const Utf8Char ch = DecodeUtf8(s, pos);
  *length = ch.length;
  return ch.status == Utf8Status::kValid ? ch.code_point : kReplacementChar;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) {
    const unsigned char b = static_cast<unsigned char>(s[pos]);
    pos += b < 0x80 ? 1 : DecodeUtf8(s, pos).length;
  }
  return n;
}

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t pos = 0; pos < s.size();) {
    offsets.push_back(pos);
    const unsigned char b = static_cast<unsigned char>(s[pos]);
    pos += b < 0x80 ? 1 : DecodeUtf8(s, pos).length;
  }
  offsets.push_back(s.size());
  return offsets;
}

bool IsPySpace(char32_t c) {
  // Python's whitespace is Unicode White_Space plus the four ASCII separators.
  return (c >= 0x1C && c <= 0x1F) || IsWhitespace(c);
}

namespace {

// Ranges where upper and lower case letters alternate (upper at the even or odd code point).
bool InAlternatingRange(char32_t c, bool* upper) {
  struct Range {
    char32_t first, last;
  };
  // Each range starts with an upper-case letter.
  static constexpr Range kRanges[] = {{0x100, 0x137}, {0x139, 0x148},   {0x14A, 0x177},
                                      {0x179, 0x17E}, {0x460, 0x481},   {0x48A, 0x4BF},
                                      {0x4D0, 0x52F}, {0x1E00, 0x1E95}, {0x1EA0, 0x1EFF}};
  for (const Range& r : kRanges) {
    if (c >= r.first && c <= r.last) {
      *upper = ((c - r.first) % 2) == 0;
      return true;
    }
  }
  return false;
}

}  // namespace

char32_t ToLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c == 0x130) return c;  // Python lowers it to two code points; left alone
  bool upper = false;
  if (InAlternatingRange(c, &upper)) return upper ? c + 1 : c;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;  // fullwidth Latin
  return c;
}

char32_t ToUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  bool upper = false;
  if (InAlternatingRange(c, &upper)) return upper ? c : c - 1;
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 32;
  if (c == 0x3C2) return 0x3A3;  // final sigma
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return ToUpper(c) != c || ToLower(c) != c || c == 0xDF || (c >= 0x4E00 && c <= 0x9FFF) ||
         (c >= 0x3040 && c <= 0x30FF) || (c >= 0xAC00 && c <= 0xD7A3);
}

bool IsDigit(char32_t c) { return c >= '0' && c <= '9'; }

void StripRange(std::string_view s, std::string_view chars, bool left, bool right, size_t* begin,
                size_t* end) {
  auto strip_here = [&](char32_t c) {
    if (chars.empty()) return IsPySpace(c);
    for (size_t pos = 0; pos < chars.size();) {
      size_t len = 0;
      if (CodePointAt(chars, pos, &len) == c) return true;
      pos += len;
    }
    return false;
  };
  const std::vector<size_t> offsets = CodePointOffsets(s);
  size_t lo = 0, hi = offsets.size() - 1;  // code point indices
  if (left) {
    while (lo < hi) {
      size_t len = 0;
      if (!strip_here(CodePointAt(s, offsets[lo], &len))) break;
      ++lo;
    }
  }
  if (right) {
    while (hi > lo) {
      size_t len = 0;
      if (!strip_here(CodePointAt(s, offsets[hi - 1], &len))) break;
      --hi;
    }
  }
  *begin = offsets[lo];
  *end = offsets[hi];
}

}  // namespace dinfer::tokenizer::jinja
