#include "structured/constraint.h"

#include <fmt/format.h>

#include "structured/ebnf.h"
#include "structured/regex.h"
#include "structured/structural_tag.h"

namespace dinfer::structured {

StatusOr<ConstraintKind> ParseConstraintKind(std::string_view name) {
  if (name == "json_schema" || name == "json") return ConstraintKind::kJsonSchema;
  if (name == "json_object") return ConstraintKind::kJsonObject;
  if (name == "regex") return ConstraintKind::kRegex;
  if (name == "grammar" || name == "ebnf" || name == "gbnf") return ConstraintKind::kGrammar;
  if (name == "choice") return ConstraintKind::kChoice;
  if (name == "structural_tag") return ConstraintKind::kStructuralTag;
  return InvalidArgument(
      "unknown structured output type '{}' (json_schema, json_object, regex, grammar, choice or "
      "structural_tag)",
      name);
}

std::string_view ConstraintKindName(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonSchema:
      return "json_schema";
    case ConstraintKind::kJsonObject:
      return "json_object";
    case ConstraintKind::kRegex:
      return "regex";
    case ConstraintKind::kGrammar:
      return "grammar";
    case ConstraintKind::kChoice:
      return "choice";
    case ConstraintKind::kStructuralTag:
      return "structural_tag";
  }
  return "";
}

StatusOr<Grammar> BuildGrammar(const Constraint& c) {
  switch (c.kind) {
    case ConstraintKind::kJsonSchema:
      return JsonSchemaToGrammar(std::string_view(c.text), c.json);
    case ConstraintKind::kJsonObject:
      return JsonObjectGrammar(c.json);
    case ConstraintKind::kRegex: {
      Grammar g;
      DINFER_ASSIGN_OR_RETURN(ExprId e, RegexToExpr(c.text, {}, &g));
      g.set_root(g.DefineRule("root", e));
      return g;
    }
    case ConstraintKind::kGrammar:
      return EbnfToGrammar(c.text);
    case ConstraintKind::kChoice:
      if (c.choices.empty())
        return InvalidArgument("a choice constraint needs at least one choice");
      return ChoiceGrammar(c.choices);
    case ConstraintKind::kStructuralTag: {
      DINFER_ASSIGN_OR_RETURN(StructuralTag tag, ParseStructuralTag(c.text));
      return StructuralTagToGrammar(tag, c.json);
    }
  }
  return InvalidArgument("unknown constraint kind");
}

std::string ConstraintKey(const Constraint& c) {
  std::string key = fmt::format("{}\x1f{}\x1f{}\x1f", ConstraintKindName(c.kind),
                                c.json.max_whitespace, c.json.default_draft);
  key += c.text;
  for (const auto& choice : c.choices) {
    key += '\x1e';
    key += choice;
  }
  return key;
}

}  // namespace dinfer::structured
