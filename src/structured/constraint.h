// Constraint: what a request asks its output to follow (a JSON Schema, any JSON object, a regular
// expression, an EBNF grammar or a list of choices), as the APIs carry it, and its translation to
// a Grammar. Plain values and functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"

namespace dinfer::structured {

enum class ConstraintKind {
  kJsonSchema,
  kJsonObject,
  kRegex,
  kGrammar,
  kChoice,
  kStructuralTag,  // free text with tagged JSON structures after triggers (structural_tag.h)
};

struct Constraint {
  ConstraintKind kind = ConstraintKind::kJsonSchema;
  std::string text;                  // the schema, regex, grammar or structural tag (JSON)
  std::vector<std::string> choices;  // kChoice
  JsonSchemaOptions json;            // kJsonSchema and kJsonObject
};

// "json_schema", "json_object", "regex", "grammar", "choice", "structural_tag"; an error
// otherwise.
StatusOr<ConstraintKind> ParseConstraintKind(std::string_view name);
std::string_view ConstraintKindName(ConstraintKind kind);

StatusOr<Grammar> BuildGrammar(const Constraint& constraint);

// Identifies the constraint for caches (kind, options and text).
std::string ConstraintKey(const Constraint& constraint);

}  // namespace dinfer::structured
