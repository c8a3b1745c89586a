#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "tokenizer/jinja/value.h"
#include "tokenizer/unicode.h"

namespace dinfer::tokenizer::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigitChar(c); }

// Python's str.rstrip() on UTF-8 text.
std::string RStrip(std::string_view s) {
  size_t begin = 0, end = 0;
  StripRange(s, {}, false, true, &begin, &end);
  return std::string(s.substr(0, end));
}

// Whether s is non-empty and all whitespace (Jinja's whitespace_re.fullmatch).
bool AllSpace(std::string_view s) {
  if (s.empty()) return false;
  size_t begin = 0, end = 0;
  StripRange(s, {}, true, false, &begin, &end);
  return begin == s.size();
}

// Python's unicode-escape decoding of a string literal's body (what Jinja's lexer applies).
std::string Unescape(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t digits) {
      uint32_t v = 0;
      for (size_t k = 1; k <= digits; ++k) {
        const char h = i + k < body.size() ? body[i + k] : '\0';
        int d = -1;
        if (h >= '0' && h <= '9') d = h - '0';
        if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
        if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
        if (d < 0) throw TemplateError{"truncated escape sequence in string literal", line};
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > 0x10FFFF) throw TemplateError{"illegal Unicode character in string literal", line};
      i += digits;
      AppendUtf8(static_cast<char32_t>(v), &out);
    };
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
      case '\'':
      case '"':
        out += c;
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t k = 0;
          for (; k < 3 && i + k < body.size() && body[i + k] >= '0' && body[i + k] <= '7'; ++k) {
            v = v * 8 + static_cast<uint32_t>(body[i + k] - '0');
          }
          i += k - 1;
          AppendUtf8(static_cast<char32_t>(v), &out);
        } else {
          out += '\\';  // unknown escapes stay as written
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // \r\n and \r are newlines; one trailing newline is dropped (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      const size_t tag = FindTagStart(pos_);
      if (tag == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                            ? src_[tag + 2]
                            : '\0';
      size_t raw_content = std::string::npos;
      if (kind == '%') raw_content = MatchRawBegin(tag + 2 + (sign ? 1 : 0));
      std::string text = src_.substr(pos_, tag - pos_);
      EmitData(std::move(text), pos_, sign, kind != '{');
      if (raw_content != std::string::npos) {
        LexRaw(raw_content);
      } else if (kind == '#') {
        LexComment(tag);
      } else {
        Emit(kind == '{' ? TokenType::kVariableBegin : TokenType::kBlockBegin, {}, tag);
        pos_ = tag + 2 + (sign ? 1 : 0);
        LexTag(kind == '%');
      }
    }
    Emit(TokenType::kEnd, {}, src_.size());
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  int LineOf(size_t pos) const {
    return static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                            newlines_.begin()) +
           1;
  }

  int ColumnOf(size_t pos) const {
    const auto it = std::lower_bound(newlines_.begin(), newlines_.end(), pos);
    const size_t line_start = it == newlines_.begin() ? 0 : *(it - 1) + 1;
    return static_cast<int>(pos - line_start) + 1;
  }

  [[noreturn]] void Error(size_t pos, std::string message) const {
    throw TemplateError{fmt::format("{} (column {})", message, ColumnOf(pos)), LineOf(pos)};
  }

  void Emit(TokenType type, std::string value, size_t pos) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = LineOf(pos);
    t.column = ColumnOf(pos);
    tokens_.push_back(std::move(t));
  }

  // Text before a tag: `-` strips all whitespace before it; otherwise (lstrip_blocks) spaces
  // between the start of the line and a block or comment tag go.
  void EmitData(std::string text, size_t pos, char sign, bool lstrip) {
    if (sign == '-') {
      text = RStrip(text);
    } else if (sign != '+' && lstrip) {
      const size_t newline = text.rfind('\n');
      const size_t line_pos = newline == std::string::npos ? 0 : newline + 1;
      if ((line_pos > 0 || line_starting_) && AllSpace(std::string_view(text).substr(line_pos))) {
        text.resize(line_pos);
      }
    }
    if (!text.empty()) Emit(TokenType::kData, std::move(text), pos);
  }

  // `{% raw %}` (after the `{%` and its sign at `p`): returns where the raw content starts.
  size_t MatchRawBegin(size_t p) {
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && IsNameChar(src_[p + 3]))) {
      return std::string::npos;
    }
    p += 3;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      return p;
    }
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  void LexRaw(size_t content) {
    line_starting_ = content > 0 && src_[content - 1] == '\n';
    for (size_t i = src_.find("{%", content); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : '\0';
      if (sign) ++p;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      const size_t end = MatchTagEnd(p, /*block=*/true);
      if (end == std::string::npos) continue;
      EmitData(src_.substr(content, i - content), content, sign, true);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    Error(content, "Missing end of raw directive");
  }

  void LexComment(size_t tag) {
    const size_t body = tag + 2 + ((src_[tag + 2] == '-' || src_[tag + 2] == '+') ? 1 : 0);
    for (size_t i = src_.find("#}", body); i != std::string::npos; i = src_.find("#}", i + 1)) {
      size_t end = i + 2;
      if (i > body && src_[i - 1] == '-') {
        while (end < src_.size() && IsSpace(src_[end])) ++end;
      } else if (!(i > body && src_[i - 1] == '+') && end < src_.size() && src_[end] == '\n') {
        ++end;  // trim_blocks
      }
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    Error(tag, "Missing end of comment tag");
  }

  // A tag's closing delimiter at p: returns the position after it (and after the whitespace it
  // eats), or npos.
  size_t MatchTagEnd(size_t p, bool block) const {
    const char* close = block ? "%}" : "}}";
    if (src_.compare(p, 3, std::string("-") + close) == 0) {
      p += 3;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      return p;
    }
    if (block && src_.compare(p, 3, "+%}") == 0) return p + 3;
    if (src_.compare(p, 2, close) == 0) {
      p += 2;
      if (block && p < src_.size() && src_[p] == '\n') ++p;  // trim_blocks
      return p;
    }
    return std::string::npos;
  }

  void LexTag(bool block) {
    std::vector<char> balance;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) Error(pos_, "unexpected end of template, expected end of tag");
      if (balance.empty()) {
        const size_t end = MatchTagEnd(pos_, block);
        if (end != std::string::npos) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, {}, pos_);
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      const char c = src_[pos_];
      if (IsDigitChar(c)) {
        LexNumber();
      } else if (IsNameStart(c)) {
        const size_t start = pos_;
        while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
        Emit(TokenType::kName, src_.substr(start, pos_ - start), start);
      } else if (c == '\'' || c == '"') {
        LexString();
      } else {
        LexOperator(&balance);
      }
    }
  }

  void LexNumber() {
    const size_t start = pos_;
    auto digits = [&]() {
      while (pos_ < src_.size() && (IsDigitChar(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';  // `x.0` is an attribute
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigitChar(src_[pos_ + 1])) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigitChar(src_[p])) {
        pos_ = p;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Emit(is_float ? TokenType::kFloat : TokenType::kInteger, text, start);
    Token& t = tokens_.back();
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (ec != std::errc()) Error(start, "integer literal out of range");
    }
  }

  void LexString() {
    const char quote = src_[pos_];
    const size_t start = pos_;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
    if (p >= src_.size()) Error(start, "unexpected end of string literal");
    Emit(TokenType::kString,
         Unescape(std::string_view(src_).substr(start + 1, p - start - 1), LineOf(start)), start);
    pos_ = p + 1;
  }

  void LexOperator(std::vector<char>* balance) {
    static constexpr const char* kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                                 "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                                 ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
    for (const char* op : kOperators) {
      const size_t len = std::strlen(op);
      if (src_.compare(pos_, len, op) != 0) continue;
      const char c = op[0];
      if (len == 1 && (c == '(' || c == '[' || c == '{')) {
        balance->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (len == 1 && (c == ')' || c == ']' || c == '}')) {
        if (balance->empty()) Error(pos_, fmt::format("unexpected '{}'", c));
        if (balance->back() != c) {
          Error(pos_, fmt::format("unexpected '{}', expected '{}'", c, balance->back()));
        }
        balance->pop_back();
      }
      Emit(TokenType::kOperator, op, pos_);
      pos_ += len;
      return;
    }
    Error(pos_, fmt::format("unexpected char '{}'", src_[pos_]));
  }

  std::string src_;
  std::vector<size_t> newlines_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace dinfer::tokenizer::jinja
