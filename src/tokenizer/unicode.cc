#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

namespace dinfer::tokenizer {
namespace {

struct CombiningClassRange {
  char32_t first, last;
  uint8_t ccc;
};
struct DecompositionEntry {
  char32_t code_point;
  uint16_t offset;  // into kDecompositionPool
  uint8_t length;
};
struct CompositionEntry {
  char32_t first, second, composite;
};

#include "tokenizer/unicode_tables.inc"

constexpr char32_t kMaxCodePoint = 0x10FFFF;
// An ill-formed byte b travels through NFC as the pseudo code point kRawByteBase + b.
constexpr char32_t kRawByteBase = 0x110000;

// Hangul syllables compose and decompose algorithmically.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t CombiningClass(char32_t c) {
  auto it = std::upper_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), c,
                             [](char32_t v, const CombiningClassRange& r) { return v < r.first; });
  if (it == std::begin(kCombiningClasses)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

const DecompositionEntry* FindDecomposition(char32_t c) {
  auto it =
      std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                       [](const DecompositionEntry& e, char32_t v) { return e.code_point < v; });
  return it != std::end(kDecompositions) && it->code_point == c ? it : nullptr;
}

char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions),
                             std::pair<char32_t, char32_t>(a, b),
                             [](const CompositionEntry& e, std::pair<char32_t, char32_t> v) {
                               return e.first != v.first ? e.first < v.first : e.second < v.second;
                             });
  if (it != std::end(kCompositions) && it->first == a && it->second == b) return it->composite;
  return 0;
}

// Code points that can make a string non-NFC: non-zero combining class, decomposable but never
// produced by composition (NFC_QC=No), or able to compose with what precedes them (NFC_QC=Maybe).
class NfcSuspects {
 public:
  NfcSuspects() : bits_((kMaxCodePoint + 64) / 64, 0) {
    for (const auto& r : kCombiningClasses) {
      for (char32_t c = r.first; c <= r.last; ++c) Set(c);
    }
    std::vector<char32_t> composites;
    for (const auto& e : kCompositions) {
      Set(e.second);
      composites.push_back(e.composite);
    }
    std::sort(composites.begin(), composites.end());
    for (const auto& d : kDecompositions) {
      if (!std::binary_search(composites.begin(), composites.end(), d.code_point)) {
        Set(d.code_point);
      }
    }
    for (char32_t c = kVBase; c < kVBase + kVCount; ++c) Set(c);
    for (char32_t c = kTBase + 1; c < kTBase + kTCount; ++c) Set(c);
  }
  bool Contains(char32_t c) const { return (bits_[c >> 6] >> (c & 63)) & 1; }

 private:
  void Set(char32_t c) { bits_[c >> 6] |= uint64_t{1} << (c & 63); }
  std::vector<uint64_t> bits_;
};

const NfcSuspects& Suspects() {
  static const NfcSuspects suspects;
  return suspects;
}

void Decompose(char32_t c, std::vector<char32_t>* out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (c <= kMaxCodePoint) {
    if (const DecompositionEntry* d = FindDecomposition(c)) {
      out->insert(out->end(), kDecompositionPool + d->offset,
                  kDecompositionPool + d->offset + d->length);
      return;
    }
  }
  out->push_back(c);
}

uint8_t ClassOf(char32_t c) { return c > kMaxCodePoint ? 0 : CombiningClass(c); }

}  // namespace

Utf8Char DecodeUtf8(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const size_t avail = text.size() - pos;
  const uint8_t b0 = s[0];
  if (b0 < 0x80) return {b0, 1, Utf8Status::kValid};
  uint32_t need;
  char32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 1, Utf8Status::kInvalid};
  }
  for (uint32_t i = 1; i <= need; ++i) {
    if (i >= avail) return {0, i, Utf8Status::kIncomplete};
    const uint8_t b = s[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {0, i, Utf8Status::kInvalid};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, Utf8Status::kValid};
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Char ch = DecodeUtf8(bytes, pos);
    if (ch.status == Utf8Status::kValid) {
      out.append(bytes.data() + pos, ch.length);
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    pos += ch.length;
  }
  return out;
}

bool IsWhitespace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool NormalizeNfc(std::string_view text, std::string* out) {
  const NfcSuspects& suspects = Suspects();
  bool suspect = false;
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Char ch = DecodeUtf8(text, pos);
    pos += ch.length;
    if (ch.status == Utf8Status::kValid && suspects.Contains(ch.code_point)) {
      suspect = true;
      break;
    }
  }
  if (!suspect) return false;

  std::vector<char32_t> chars;
  chars.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char ch = DecodeUtf8(text, pos);
    if (ch.status == Utf8Status::kValid) {
      Decompose(ch.code_point, &chars);
    } else {
      for (uint32_t i = 0; i < ch.length; ++i) {
        chars.push_back(kRawByteBase + static_cast<uint8_t>(text[pos + i]));
      }
    }
    pos += ch.length;
  }
  // Canonical ordering: a stable sort by combining class within each run of non-starters.
  std::vector<uint8_t> classes(chars.size());
  for (size_t i = 0; i < chars.size(); ++i) classes[i] = ClassOf(chars[i]);
  for (size_t i = 1; i < chars.size(); ++i) {
    for (size_t j = i; j > 0 && classes[j] != 0 && classes[j - 1] > classes[j]; --j) {
      std::swap(chars[j], chars[j - 1]);
      std::swap(classes[j], classes[j - 1]);
    }
  }
  // Canonical composition: each character joins the last starter unless something between them
  // blocks it (a starter, or a mark of the same or a higher class).
  size_t kept = 0;
  ptrdiff_t starter = -1;
  uint8_t last_class = 0;
  for (size_t i = 0; i < chars.size(); ++i) {
    const char32_t c = chars[i];
    const uint8_t cls = classes[i];
    if (starter >= 0 && c <= kMaxCodePoint &&
        (static_cast<size_t>(starter) + 1 == kept || (last_class != 0 && last_class < cls))) {
      if (const char32_t composite = Compose(chars[starter], c)) {
        chars[starter] = composite;
        continue;
      }
    }
    if (cls == 0) starter = c <= kMaxCodePoint ? static_cast<ptrdiff_t>(kept) : -1;
    last_class = cls;
    chars[kept] = c;
    classes[kept] = cls;
    ++kept;
  }
  out->clear();
  out->reserve(text.size());
  for (size_t i = 0; i < kept; ++i) {
    if (chars[i] > kMaxCodePoint) {
      out->push_back(static_cast<char>(chars[i] - kRawByteBase));
    } else {
      AppendUtf8(chars[i], out);
    }
  }
  return true;
}

}  // namespace dinfer::tokenizer
