// Structural tags (the "structural_tag" of xgrammar and vLLM): free text in which every occurrence
// of a trigger string starts a tagged structure — its begin text, a JSON value following its
// schema, its end text — after which free text resumes. This is how tool calls are constrained
// while the model may still answer in prose: with the trigger "<tool_call>", whatever follows a
// "<tool_call>" the model writes must be a well-formed call of one of the tools.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"

namespace dinfer::structured {

struct TaggedStructure {
  std::string begin;   // starts with one of the triggers
  std::string schema;  // JSON Schema text of the value between begin and end
  std::string end;
};

struct StructuralTag {
  std::vector<TaggedStructure> structures;
  std::vector<std::string> triggers;  // non-empty strings
};

// {"structures": [{"begin": ..., "schema": {...}, "end": ...}, ...], "triggers": [...]}
// (an optional "type": "structural_tag" member is ignored).
StatusOr<StructuralTag> ParseStructuralTag(std::string_view json_text);
std::string StructuralTagJson(const StructuralTag& tag);

StatusOr<Grammar> StructuralTagToGrammar(const StructuralTag& tag,
                                         const JsonSchemaOptions& options = {});

// A byte automaton of the texts that contain none of `strings` (every state final).
std::shared_ptr<const ByteDfa> AvoidingDfa(const std::vector<std::string>& strings);

}  // namespace dinfer::structured
