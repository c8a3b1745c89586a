// Structured-output fields of the protocols: OpenAI's response_format, the Responses API's
// text.format, Anthropic's output_config.format, vLLM's structured_outputs (and its older
// guided_* fields), and forced tool calls (tool_choice "required" or named). They all become
// the engine's SamplingParams::structured; the engine compiles the constraint at Submit and
// refuses what it cannot enforce, naming the feature.
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <boost/json/serialize.hpp>

#include "base/json_escape.h"
#include "server/protocol/fields.h"

namespace dinfer::server {

namespace json = boost::json;

namespace {

// Sets the request's constraint unless another field set one already (two constraints on one
// output cannot both be honoured, so that is an error rather than a silent choice).
bool SetConstraint(FieldReader& r, GenerationRequest& req, std::string param, StructuredOutput so) {
  if (!req.structured_param.empty()) {
    return r.Fail(param, fmt::format("'{}' and '{}' both constrain the output; give one",
                                     req.structured_param, param));
  }
  req.structured_param = std::move(param);
  req.sampling.structured = std::move(so);
  return true;
}

StructuredOutput JsonSchema(const json::value& schema, int max_whitespace) {
  StructuredOutput so;
  so.type = "json_schema";
  so.value = json::serialize(schema);
  so.max_whitespace = max_whitespace;
  return so;
}

StructuredOutput JsonObject(int max_whitespace) {
  StructuredOutput so;
  so.type = "json_object";
  so.max_whitespace = max_whitespace;
  return so;
}

// A JSON Schema is an object or a boolean.
bool IsSchema(const json::value& v) { return v.is_object() || v.is_bool(); }

// JSON Schema references inside `schema` that point into it ("#", "#/$defs/x") are rewritten to
// point into the schema that embeds it at `base` (a JSON pointer: "#/properties/parameters").
// Values of keywords that hold data, not schemas, are left alone.
void RebaseRefs(json::value& schema, std::string_view base) {
  if (json::array* a = schema.if_array()) {
    for (json::value& v : *a) RebaseRefs(v, base);
    return;
  }
  json::object* o = schema.if_object();
  if (o == nullptr) return;
  for (auto& [key, value] : *o) {
    if (key == "enum" || key == "const" || key == "default" || key == "examples") continue;
    if (key == "$ref" && value.is_string()) {
      const std::string_view ref = value.get_string();
      if (!ref.empty() && ref[0] == '#') value = std::string(base) + std::string(ref.substr(1));
      continue;
    }
    RebaseRefs(value, base);
  }
}

// A tool in the chat shape ({"type": "function", "function": {...}}) or flat (Responses).
const json::object& ToolFunction(const json::value& tool) {
  const json::object& o = tool.get_object();
  return o.contains("function") ? o.at("function").get_object() : o;
}

bool IsStrict(const json::object& fn) {
  const json::value* strict = fn.if_contains("strict");
  return strict != nullptr && strict->is_bool() && strict->get_bool();
}

// A JSON Schema given as an object (or boolean), or as its JSON text (vLLM takes both); fails
// `key` of `r` (named `name` in the message) otherwise.
std::optional<StructuredOutput> SchemaConstraint(FieldReader& r, std::string_view key,
                                                 std::string_view name, const json::value& v,
                                                 int max_whitespace) {
  if (v.is_string())
    return StructuredOutput{"json_schema", std::string(v.get_string()), {}, max_whitespace};
  if (IsSchema(v)) return JsonSchema(v, max_whitespace);
  r.Fail(key, fmt::format("'{}' must be a JSON Schema", name));
  return std::nullopt;
}

// A non-empty list of strings; fails `key` of `r` (named `name` in the message) otherwise.
std::optional<StructuredOutput> ChoiceConstraint(FieldReader& r, std::string_view key,
                                                 std::string_view name, const json::array& list,
                                                 int max_whitespace) {
  StructuredOutput out{"choice", "", {}, max_whitespace};
  for (const json::value& c : list) {
    if (!c.is_string()) {
      r.Fail(key, fmt::format("'{}' must hold strings", name));
      return std::nullopt;
    }
    out.choices.emplace_back(c.get_string());
  }
  if (out.choices.empty()) {
    r.Fail(key, fmt::format("'{}' is empty", name));
    return std::nullopt;
  }
  return out;
}

}  // namespace

bool ReadJsonSchemaFormat(FieldReader& r, std::string_view param, const json::object& format,
                          GenerationRequest& req) {
  const json::value* schema = format.if_contains("schema");
  if (schema == nullptr || !IsSchema(*schema)) {
    return r.Fail(param, fmt::format("'{}.schema' must be a JSON Schema object", param));
  }
  return SetConstraint(r, req, std::string(param), JsonSchema(*schema, 16));
}

bool ReadJsonObjectFormat(FieldReader& r, std::string_view param, GenerationRequest& req) {
  return SetConstraint(r, req, std::string(param), JsonObject(16));
}

bool ReadStructuralTagFormat(FieldReader& r, std::string_view param, const json::object& format,
                             GenerationRequest& req) {
  return SetConstraint(r, req, std::string(param),
                       {"structural_tag", json::serialize(format), {}, 16});
}

bool HasStrictTool(const json::array& tools) {
  for (const json::value& t : tools) {
    if (IsStrict(ToolFunction(t))) return true;
  }
  return false;
}

std::string HermesToolCallTag(const json::array& tools) {
  json::array structures;
  for (const json::value& t : tools) {
    const json::object& fn = ToolFunction(t);
    const json::value* params = fn.if_contains("parameters");
    json::value schema = json::object{{"type", "object"}};
    if (IsStrict(fn) && params != nullptr && IsSchema(*params)) {
      schema = *params;
    }
    std::string begin = "<tool_call>\n{\"name\": ";
    AppendJsonQuoted(fn.at("name").get_string(), &begin);
    begin += ", \"arguments\": ";
    structures.push_back(
        json::object{{"begin", begin}, {"schema", std::move(schema)}, {"end", "}\n</tool_call>"}});
  }
  return json::serialize(json::object{{"structures", std::move(structures)},
                                      {"triggers", json::array{"<tool_call>"}}});
}

void ReadStructuredOutputs(FieldReader& r, GenerationRequest& req) {
  // vLLM: {"json": schema, "regex": ..., "choice": [...], "grammar": ..., "json_object": true,
  // "disable_any_whitespace": bool}, exactly one constraint.
  if (const json::object* so = r.Object("structured_outputs")) {
    FieldReader sr(*so, "structured_outputs.");
    const int ws = sr.Bool("disable_any_whitespace").value_or(false) ? 0 : 16;
    int count = 0;
    StructuredOutput out;
    if (const json::value* schema = sr.Get("json")) {
      ++count;
      if (auto c = SchemaConstraint(sr, "json", "structured_outputs.json", *schema, ws)) {
        out = std::move(*c);
      }
    }
    if (auto regex = sr.String("regex")) {
      ++count;
      out = {"regex", *regex, {}, ws};
    }
    if (auto grammar = sr.String("grammar")) {
      ++count;
      out = {"grammar", *grammar, {}, ws};
    }
    if (const json::array* choice = sr.Array("choice")) {
      ++count;
      if (auto c = ChoiceConstraint(sr, "choice", "structured_outputs.choice", *choice, ws)) {
        out = std::move(*c);
      }
    }
    if (sr.Bool("json_object").value_or(false)) {
      ++count;
      out = JsonObject(ws);
    }
    // vLLM passes the structural tag as a JSON string; an object is taken too.
    if (const json::value* tag = sr.Get("structural_tag")) {
      ++count;
      out = {"structural_tag",
             tag->is_string() ? std::string(tag->get_string()) : json::serialize(*tag),
             {},
             ws};
    }
    if (!sr.ok()) {
      r.Fail(sr.error().param, sr.error().message);
      return;
    }
    if (count != 1) {
      r.Fail("structured_outputs",
             fmt::format("'structured_outputs' must give exactly one of json, regex, grammar, "
                         "choice, json_object or structural_tag; it gives {}",
                         count));
      return;
    }
    SetConstraint(r, req, "structured_outputs", std::move(out));
  }
  // vLLM's older spellings, one field each.
  if (const json::value* schema = r.Get("guided_json")) {
    if (auto c = SchemaConstraint(r, "guided_json", "guided_json", *schema, 16)) {
      SetConstraint(r, req, "guided_json", std::move(*c));
    }
  }
  if (auto regex = r.String("guided_regex")) {
    SetConstraint(r, req, "guided_regex", {"regex", *regex, {}, 16});
  }
  if (auto grammar = r.String("guided_grammar")) {
    SetConstraint(r, req, "guided_grammar", {"grammar", *grammar, {}, 16});
  }
  if (const json::array* choice = r.Array("guided_choice")) {
    if (auto c = ChoiceConstraint(r, "guided_choice", "guided_choice", *choice, 16)) {
      SetConstraint(r, req, "guided_choice", std::move(*c));
    }
  }
}

bool ForceToolCall(FieldReader& r, GenerationRequest& req) {
  if (req.tool_choice.mode != ToolChoice::Mode::kRequired &&
      req.tool_choice.mode != ToolChoice::Mode::kNamed) {
    return true;
  }
  // One call, written as {"name": ..., "parameters": {...}}: the name is one of the tools (the
  // named one), the parameters follow that tool's schema.
  json::array alternatives;
  for (const json::value& t : req.tools) {
    const json::object& fn = ToolFunction(t);
    const std::string_view name = fn.at("name").get_string();
    if (req.tool_choice.mode == ToolChoice::Mode::kNamed && name != req.tool_choice.name) continue;
    const std::string base = fmt::format("#/anyOf/{}/properties/parameters", alternatives.size());
    json::value params = json::object{{"type", "object"}};
    if (const json::value* p = fn.if_contains("parameters"); p != nullptr && IsSchema(*p)) {
      params = *p;
      RebaseRefs(params, base);
    }
    alternatives.push_back(json::object{
        {"type", "object"},
        {"properties",
         json::object{{"name", json::object{{"const", name}}}, {"parameters", std::move(params)}}},
        {"required", json::array{"name", "parameters"}},
        {"additionalProperties", false}});
  }
  if (alternatives.empty()) {
    return r.Fail("tool_choice", "'tool_choice' forces a tool call but 'tools' is empty");
  }
  return SetConstraint(r, req, "tool_choice",
                       JsonSchema(json::object{{"anyOf", std::move(alternatives)}}, 16));
}

}  // namespace dinfer::server
