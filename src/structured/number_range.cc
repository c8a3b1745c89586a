#include "structured/number_range.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace dinfer::structured {
namespace {

std::string StripLeadingZeros(std::string s) {
  const size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

// Digit strings without leading zeros.
int CompareDigits(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : (a > b ? 1 : 0);
}

std::string AddOne(std::string s) {
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '9') {
      ++s[i];
      return s;
    }
    s[i] = '0';
  }
  return "1" + s;
}

std::string SubOne(std::string s) {  // s > 0
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      break;
    }
    s[i] = '9';
  }
  return StripLeadingZeros(s);
}

class Builder {
 public:
  Builder(Grammar* g, uint32_t limit) : g_(g), limit_(limit) {}

  ExprId DigitRange(char lo, char hi) { return g_->Bytes({{uint8_t(lo), uint8_t(hi)}}); }
  ExprId AnyDigit() { return DigitRange('0', '9'); }

  // Same-length digit strings (leading zeros allowed) in [a, b].
  ExprId Fixed(std::string_view a, std::string_view b) {
    if (a.empty()) return g_->Empty();
    if (a == b) return g_->Literal(a);
    if (a[0] == b[0]) return g_->Seq({g_->Byte(uint8_t(a[0])), Fixed(a.substr(1), b.substr(1))});
    const size_t rest = a.size() - 1;
    const bool low_all = a.find_first_not_of('0', 1) == std::string_view::npos;
    const bool high_all = b.find_first_not_of('9', 1) == std::string_view::npos;
    if (low_all && high_all) {
      return g_->Seq({DigitRange(a[0], b[0]), g_->Repeat(AnyDigit(), rest, rest)});
    }
    std::vector<ExprId> alts;
    alts.push_back(g_->Seq({g_->Byte(uint8_t(a[0])), Fixed(a.substr(1), std::string(rest, '9'))}));
    if (a[0] + 1 <= b[0] - 1) {
      alts.push_back(g_->Seq(
          {DigitRange(char(a[0] + 1), char(b[0] - 1)), g_->Repeat(AnyDigit(), rest, rest)}));
    }
    alts.push_back(g_->Seq({g_->Byte(uint8_t(b[0])), Fixed(std::string(rest, '0'), b.substr(1))}));
    return g_->Alt(std::move(alts));
  }

  // Non-negative integers (no leading zeros) in [lo, hi]; hi == nullopt: unbounded.
  ExprId UInt(const std::string& lo, const std::optional<std::string>& hi) {
    if (hi && CompareDigits(lo, *hi) > 0) return g_->Nothing();
    std::vector<ExprId> alts;
    const size_t last = hi ? hi->size() : lo.size();
    for (size_t len = lo.size(); len <= last; ++len) {
      const std::string a = len == lo.size() ? lo : "1" + std::string(len - 1, '0');
      const std::string b = hi && len == hi->size() ? *hi : std::string(len, '9');
      alts.push_back(Fixed(a, b));
    }
    if (!hi) {
      alts.push_back(
          g_->Seq({DigitRange('1', '9'),
                   g_->Repeat(AnyDigit(), static_cast<uint32_t>(lo.size()), kUnbounded)}));
    }
    return g_->Alt(std::move(alts));
  }

  // Fraction digits: position pos (0 = first after the point) may hold a significant digit only
  // below the limit; beyond it only zeros.
  ExprId Digit(char lo, char hi, uint32_t pos) {
    if (pos >= limit_) {
      if (lo > '0') return g_->Nothing();
      hi = '0';
    }
    if (lo > hi) return g_->Nothing();
    return DigitRange(lo, hi);
  }
  ExprId AnyTail(uint32_t pos) {
    if (limit_ == kUnbounded) return g_->Star(AnyDigit());
    const uint32_t room = pos >= limit_ ? 0 : limit_ - pos;
    return g_->Seq({g_->Repeat(AnyDigit(), 0, room), g_->Star(g_->Byte('0'))});
  }
  ExprId AnyFraction() {  // ("." digits)?
    return g_->Optional(g_->Seq({g_->Byte('.'), Digit('0', '9', 0), AnyTail(1)}));
  }

  // Nonempty fraction digit strings D (from position pos) with 0.D >= 0.F / > 0.F.
  ExprId Ge1(std::string_view f, uint32_t pos) {
    if (f.empty()) return g_->Seq({Digit('0', '9', pos), AnyTail(pos + 1)});
    return g_->Alt({g_->Seq({Digit(char(f[0] + 1), '9', pos), AnyTail(pos + 1)}),
                    g_->Seq({Digit(f[0], f[0], pos), Ge0(f.substr(1), pos + 1)})});
  }
  ExprId Ge0(std::string_view f, uint32_t pos) { return f.empty() ? AnyTail(pos) : Ge1(f, pos); }
  ExprId Gt1(std::string_view f, uint32_t pos) {
    if (f.empty()) {
      // Some nonzero digit, at a position below the limit.
      if (limit_ == kUnbounded) {
        return g_->Seq({g_->Star(g_->Byte('0')), DigitRange('1', '9'), g_->Star(AnyDigit())});
      }
      std::vector<ExprId> alts;
      for (uint32_t p = pos; p < limit_; ++p) {
        alts.push_back(g_->Seq(
            {g_->Repeat(g_->Byte('0'), p - pos, p - pos), DigitRange('1', '9'), AnyTail(p + 1)}));
      }
      return g_->Alt(std::move(alts));
    }
    return g_->Alt({g_->Seq({Digit(char(f[0] + 1), '9', pos), AnyTail(pos + 1)}),
                    g_->Seq({Digit(f[0], f[0], pos), Gt1(f.substr(1), pos + 1)})});
  }
  // Possibly empty D with 0.D <= 0.F / < 0.F.
  ExprId Le0(std::string_view f, uint32_t pos) {
    if (f.empty()) return g_->Star(g_->Byte('0'));
    return g_->Alt({g_->Empty(), Le1(f, pos)});
  }
  ExprId Le1(std::string_view f, uint32_t pos) {
    if (f.empty()) return g_->Plus(g_->Byte('0'));
    return g_->Alt({g_->Seq({Digit('0', char(f[0] - 1), pos), AnyTail(pos + 1)}),
                    g_->Seq({Digit(f[0], f[0], pos), Le0(f.substr(1), pos + 1)})});
  }
  ExprId Lt0(std::string_view f, uint32_t pos) {
    if (f.empty()) return g_->Nothing();
    return g_->Alt({g_->Empty(), Lt1(f, pos)});
  }
  ExprId Lt1(std::string_view f, uint32_t pos) {
    if (f.empty()) return g_->Nothing();
    return g_->Alt({g_->Seq({Digit('0', char(f[0] - 1), pos), AnyTail(pos + 1)}),
                    g_->Seq({Digit(f[0], f[0], pos), Lt0(f.substr(1), pos + 1)})});
  }

  // Nonempty D with F <(=) 0.D <(=) G, 0.F <= 0.G.
  ExprId Between1(std::string_view f, std::string_view gd, bool lo_ex, bool hi_ex, uint32_t pos) {
    if (gd.empty()) {
      // The upper bound is .000...: only zeros, if the lower bound allows zero.
      return f.empty() && !lo_ex && !hi_ex ? g_->Plus(g_->Byte('0')) : g_->Nothing();
    }
    const char f0 = f.empty() ? '0' : f[0];
    const char g0 = gd[0];
    const std::string_view fr = f.empty() ? f : f.substr(1);
    const std::string_view gr = gd.substr(1);
    if (f0 == g0) return g_->Seq({Digit(f0, f0, pos), Between0(fr, gr, lo_ex, hi_ex, pos + 1)});
    std::vector<ExprId> alts;
    alts.push_back(g_->Seq({Digit(char(f0 + 1), char(g0 - 1), pos), AnyTail(pos + 1)}));
    alts.push_back(g_->Seq({Digit(f0, f0, pos), lo_ex ? Gt1(fr, pos + 1) : Ge0(fr, pos + 1)}));
    alts.push_back(g_->Seq({Digit(g0, g0, pos), hi_ex ? Lt0(gr, pos + 1) : Le0(gr, pos + 1)}));
    return g_->Alt(std::move(alts));
  }
  ExprId Between0(std::string_view f, std::string_view gd, bool lo_ex, bool hi_ex, uint32_t pos) {
    const bool empty_ok = f.empty() && !lo_ex && (!gd.empty() || !hi_ex);
    return g_->Alt({empty_ok ? g_->Empty() : g_->Nothing(), Between1(f, gd, lo_ex, hi_ex, pos)});
  }

  // Non-negative decimals within [lo, hi] (hi optional).
  ExprId Magnitude(const Decimal& lo, bool lo_ex, const std::optional<Decimal>& hi, bool hi_ex) {
    if (hi) {
      const int c = Decimal::Compare(lo, *hi);
      if (c > 0 || (c == 0 && (lo_ex || hi_ex))) return g_->Nothing();
    }
    auto point = [&](ExprId digits) { return g_->Seq({g_->Byte('.'), digits}); };
    const std::string& a = lo.int_digits;
    if (hi && hi->int_digits == a) {
      const bool empty_ok =
          lo.frac_digits.empty() && !lo_ex && (!hi->frac_digits.empty() || !hi_ex);
      return g_->Seq(
          {g_->Literal(a),
           g_->Alt({empty_ok ? g_->Empty() : g_->Nothing(),
                    point(Between1(lo.frac_digits, hi->frac_digits, lo_ex, hi_ex, 0))})});
    }
    std::vector<ExprId> alts;
    ExprId low_frac;
    if (lo_ex) {
      low_frac = point(Gt1(lo.frac_digits, 0));
    } else if (lo.frac_digits.empty()) {
      low_frac = AnyFraction();
    } else {
      low_frac = point(Ge1(lo.frac_digits, 0));
    }
    alts.push_back(g_->Seq({g_->Literal(a), low_frac}));
    const std::string next = AddOne(a);
    if (!hi) {
      alts.push_back(g_->Seq({UInt(next, std::nullopt), AnyFraction()}));
    } else {
      const std::string& b = hi->int_digits;
      if (CompareDigits(next, b) < 0)
        alts.push_back(g_->Seq({UInt(next, SubOne(b)), AnyFraction()}));
      ExprId high_frac;
      if (hi_ex) {
        high_frac = hi->frac_digits.empty()
                        ? g_->Nothing()
                        : g_->Alt({g_->Empty(), point(Lt1(hi->frac_digits, 0))});
      } else {
        high_frac = g_->Alt({g_->Empty(), point(Le1(hi->frac_digits, 0))});
      }
      alts.push_back(g_->Seq({g_->Literal(b), high_frac}));
    }
    return g_->Alt(std::move(alts));
  }

 private:
  Grammar* g_;
  uint32_t limit_;
};

// Integer bounds: ceil(min), floor(max), adjusted for exclusivity.
struct IntBound {
  bool negative = false;
  std::string digits;  // magnitude
};

IntBound Ceil(const Decimal& d, bool exclusive) {
  IntBound b{d.negative, d.int_digits};
  if (!d.IsInteger()) {
    if (!d.negative) b.digits = AddOne(b.digits);
  } else if (exclusive) {
    if (d.negative) {
      b.digits = SubOne(b.digits);
    } else {
      b.digits = AddOne(b.digits);
    }
  }
  if (b.digits == "0") b.negative = false;
  return b;
}

IntBound Floor(const Decimal& d, bool exclusive) {
  IntBound b{d.negative, d.int_digits};
  if (!d.IsInteger()) {
    if (d.negative) b.digits = AddOne(b.digits);
  } else if (exclusive) {
    if (d.negative || d.IsZero()) {
      b.negative = true;
      b.digits = d.IsZero() ? "1" : AddOne(b.digits);
    } else {
      b.digits = SubOne(b.digits);
    }
  }
  if (b.digits == "0") b.negative = false;
  return b;
}

}  // namespace

std::optional<Decimal> Decimal::Parse(std::string_view text) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string digits;
  int64_t point = -1;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.');
       ++i) {
    if (text[i] == '.') {
      if (point >= 0) return std::nullopt;
      point = static_cast<int64_t>(digits.size());
    } else {
      digits.push_back(text[i]);
    }
  }
  if (digits.empty()) return std::nullopt;
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) neg = text[i++] == '-';
    int64_t e = 0;
    if (i >= text.size()) return std::nullopt;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
      e = e * 10 + (text[i] - '0');
      if (e > 4000) return std::nullopt;
    }
    point += neg ? -e : e;
  }
  if (i != text.size()) return std::nullopt;
  if (point < 0) {
    digits.insert(0, static_cast<size_t>(-point), '0');
    point = 0;
  }
  if (point > static_cast<int64_t>(digits.size())) digits.append(point - digits.size(), '0');
  d.int_digits = StripLeadingZeros(digits.substr(0, point));
  d.frac_digits = digits.substr(point);
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  if (d.IsZero()) d.negative = false;
  return d;
}

int Decimal::Compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int c = CompareDigits(a.int_digits, b.int_digits);
  if (c == 0) c = a.frac_digits < b.frac_digits ? -1 : (a.frac_digits > b.frac_digits ? 1 : 0);
  return a.negative ? -c : c;
}

std::string Decimal::ToString() const {
  return (negative ? "-" : "") + int_digits + (frac_digits.empty() ? "" : "." + frac_digits);
}

ExprId IntegerExpr(const NumberBounds& bounds, Grammar* g) {
  Builder b(g, kUnbounded);
  std::optional<IntBound> lo, hi;
  if (bounds.min) lo = Ceil(*bounds.min, bounds.min_exclusive);
  if (bounds.max) hi = Floor(*bounds.max, bounds.max_exclusive);
  if (!lo && !hi) {
    return g->Seq(
        {g->Optional(g->Byte('-')),
         g->Alt({g->Byte('0'), g->Seq({b.DigitRange('1', '9'), g->Star(b.AnyDigit())})})});
  }
  std::vector<ExprId> alts;
  // Non-negative part: [max(lo, 0), hi].
  if (!hi || !hi->negative) {
    const std::string from = lo && !lo->negative ? lo->digits : "0";
    alts.push_back(b.UInt(from, hi ? std::optional<std::string>(hi->digits) : std::nullopt));
  }
  // Negative part: magnitudes in [max(-hi, 1), -lo].
  if (!lo || lo->negative) {
    const std::string from = hi && hi->negative ? hi->digits : "1";
    alts.push_back(g->Seq(
        {g->Byte('-'), b.UInt(from, lo ? std::optional<std::string>(lo->digits) : std::nullopt)}));
  }
  return g->Alt(std::move(alts));
}

ExprId NumberExpr(const NumberBounds& bounds, Grammar* g) {
  Builder b(g, bounds.max_fraction_digits);
  const ExprId int_part =
      g->Alt({g->Byte('0'), g->Seq({b.DigitRange('1', '9'), g->Star(b.AnyDigit())})});
  if (!bounds.min && !bounds.max) {
    std::vector<ExprId> parts = {g->Optional(g->Byte('-')), int_part, b.AnyFraction()};
    if (bounds.max_fraction_digits == kUnbounded) {
      parts.push_back(g->Optional(
          g->Seq({g->Bytes({{'e', 'e'}, {'E', 'E'}}),
                  g->Optional(g->Bytes({{'+', '+'}, {'-', '-'}})), g->Plus(b.AnyDigit())})));
    }
    return g->Seq(std::move(parts));
  }
  const Decimal zero;
  std::vector<ExprId> alts;
  // Non-negative part.
  if (!bounds.max || !bounds.max->negative) {
    const bool from_min = bounds.min && !bounds.min->negative;
    alts.push_back(b.Magnitude(from_min ? *bounds.min : zero, from_min && bounds.min_exclusive,
                               bounds.max, bounds.max_exclusive));
  }
  // Negative part: magnitudes in (max(-max, 0), -min], never zero.
  if (!bounds.min || bounds.min->negative) {
    Decimal lo = zero;
    bool lo_ex = true;
    if (bounds.max && bounds.max->negative) {
      lo = *bounds.max;
      lo.negative = false;
      lo_ex = bounds.max_exclusive;
    }
    std::optional<Decimal> hi;
    if (bounds.min) {
      hi = *bounds.min;
      hi->negative = false;
    }
    alts.push_back(g->Seq({g->Byte('-'), b.Magnitude(lo, lo_ex, hi, bounds.min_exclusive)}));
  }
  return g->Alt(std::move(alts));
}

}  // namespace dinfer::structured
