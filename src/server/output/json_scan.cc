#include "server/output/json_scan.h"

#include <algorithm>
#include <cstdio>

namespace dinfer::output {
namespace {

bool IsScalarChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
         c == '+' || c == '.';
}

void AppendUtf8(unsigned cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool IsJsonSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t PartialSuffix(std::string_view text, std::string_view literal) {
  for (size_t n = std::min(text.size(), literal.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == literal.substr(0, n)) return n;
  }
  return 0;
}

JsonValueScanner::Step JsonValueScanner::Feed(char c) {
  if (complete_) return Step::kEnded;
  if (kind_ == 0) {
    if (c == '{' || c == '[') {
      stack_.push_back(c);
    } else if (c == '"') {
      in_string_ = true;
    } else if (IsScalarChar(c)) {
      scalar_ = true;
    } else {
      return Step::kError;
    }
    kind_ = c;
    return Step::kTaken;
  }
  if (scalar_) {
    if (IsScalarChar(c)) return Step::kTaken;
    scalar_ = false;
    complete_ = true;
    return Step::kEnded;
  }
  if (in_string_) {
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (stack_.empty()) complete_ = true;
    }
    return Step::kTaken;
  }
  switch (c) {
    case '"':
      in_string_ = true;
      break;
    case '{':
    case '[':
      stack_.push_back(c);
      break;
    case '}':
    case ']':
      if (stack_.empty() || stack_.back() != (c == '}' ? '{' : '[')) return Step::kError;
      stack_.pop_back();
      if (stack_.empty()) complete_ = true;
      break;
    default:
      if (!IsScalarChar(c) && !IsJsonSpace(c) && c != ',' && c != ':') return Step::kError;
  }
  return Step::kTaken;
}

std::string JsonStringDecoder::Push(std::string_view raw) {
  pending_.append(raw);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const char c = pending_[i];
    if (c != '\\') {
      if (high_surrogate_) {
        AppendUtf8(0xFFFD, &out);
        high_surrogate_ = 0;
      }
      out += c;
      ++i;
      continue;
    }
    if (i + 1 >= pending_.size()) break;
    const char e = pending_[i + 1];
    if (e != 'u') {
      if (high_surrogate_) {
        AppendUtf8(0xFFFD, &out);
        high_surrogate_ = 0;
      }
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        default:
          out.append(pending_, i, 2);
      }
      i += 2;
      continue;
    }
    if (i + 6 > pending_.size()) break;
    unsigned cp = 0;
    bool hex = true;
    for (size_t k = i + 2; k < i + 6; ++k) {
      const int v = HexValue(pending_[k]);
      hex = hex && v >= 0;
      cp = cp * 16 + static_cast<unsigned>(v < 0 ? 0 : v);
    }
    if (!hex) {
      out.append(pending_, i, 6);
    } else if (cp >= 0xD800 && cp < 0xDC00) {
      if (high_surrogate_) AppendUtf8(0xFFFD, &out);
      high_surrogate_ = cp;
    } else if (cp >= 0xDC00 && cp < 0xE000) {
      AppendUtf8(
          high_surrogate_ ? 0x10000 + ((high_surrogate_ - 0xD800) << 10) + (cp - 0xDC00) : 0xFFFD,
          &out);
      high_surrogate_ = 0;
    } else {
      if (high_surrogate_) AppendUtf8(0xFFFD, &out);
      high_surrogate_ = 0;
      AppendUtf8(cp, &out);
    }
    i += 6;
  }
  pending_.erase(0, i);
  return out;
}

std::string JsonStringDecoder::Finish() {
  std::string out;
  if (high_surrogate_) AppendUtf8(0xFFFD, &out);
  high_surrogate_ = 0;
  out += pending_;
  pending_.clear();
  return out;
}

}  // namespace dinfer::output
