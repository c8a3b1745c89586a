// Regular expressions in the ECMAScript dialect that JSON Schema `pattern` uses (and that
// `--regex` constraints use): literals, `.`, classes with ranges and negation, the escapes \d \w \s
// (and \D \W \S), \t \n \r \f \v \0 \cX \xHH \uHHHH \u{H..}, quantifiers * + ? {n} {n,} {n,m}
// (lazy forms match the same language), groups (capturing, (?:...), (?<name>...)), alternation and
// the anchors ^ and $ at the start or end of the pattern or of its top-level alternatives.
// Lookarounds, backreferences, word boundaries, Unicode property escapes and anchors elsewhere
// are refused with an error naming the feature. Characters are Unicode code points (the `u`
// flag's semantics). Plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace dinfer::structured {

struct RegexOptions {
  // JSON Schema semantics: the pattern may match anywhere in the string unless anchored.
  // Otherwise the whole text must match (anchors at the ends are allowed and change nothing).
  bool search = false;
  // How matched characters are spelled: UTF-8, or as the contents of a JSON string.
  CharEncoding encoding = CharEncoding::kUtf8;
};

// Adds the pattern's language to `g` and returns its expression.
StatusOr<ExprId> RegexToExpr(std::string_view pattern, const RegexOptions& options, Grammar* g);

// A pattern that is (after anchors, in search mode only when anchored at both ends) one character
// class repeated min..max times, like ^[a-z0-9_]{3,32}$: its class and bounds. JSON strings with
// such patterns become counted rules instead of max unrolled states.
struct ClassRepeat {
  Ranges codepoints;
  uint32_t min = 0, max = kUnbounded;
};
std::optional<ClassRepeat> AsClassRepeat(std::string_view pattern, bool search);

}  // namespace dinfer::structured
