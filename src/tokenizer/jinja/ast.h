// The parsed form of a Jinja template: expressions and statements, as the parser builds them and
// the evaluator walks them. Immutable after parsing; shared by concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace dinfer::tokenizer::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using NamedArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,    // literal
    kName,       // name
    kList,       // children
    kTuple,      // children
    kDict,       // children: key, value, key, value, ...
    kGetAttr,    // children[0].name
    kGetItem,    // children[0][children[1]]
    kSlice,      // children[0][children[1]:children[2]:children[3]] (null when left out)
    kCall,       // children[0](children[1..], named)
    kFilter,     // children[0] | name(children[1..], named); children[0] null in filter blocks
    kTest,       // children[0] is [not] name(children[1..], named)
    kNegate,     // -children[0]
    kPlus,       // +children[0]
    kNot,        // not children[0]
    kBinary,     // children[0] op children[1]: + - * / // % ** ~
    kAnd,        // children[0] and children[1]
    kOr,         // children[0] or children[1]
    kCompare,    // children[0] ops[0] children[1] ops[1] children[2] ...
    kCondition,  // children[0] if children[1] else children[2] (null: undefined)
  };

  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter, test or operator
  std::vector<ExprPtr> children;
  NamedArgs named;
  std::vector<std::string> ops;  // kCompare: ==, !=, <, <=, >, >=, in, notin
  bool negated = false;          // kTest: `is not`

  Expr(Kind k, int l) : kind(k), line(l) {}
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind : uint8_t {
    kData,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches, else_body
    kFor,          // for targets in expr [if filter]: body [else: else_body]
    kSet,          // targets (or targets[0].attr) = expr
    kSetBlock,     // targets (or targets[0].attr) = body [| filter]
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body
    kFilterBlock,  // filter (expr, with a null input): body
    kWith,         // with assignments: body
    kScope,        // body in place (HF's {% generation %})
    kBreak,
    kContinue,
  };

  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;  // namespace attribute assigned by set
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  std::vector<Param> params;
  // A macro takes extra positional / keyword arguments only if its body reads varargs / kwargs.
  bool catch_varargs = false, catch_kwargs = false;
  NamedArgs assignments;

  Stmt(Kind k, int l) : kind(k), line(l) {}
};

}  // namespace dinfer::tokenizer::jinja
