// Grammar: the intermediate representation every constraint is translated to (regex, JSON Schema,
// EBNF, choice lists) before it is compiled into automata. A grammar is a set of named rules, each
// an expression tree over bytes, Unicode character classes and references to other rules.
// Character classes stay code point sets here; they are lowered to UTF-8 (or to the JSON string
// encoding of the characters) when the automaton is built. A Grammar is a plain value: build it on
// one thread, then read it from any.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dinfer::structured {

using ExprId = int32_t;
using RuleId = int32_t;

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Closed intervals [first, second], sorted and disjoint.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorts, merges touching intervals and drops empty ones.
Ranges NormalizeRanges(Ranges ranges);
// All code points (surrogates excluded: they are not characters) minus `ranges`.
Ranges ComplementCodepoints(const Ranges& ranges);
Ranges UnionRanges(const Ranges& a, const Ranges& b);
Ranges IntersectRanges(const Ranges& a, const Ranges& b);

// How the characters of a kChars node are spelled in bytes.
enum class CharEncoding : uint8_t {
  kUtf8,
  // Inside a JSON string: `"`, `\` and control characters only as escapes (\" \\ \n \u001f ...),
  // `/` also as `\/`, every other character as its UTF-8 bytes.
  kJsonString,
  // Like kJsonString, and also any character as a \uXXXX escape (surrogate pairs for the
  // characters above U+FFFF). Used for unconstrained strings.
  kJsonStringAnyEscape,
};

// A small deterministic automaton over bytes embedded in an expression: what regular operations
// the expressions lack (complement, intersection) is built as an automaton and spliced in.
struct ByteDfa {
  struct Edge {
    uint8_t lo, hi;
    int32_t to;
  };
  struct State {
    bool final = false;
    std::vector<Edge> edges;
  };
  std::vector<State> states;  // state 0 is the start
};

// Marks on byte transitions of counted rules (see Rule::counted).
enum class ByteMark : uint8_t {
  kNone = 0,
  kChar = 1,   // the last byte of one character: the rule's count goes up by one
  kClose = 2,  // leaves the counted part: allowed only when the count is within bounds
};

struct Expr {
  enum class Kind : uint8_t {
    kEmpty,    // matches the empty string
    kNothing,  // matches nothing
    kBytes,    // one byte in `ranges`
    kChars,    // one character (code point) in `ranges`, spelled per `encoding`
    kSeq,
    kAlt,
    kRepeat,  // kids[0] repeated min..max times (max may be kUnbounded)
    kRule,    // a reference to rule `rule`
    kDfa,     // the language of `dfa`
  };
  Kind kind = Kind::kEmpty;
  ByteMark mark = ByteMark::kNone;  // kBytes
  // kRepeat (unbounded): reaching this loop makes every other way through the rule redundant
  // (its language contains theirs), so the automaton forgets them. A search pattern's trailing
  // "anything" is such a loop; without it, determinizing a.*b|c.*d tracks every partial match.
  bool absorbing = false;
  CharEncoding encoding = CharEncoding::kUtf8;
  uint32_t min = 0, max = 0;
  RuleId rule = -1;
  Ranges ranges;
  std::vector<ExprId> kids;
  std::shared_ptr<const ByteDfa> dfa;  // kDfa
};

struct Rule {
  std::string name;
  ExprId body = -1;
  // A counted rule counts the characters it matches (kChar marks) and leaves its counted part
  // (kClose marks) only with min_count <= count <= max_count: JSON strings with minLength and
  // maxLength, without unrolling the bounds into states.
  bool counted = false;
  uint32_t min_count = 0;
  uint32_t max_count = kUnbounded;
};

class Grammar {
 public:
  ExprId Empty();
  ExprId Nothing();
  ExprId Byte(uint8_t b, ByteMark mark = ByteMark::kNone);
  ExprId Bytes(Ranges ranges, ByteMark mark = ByteMark::kNone);
  ExprId Literal(std::string_view bytes);
  ExprId Chars(Ranges codepoints, CharEncoding encoding);
  // Flattens nested sequences, drops empty parts; any kNothing part makes the whole kNothing.
  ExprId Seq(std::vector<ExprId> parts);
  // Flattens nested alternatives, drops kNothing branches.
  ExprId Alt(std::vector<ExprId> branches);
  ExprId Repeat(ExprId e, uint32_t min, uint32_t max);
  ExprId Optional(ExprId e) { return Repeat(e, 0, 1); }
  ExprId Star(ExprId e) { return Repeat(e, 0, kUnbounded); }
  ExprId Plus(ExprId e) { return Repeat(e, 1, kUnbounded); }
  // Star(e), marked absorbing (see Expr::absorbing).
  ExprId AbsorbingStar(ExprId e);
  ExprId Ref(RuleId rule);
  // The language of a byte automaton (Nothing when it accepts nothing).
  ExprId Dfa(std::shared_ptr<const ByteDfa> dfa);

  // A rule is declared first (so that bodies can refer to it, recursively) and defined later.
  RuleId AddRule(std::string name);
  void SetBody(RuleId rule, ExprId body) { rules_[rule].body = body; }
  void SetCounted(RuleId rule, uint32_t min_count, uint32_t max_count);
  // Declares and defines a rule in one call.
  RuleId DefineRule(std::string name, ExprId body);
  // Copies every rule and expression of `other` into this grammar (rule names get `prefix`);
  // returns the id here of other's root rule.
  RuleId Import(const Grammar& other, std::string_view prefix);

  void set_root(RuleId rule) { root_ = rule; }
  RuleId root() const { return root_; }
  const Expr& expr(ExprId id) const { return exprs_[id]; }
  const Rule& rule(RuleId id) const { return rules_[id]; }
  Rule& mutable_rule(RuleId id) { return rules_[id]; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  int32_t num_exprs() const { return static_cast<int32_t>(exprs_.size()); }
  bool IsNothing(ExprId id) const { return exprs_[id].kind == Expr::Kind::kNothing; }

  // GBNF-like text of the grammar, for diagnostics and `dinfer grammar compile`.
  std::string ToString() const;

 private:
  ExprId Add(Expr e);

  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  RuleId root_ = -1;
  ExprId empty_ = -1, nothing_ = -1;
};

// Appends the UTF-8 encoding of code point cp.
void AppendUtf8(uint32_t cp, std::string* out);
// Decodes one code point from the front of s (advancing it); nullopt-like -1 on invalid UTF-8.
int32_t DecodeUtf8(std::string_view* s);

}  // namespace dinfer::structured
