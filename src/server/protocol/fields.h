// Reading request fields with errors that name the field: FieldReader checks types and ranges
// of one JSON object's members and keeps the first problem as an ApiError. Also the sampling
// fields every protocol shares. Not thread-safe (one reader per request).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "server/protocol/types.h"

namespace dinfer::server {

class FieldReader {
 public:
  // `prefix` names the object in errors ("stream_options." for its members).
  explicit FieldReader(const boost::json::object& object, std::string prefix = "")
      : object_(object), prefix_(std::move(prefix)) {}

  // The member, or nullptr when it is absent or null (clients send null for "not set").
  const boost::json::value* Get(std::string_view key) const;
  std::optional<double> Number(std::string_view key, double lo, double hi);
  std::optional<int64_t> Int(std::string_view key, int64_t lo, int64_t hi);
  std::optional<bool> Bool(std::string_view key);
  std::optional<std::string> String(std::string_view key);
  const boost::json::object* Object(std::string_view key);
  const boost::json::array* Array(std::string_view key);

  // Records an error about `key` (the first one wins) and returns false.
  bool Fail(std::string_view key, std::string message);
  bool ok() const { return !error_.has_value(); }
  const ApiError& error() const { return *error_; }
  std::string Name(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  const boost::json::object& object_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

// The JSON type of a value in words, for error messages ("a string", "an array").
std::string_view TypeName(const boost::json::value& v);

// Sampling fields the protocols share: temperature, top_p, top_k, min_p, seed, penalties,
// logit_bias, stop token ids and the engine's extensions (ignore_eos, min_tokens, ...).
void ReadSamplingFields(FieldReader& r, GenerationRequest& req);

// Structured outputs (structured_fields.cc). Each sets req.sampling.structured and
// req.structured_param, and fails when another field constrained the output already.
// A {"schema": {...}} format object (OpenAI's response_format.json_schema, Responses' text.format,
// Anthropic's output_config.format), named `param` in errors.
bool ReadJsonSchemaFormat(FieldReader& r, std::string_view param, const boost::json::object& format,
                          GenerationRequest& req);
// {"type": "json_object"}: any JSON object.
bool ReadJsonObjectFormat(FieldReader& r, std::string_view param, GenerationRequest& req);
// {"type": "structural_tag", "structures": [...], "triggers": [...]} (vLLM's response_format).
bool ReadStructuralTagFormat(FieldReader& r, std::string_view param,
                             const boost::json::object& format, GenerationRequest& req);
// Strict tools (`"strict": true`) with tool_choice auto: the model may answer in text, and every
// call it writes in the Hermes format must be well formed, with a strict tool's arguments
// following its schema (other tools' arguments are any object). A structural tag triggered by
// "<tool_call>"; tools in the chat shape.
bool HasStrictTool(const boost::json::array& tools);
std::string HermesToolCallTag(const boost::json::array& tools);
// vLLM's structured_outputs ({json | regex | grammar | choice | json_object | structural_tag,
// disable_any_whitespace}) and guided_json / guided_regex / guided_grammar / guided_choice.
void ReadStructuredOutputs(FieldReader& r, GenerationRequest& req);
// tool_choice "required" or named: the output is one call, {"name": ..., "parameters": {...}},
// its name one of the tools (the named one) and its parameters following that tool's schema.
// Call after tools and tool_choice are read.
bool ForceToolCall(FieldReader& r, GenerationRequest& req);

// `stop` as a string or a list of strings (at most `max_count`, none empty).
void ReadStopStrings(FieldReader& r, std::string_view key, size_t max_count,
                     std::vector<std::string>& out);

// Parses a request body: an object, or the error a client should see.
ApiResult<boost::json::object> ParseBody(std::string_view body);

}  // namespace dinfer::server
