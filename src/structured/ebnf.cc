#include "structured/ebnf.h"

#include <cctype>
#include <map>
#include <string>
#include <vector>

namespace dinfer::structured {
namespace {

// A parsed term: either a set of characters (which W3C's `-` can subtract) or an expression.
struct Term {
  ExprId expr = -1;
  bool is_set = false;
  Ranges set;
};

Term ExprTerm(ExprId e) {
  Term t;
  t.expr = e;
  return t;
}
Term SetTerm(ExprId e, Ranges set) {
  Term t;
  t.expr = e;
  t.is_set = true;
  t.set = std::move(set);
  return t;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  StatusOr<Grammar> Parse() {
    // Declare every rule first, so that references may come before definitions.
    std::vector<std::pair<std::string, size_t>> heads;
    for (SkipSpace(); !AtEnd(); SkipSpace()) {
      const size_t at = pos_;
      const std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (!EatDefine()) return Error("expected '::=' after '" + name + "'");
      if (rules_.contains(name)) return Error("rule '" + name + "' is defined twice");
      rules_[name] = g_.AddRule(name);
      heads.emplace_back(name, at);
      DINFER_RETURN_IF_ERROR(SkipBody());
    }
    if (heads.empty()) return InvalidArgument("the grammar has no rules");
    for (const auto& [name, at] : heads) {
      pos_ = at;
      Name();
      SkipSpace();
      EatDefine();
      DINFER_ASSIGN_OR_RETURN(ExprId body, Alternatives());
      g_.SetBody(rules_[name], body);
    }
    for (const auto& [name, id] : rules_) {
      if (g_.rule(id).body < 0) return InvalidArgument("rule '{}' is not defined", name);
    }
    g_.set_root(rules_.contains("root") ? rules_["root"] : rules_[heads[0].first]);
    return std::move(g_);
  }

 private:
  Status Error(const std::string& what) const {
    size_t line = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
    return InvalidArgument("grammar line {}: {}", line, what);
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '#' &&
                 !(Peek(1) == 'x' && std::isxdigit(static_cast<unsigned char>(Peek(2))))) {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else if (c == '/' && Peek(1) == '*') {
        const size_t end = s_.find("*/", pos_ + 2);
        pos_ = end == std::string_view::npos ? s_.size() : end + 2;
      } else {
        break;
      }
    }
  }
  static bool NameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  }
  std::string Name() {
    const size_t start = pos_;
    if (AtEnd() || !(std::isalpha(static_cast<unsigned char>(Peek())) || Peek() == '_')) return "";
    while (!AtEnd() && NameChar(Peek())) ++pos_;
    // A trailing '-' belongs to the operator after the name.
    while (pos_ > start + 1 && s_[pos_ - 1] == '-') --pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  bool EatDefine() {
    if (s_.substr(pos_).starts_with("::=")) {
      pos_ += 3;
      return true;
    }
    return false;
  }
  // Whether a rule definition starts here (name followed by ::=).
  bool AtRuleHead() {
    const size_t save = pos_;
    const bool head = !Name().empty() && (SkipSpace(), EatDefine());
    pos_ = save;
    return head;
  }
  Status SkipBody() {
    // Bodies end where the next `name ::=` starts; strings and classes may contain anything.
    while (true) {
      SkipSpace();
      if (AtEnd() || AtRuleHead()) return OkStatus();
      const char c = Peek();
      if (c == '"' || c == '\'') {
        DINFER_RETURN_IF_ERROR(StringLiteral().status());
      } else if (c == '[') {
        DINFER_RETURN_IF_ERROR(CharClass().status());
      } else {
        ++pos_;
      }
    }
  }

  StatusOr<ExprId> Alternatives() {
    std::vector<ExprId> alts;
    while (true) {
      DINFER_ASSIGN_OR_RETURN(ExprId seq, Sequence());
      alts.push_back(seq);
      SkipSpace();
      if (Peek() != '|') break;
      ++pos_;
    }
    return alts.size() == 1 ? alts[0] : g_.Alt(std::move(alts));
  }

  StatusOr<ExprId> Sequence() {
    std::vector<ExprId> parts;
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')' || AtRuleHead()) break;
      DINFER_ASSIGN_OR_RETURN(Term t, Difference());
      parts.push_back(t.expr);
    }
    return g_.Seq(std::move(parts));
  }

  // W3C's A - B, between character sets.
  StatusOr<Term> Difference() {
    DINFER_ASSIGN_OR_RETURN(Term left, Postfix());
    while (true) {
      const size_t save = pos_;
      SkipSpace();
      if (Peek() != '-' || Peek(1) == '>') {
        pos_ = save;
        return left;
      }
      ++pos_;
      SkipSpace();
      DINFER_ASSIGN_OR_RETURN(Term right, Postfix());
      if (!left.is_set || !right.is_set) {
        return Unimplemented("grammar: 'A - B' is only supported between character sets");
      }
      left.set = IntersectRanges(left.set, ComplementCodepoints(right.set));
      left.expr = g_.Chars(left.set, CharEncoding::kUtf8);
    }
  }

  StatusOr<Term> Postfix() {
    DINFER_ASSIGN_OR_RETURN(Term t, Primary());
    while (!AtEnd()) {
      const char c = Peek();
      uint32_t min = 0, max = 0;
      if (c == '*') {
        min = 0, max = kUnbounded;
      } else if (c == '+') {
        min = 1, max = kUnbounded;
      } else if (c == '?') {
        min = 0, max = 1;
      } else if (c == '{') {
        DINFER_RETURN_IF_ERROR(Braces(&min, &max));
        t = ExprTerm(g_.Repeat(t.expr, min, max));
        continue;
      } else {
        break;
      }
      ++pos_;
      t = ExprTerm(g_.Repeat(t.expr, min, max));
    }
    return t;
  }

  Status Braces(uint32_t* min, uint32_t* max) {
    ++pos_;
    auto number = [&](uint32_t* v) {
      SkipSpace();
      const size_t start = pos_;
      uint64_t x = 0;
      while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) {
        x = std::min<uint64_t>(x * 10 + static_cast<uint64_t>(Peek() - '0'), 1'000'000);
        ++pos_;
      }
      *v = static_cast<uint32_t>(x);
      return pos_ > start;
    };
    const bool has_min = number(min);
    if (!has_min) *min = 0;
    SkipSpace();
    if (Peek() == ',') {
      ++pos_;
      if (!number(max)) *max = kUnbounded;
    } else {
      if (!has_min) return Error("bad repetition {}");
      *max = *min;
    }
    SkipSpace();
    if (Peek() != '}') return Error("expected '}'");
    ++pos_;
    if (*min > *max) return Error("repetition {m,n} with m > n");
    return OkStatus();
  }

  StatusOr<Term> Primary() {
    const char c = Peek();
    if (c == '(') {
      ++pos_;
      DINFER_ASSIGN_OR_RETURN(ExprId inner, Alternatives());
      SkipSpace();
      if (Peek() != ')') return Error("expected ')'");
      ++pos_;
      return ExprTerm(inner);
    }
    if (c == '"' || c == '\'') {
      DINFER_ASSIGN_OR_RETURN(std::string bytes, StringLiteral());
      return ExprTerm(g_.Literal(bytes));
    }
    if (c == '[') {
      DINFER_ASSIGN_OR_RETURN(Ranges set, CharClass());
      return SetTerm(g_.Chars(set, CharEncoding::kUtf8), set);
    }
    if (c == '.') {
      ++pos_;
      const Ranges all = ComplementCodepoints({});
      return SetTerm(g_.Chars(all, CharEncoding::kUtf8), all);
    }
    if (c == '#' && Peek(1) == 'x') {
      pos_ += 2;
      DINFER_ASSIGN_OR_RETURN(uint32_t cp, Hex(8, true));
      return SetTerm(g_.Chars({{cp, cp}}, CharEncoding::kUtf8), {{cp, cp}});
    }
    const std::string name = Name();
    if (name.empty()) return Error(std::string("unexpected '") + c + "'");
    auto it = rules_.find(name);
    if (it == rules_.end()) return InvalidArgument("grammar: rule '{}' is not defined", name);
    return ExprTerm(g_.Ref(it->second));
  }

  // Up to `max` hex digits (exactly `max` unless `up_to`).
  StatusOr<uint32_t> Hex(int max, bool up_to) {
    uint32_t v = 0;
    int n = 0;
    while (n < max && std::isxdigit(static_cast<unsigned char>(Peek()))) {
      const char c = s_[pos_++];
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                             ? c - '0'
                                             : (c | 0x20) - 'a' + 10);
      ++n;
    }
    if (n == 0 || (!up_to && n != max) || v > kMaxCodepoint) return Error("bad hex escape");
    return v;
  }

  // One character of a string or class, with escapes; the code point. Classes also take W3C's
  // #xN characters.
  StatusOr<uint32_t> Char(bool in_class) {
    if (AtEnd()) return Error("unterminated string or class");
    if (Peek() == '\\') {
      ++pos_;
      const char e = s_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'f':
          return '\f';
        case 'v':
          return '\v';
        case '0':
          return 0;
        case 'x':
          return Hex(2, false);
        case 'u':
          return Hex(4, false);
        case 'U':
          return Hex(8, false);
        default:
          return static_cast<uint32_t>(static_cast<uint8_t>(e));
      }
    }
    if (in_class && Peek() == '#' && Peek(1) == 'x' &&
        std::isxdigit(static_cast<unsigned char>(Peek(2)))) {
      pos_ += 2;
      return Hex(8, true);
    }
    std::string_view rest = s_.substr(pos_);
    const int32_t cp = DecodeUtf8(&rest);
    if (cp < 0) return Error("invalid UTF-8");
    pos_ = s_.size() - rest.size();
    return static_cast<uint32_t>(cp);
  }

  StatusOr<std::string> StringLiteral() {
    const char quote = s_[pos_++];
    std::string out;
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      if (Peek() == quote) {
        ++pos_;
        return out;
      }
      if (quote == '\'' && Peek() == '\\') {
        // W3C strings have no escapes.
        out.push_back(s_[pos_++]);
        continue;
      }
      const bool hex_byte = Peek() == '\\' && Peek(1) == 'x';
      DINFER_ASSIGN_OR_RETURN(uint32_t cp, Char(false));
      if (hex_byte) {
        out.push_back(static_cast<char>(cp));  // \xHH is a raw byte
      } else {
        AppendUtf8(cp, &out);
      }
    }
  }

  StatusOr<Ranges> CharClass() {
    ++pos_;  // [
    const bool negate = Peek() == '^';
    if (negate) ++pos_;
    Ranges set;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      DINFER_ASSIGN_OR_RETURN(uint32_t lo, Char(true));
      uint32_t hi = lo;
      if (Peek() == '-' && Peek(1) != ']') {
        ++pos_;
        DINFER_ASSIGN_OR_RETURN(hi, Char(true));
        if (hi < lo) return Error("class range out of order");
      }
      set.emplace_back(lo, hi);
    }
    set = NormalizeRanges(std::move(set));
    return negate ? ComplementCodepoints(set) : set;
  }

  std::string_view s_;
  size_t pos_ = 0;
  Grammar g_;
  std::map<std::string, RuleId> rules_;
};

}  // namespace

StatusOr<Grammar> EbnfToGrammar(std::string_view text) { return Parser(text).Parse(); }

Grammar ChoiceGrammar(const std::vector<std::string>& choices) {
  Grammar g;
  std::vector<ExprId> alts;
  for (const auto& c : choices) alts.push_back(g.Literal(c));
  g.set_root(g.DefineRule("root", g.Alt(std::move(alts))));
  return g;
}

}  // namespace dinfer::structured
