// Internals of the JSON Schema translation, shared by its source files: reference resolution,
// compact serialization of literal values, formats, schema merging (allOf), disjointness checks
// (oneOf), and the converter itself. Not part of the module's interface. A Converter translates
// one schema on one thread; the helpers are plain functions.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/json.hpp>

#include "base/status.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/number_range.h"

namespace dinfer::structured::json_internal {

namespace json = boost::json;

enum class Draft { k4 = 4, k6 = 6, k7 = 7, k2019 = 2019, k2020 = 2020 };

// Where every schema with an $id (or anchor) of the document is, by absolute URI.
class SchemaIndex {
 public:
  void Build(const json::value& root, Draft draft, const std::string& root_base);
  // The base URI inside `schema`, given the base around it.
  std::string BaseOf(const json::object& schema, const std::string& outer) const;
  // Resolves a $ref against `base`: the target and the base URI inside it.
  StatusOr<std::pair<const json::value*, std::string>> Resolve(std::string_view ref,
                                                               const std::string& base) const;

 private:
  void Walk(const json::value& v, const std::string& base);
  Draft draft_ = Draft::k2020;
  std::unordered_map<std::string, const json::value*> by_uri_;
};

// Compact JSON text of a value as JSON.stringify writes it (shortest round-trip numbers, no
// exponent below 1e21, integral doubles without a fraction).
std::string SerializeCompact(const json::value& v);
// Exact decimal of a JSON number value.
std::optional<Decimal> ToDecimal(const json::value& v);
// Number of characters (code points) of a UTF-8 string.
size_t CodepointCount(std::string_view s);

// The regular expression (over the string's characters) of a supported format.
std::optional<std::string_view> FormatRegex(std::string_view format);
// Whether `text` matches `pattern` with JSON Schema (search) semantics; errors for unsupported
// patterns.
StatusOr<bool> PatternMatches(std::string_view pattern, std::string_view text, bool search);

// Type sets.
enum TypeBit : uint32_t {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,
  kNumber = 64,  // numbers that need not be integers
  kAllTypes = 127,
};
uint32_t TypeOfValue(const json::value& v);
// The types a `type` keyword allows (kAllTypes without one); number includes integer.
StatusOr<uint32_t> DeclaredTypes(const json::object& schema);

// Keywords that only annotate: everything but the validation keywords.
bool IsAnnotation(std::string_view keyword);
// The validation keywords of a schema, serialized: schemas that differ only in annotations
// share rules.
std::string KeyOf(const json::object& schema);
// A non-negative integer keyword (minLength, maxItems, ...), or `fallback` when absent.
StatusOr<uint32_t> CountKeyword(const json::object& schema, std::string_view key,
                                uint32_t fallback);

// Merges two schemas (objects without $ref/allOf at the top) into one that means both
// (allOf); Unimplemented when the combination cannot be expressed.
StatusOr<json::object> MergeSchemas(const json::object& a, const json::object& b);

// Whether no instance can match both schemas (a sufficient check; false means "maybe").
// `flatten` resolves a property's schema ($ref, allOf) to an object, when it can.
using Flattener = std::function<std::optional<json::object>(const json::value&)>;
bool Disjoint(const json::object& a, const json::object& b, const Flattener& flatten);

// JSON text of a property key, canonically escaped.
std::string KeyLiteral(std::string_view name);

class Converter {
 public:
  Converter(const JsonSchemaOptions& options, Grammar* g) : opt_(options), g_(*g) {}
  Status Run(const json::value& root);
  // A rule for any JSON value (json_object mode uses its object rule).
  RuleId AnyObjectRule();

 private:
  struct Ctx {
    std::string base;
    std::string path;
    int depth = 0;
  };

  StatusOr<ExprId> Value(const json::value& schema, const Ctx& ctx);
  StatusOr<ExprId> RefValue(std::string_view ref, const Ctx& ctx);
  // Resolves $ref (2019+: merged with siblings) and allOf into one object schema.
  StatusOr<json::object> Flatten(const json::object& schema, const Ctx& ctx, int depth);
  StatusOr<ExprId> FlatValue(const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> Alternatives(const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> Typed(const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> Literals(const json::object& s, uint32_t types, const Ctx& ctx);
  StatusOr<bool> LiteralAllowed(const json::value& v, const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> Number(const json::object& s, bool integer, const Ctx& ctx);
  StatusOr<ExprId> String(const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> Array(const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> Object(const json::object& s, const Ctx& ctx);
  StatusOr<ExprId> KeyExcept(const std::vector<std::string>& names);
  // JSON string literals (canonical spelling) whose characters match every pattern of `all_of`
  // (search semantics), no pattern of `none_of`, and are none of `names`.
  StatusOr<ExprId> KeyLanguage(const std::vector<std::string>& all_of,
                               const std::vector<std::string>& none_of,
                               const std::vector<std::string>& names, const Ctx& ctx);

  ExprId Ws();
  ExprId Sep(char c);  // ws c ws
  ExprId AnyValue();
  ExprId FreeString();
  // A memoized rule: `make` builds the body once the rule is declared (so it may recurse).
  StatusOr<ExprId> MemoRule(const std::string& key, const std::string& name,
                            const std::function<StatusOr<ExprId>(RuleId)>& make);

  static std::string Where(const Ctx& ctx) { return ctx.path.empty() ? "/" : ctx.path; }
  Status Error(const Ctx& ctx, std::string_view what) const;
  Status Unsupported(const Ctx& ctx, std::string_view keyword) const;

  JsonSchemaOptions opt_;
  Grammar& g_;
  Draft draft_ = Draft::k2020;
  SchemaIndex index_;
  std::unordered_map<std::string, RuleId> memo_;
  std::unordered_map<std::string, ExprId> key_languages_;
  RuleId ws_ = -1, any_value_ = -1, any_object_ = -1, any_array_ = -1, free_string_ = -1;
};

}  // namespace dinfer::structured::json_internal
