// JSON numbers within bounds, as grammar expressions: JSON Schema's minimum / maximum /
// exclusiveMinimum / exclusiveMaximum on integers and numbers, and multipleOf 10^-d (a limit on
// significant fraction digits). Bounds are exact decimals (from the schema's JSON text), so
// 0.1 means 0.1, not the nearest double. Bounded numbers are spelled without exponent and without
// "-0"; unbounded ones as JSON allows. Plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace dinfer::structured {

// A finite decimal: sign, integer digits without leading zeros ("0" for zero), fraction digits
// without trailing zeros.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;

  // Parses JSON number text ("-12.50", "1e3", "2.5E-2").
  static std::optional<Decimal> Parse(std::string_view text);
  bool IsZero() const { return int_digits == "0" && frac_digits.empty(); }
  bool IsInteger() const { return frac_digits.empty(); }
  // -1, 0, 1.
  static int Compare(const Decimal& a, const Decimal& b);
  std::string ToString() const;
};

struct NumberBounds {
  std::optional<Decimal> min, max;
  bool min_exclusive = false, max_exclusive = false;
  // Digits allowed after the decimal point before only zeros follow (multipleOf 10^-d);
  // kUnbounded: any. Integers ignore it.
  uint32_t max_fraction_digits = kUnbounded;
};

// Integers (no fraction, no exponent) within the bounds; Nothing when none.
ExprId IntegerExpr(const NumberBounds& bounds, Grammar* g);
// Numbers within the bounds; Nothing when none.
ExprId NumberExpr(const NumberBounds& bounds, Grammar* g);

}  // namespace dinfer::structured
