#include "structured/grammar.h"

#include <algorithm>

#include <fmt/format.h>

namespace dinfer::structured {

Ranges NormalizeRanges(Ranges ranges) {
  std::sort(ranges.begin(), ranges.end());
  Ranges out;
  for (const auto& [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!out.empty() && (out.back().second == kUnbounded || lo <= out.back().second + 1)) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges ComplementCodepoints(const Ranges& ranges) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : NormalizeRanges(ranges)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
    if (hi >= kMaxCodepoint) break;
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  // Surrogates are not characters: no string holds them.
  return IntersectRanges(out, {{0, 0xD7FF}, {0xE000, kMaxCodepoint}});
}

Ranges UnionRanges(const Ranges& a, const Ranges& b) {
  Ranges all = a;
  all.insert(all.end(), b.begin(), b.end());
  return NormalizeRanges(std::move(all));
}

Ranges IntersectRanges(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

namespace {

Expr Make(Expr::Kind kind) {
  Expr e;
  e.kind = kind;
  return e;
}

}  // namespace

ExprId Grammar::Add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId Grammar::Empty() {
  if (empty_ < 0) empty_ = Add(Make(Expr::Kind::kEmpty));
  return empty_;
}

ExprId Grammar::Nothing() {
  if (nothing_ < 0) nothing_ = Add(Make(Expr::Kind::kNothing));
  return nothing_;
}

ExprId Grammar::Byte(uint8_t b, ByteMark mark) { return Bytes({{b, b}}, mark); }

ExprId Grammar::Bytes(Ranges ranges, ByteMark mark) {
  ranges = NormalizeRanges(std::move(ranges));
  if (ranges.empty()) return Nothing();
  Expr e = Make(Expr::Kind::kBytes);
  e.mark = mark;
  e.ranges = std::move(ranges);
  return Add(std::move(e));
}

ExprId Grammar::Literal(std::string_view bytes) {
  std::vector<ExprId> parts;
  parts.reserve(bytes.size());
  for (char c : bytes) parts.push_back(Byte(static_cast<uint8_t>(c)));
  return Seq(std::move(parts));
}

ExprId Grammar::Chars(Ranges codepoints, CharEncoding encoding) {
  codepoints = IntersectRanges(NormalizeRanges(std::move(codepoints)),
                               {{0, 0xD7FF}, {0xE000, kMaxCodepoint}});
  if (codepoints.empty()) return Nothing();
  Expr e = Make(Expr::Kind::kChars);
  e.encoding = encoding;
  e.ranges = std::move(codepoints);
  return Add(std::move(e));
}

ExprId Grammar::Seq(std::vector<ExprId> parts) {
  std::vector<ExprId> flat;
  for (ExprId p : parts) {
    const Expr& e = exprs_[p];
    if (e.kind == Expr::Kind::kNothing) return Nothing();
    if (e.kind == Expr::Kind::kEmpty) continue;
    if (e.kind == Expr::Kind::kSeq) {
      flat.insert(flat.end(), e.kids.begin(), e.kids.end());
    } else {
      flat.push_back(p);
    }
  }
  if (flat.empty()) return Empty();
  if (flat.size() == 1) return flat[0];
  Expr e = Make(Expr::Kind::kSeq);
  e.kids = std::move(flat);
  return Add(std::move(e));
}

ExprId Grammar::Alt(std::vector<ExprId> branches) {
  std::vector<ExprId> flat;
  for (ExprId b : branches) {
    const Expr& e = exprs_[b];
    if (e.kind == Expr::Kind::kNothing) continue;
    if (e.kind == Expr::Kind::kAlt) {
      flat.insert(flat.end(), e.kids.begin(), e.kids.end());
    } else {
      flat.push_back(b);
    }
  }
  if (flat.empty()) return Nothing();
  if (flat.size() == 1) return flat[0];
  Expr e = Make(Expr::Kind::kAlt);
  e.kids = std::move(flat);
  return Add(std::move(e));
}

ExprId Grammar::Repeat(ExprId e, uint32_t min, uint32_t max) {
  if (max < min) return Nothing();
  if (max == 0) return Empty();
  const Expr& x = exprs_[e];
  if (x.kind == Expr::Kind::kEmpty) return Empty();
  if (x.kind == Expr::Kind::kNothing) return min == 0 ? Empty() : Nothing();
  if (min == 1 && max == 1) return e;
  Expr r = Make(Expr::Kind::kRepeat);
  r.min = min;
  r.max = max;
  r.kids = {e};
  return Add(std::move(r));
}

ExprId Grammar::AbsorbingStar(ExprId e) {
  const ExprId r = Star(e);
  if (exprs_[r].kind == Expr::Kind::kRepeat) exprs_[r].absorbing = true;
  return r;
}

ExprId Grammar::Ref(RuleId rule) {
  Expr e = Make(Expr::Kind::kRule);
  e.rule = rule;
  return Add(std::move(e));
}

ExprId Grammar::Dfa(std::shared_ptr<const ByteDfa> dfa) {
  if (dfa->states.empty()) return Nothing();
  Expr e = Make(Expr::Kind::kDfa);
  e.dfa = std::move(dfa);
  return Add(std::move(e));
}

RuleId Grammar::AddRule(std::string name) {
  rules_.push_back(Rule{.name = std::move(name)});
  return static_cast<RuleId>(rules_.size() - 1);
}

void Grammar::SetCounted(RuleId rule, uint32_t min_count, uint32_t max_count) {
  Rule& r = rules_[rule];
  r.counted = true;
  r.min_count = min_count;
  r.max_count = max_count;
}

RuleId Grammar::DefineRule(std::string name, ExprId body) {
  const RuleId id = AddRule(std::move(name));
  SetBody(id, body);
  return id;
}

RuleId Grammar::Import(const Grammar& other, std::string_view prefix) {
  const auto expr_offset = static_cast<ExprId>(exprs_.size());
  const auto rule_offset = static_cast<RuleId>(rules_.size());
  for (const Expr& e : other.exprs_) {
    Expr copy = e;
    for (ExprId& kid : copy.kids) kid += expr_offset;
    if (copy.rule >= 0) copy.rule += rule_offset;
    exprs_.push_back(std::move(copy));
  }
  for (const Rule& r : other.rules_) {
    Rule copy = r;
    copy.name = std::string(prefix) + r.name;
    if (copy.body >= 0) copy.body += expr_offset;
    rules_.push_back(std::move(copy));
  }
  return other.root_ + rule_offset;
}

namespace {

std::string RangeText(uint32_t lo, uint32_t hi, bool bytes) {
  auto one = [&](uint32_t c) -> std::string {
    if (c >= 0x21 && c < 0x7F && c != '\\' && c != ']' && c != '-' && c != '^') {
      return std::string(1, static_cast<char>(c));
    }
    return bytes ? fmt::format("\\x{:02X}", c) : fmt::format("\\u{{{:X}}}", c);
  };
  return lo == hi ? one(lo) : one(lo) + "-" + one(hi);
}

void ExprText(const Grammar& g, ExprId id, std::string* out) {
  const Expr& e = g.expr(id);
  switch (e.kind) {
    case Expr::Kind::kEmpty:
      *out += "\"\"";
      return;
    case Expr::Kind::kNothing:
      *out += "[]";
      return;
    case Expr::Kind::kBytes:
    case Expr::Kind::kChars: {
      const bool bytes = e.kind == Expr::Kind::kBytes;
      *out += bytes ? "[" : (e.encoding == CharEncoding::kUtf8 ? "<" : "<json:");
      for (const auto& [lo, hi] : e.ranges) *out += RangeText(lo, hi, bytes);
      *out += bytes ? "]" : ">";
      if (e.mark == ByteMark::kClose) *out += "!";
      return;
    }
    case Expr::Kind::kSeq:
    case Expr::Kind::kAlt:
      *out += "(";
      for (size_t i = 0; i < e.kids.size(); ++i) {
        if (i) *out += e.kind == Expr::Kind::kSeq ? " " : " | ";
        ExprText(g, e.kids[i], out);
      }
      *out += ")";
      return;
    case Expr::Kind::kRepeat:
      ExprText(g, e.kids[0], out);
      if (e.max == kUnbounded) {
        *out += fmt::format("{{{},}}", e.min);
      } else {
        *out += fmt::format("{{{},{}}}", e.min, e.max);
      }
      return;
    case Expr::Kind::kRule:
      *out += g.rule(e.rule).name;
      return;
    case Expr::Kind::kDfa:
      *out += fmt::format("<automaton: {} states>", e.dfa->states.size());
      return;
  }
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (RuleId r = 0; r < num_rules(); ++r) {
    const Rule& rule = rules_[r];
    out += rule.name;
    if (rule.counted) {
      out += fmt::format(
          " (counts {}..{})", rule.min_count,
          rule.max_count == kUnbounded ? std::string("inf") : std::to_string(rule.max_count));
    }
    out += " ::= ";
    if (rule.body >= 0) ExprText(*this, rule.body, &out);
    out += "\n";
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int32_t DecodeUtf8(std::string_view* s) {
  if (s->empty()) return -1;
  const auto b0 = static_cast<uint8_t>((*s)[0]);
  int len = 0;
  uint32_t cp = 0;
  if (b0 < 0x80) {
    len = 1;
    cp = b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return -1;
  }
  if (s->size() < static_cast<size_t>(len)) return -1;
  for (int i = 1; i < len; ++i) {
    const auto b = static_cast<uint8_t>((*s)[i]);
    if ((b & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  s->remove_prefix(len);
  return static_cast<int32_t>(cp);
}

}  // namespace dinfer::structured
