// The protocol-neutral shapes between the HTTP endpoints and the engine: what every API's
// request becomes (GenerationRequest), what comes back for each choice (ChoiceUpdate while
// streaming, ChoiceResult at the end), and errors (ApiError). Plain values; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include "dinfer/engine.h"
#include "server/output/output_parser.h"

namespace dinfer::server {

enum class Api { kChatCompletions, kCompletions, kResponses, kMessages };

// Error classes shared by the protocols; each protocol names them its own way.
enum class ErrorKind {
  kInvalidRequest,    // 400
  kAuthentication,    // 401
  kNotFound,          // 404
  kRequestTooLarge,   // 413
  kOverloaded,        // 503: the waiting queue is full, or the model is still loading
  kRateLimited,       // 429: the waiting queue is full (ServerOptions::queue_full_status)
  kInternal,          // 500
  kUnsupportedMedia,  // 415
};

struct ApiError {
  ErrorKind kind = ErrorKind::kInvalidRequest;
  std::string message;
  std::string param;  // the request field at fault (OpenAI's "param"), if any
  std::string code;   // OpenAI's machine-readable "code" ("context_length_exceeded", ...)
};
unsigned HttpStatus(ErrorKind kind);
ApiError InvalidParam(std::string param, std::string message);

// A value or the ApiError that explains why there is none.
template <typename T>
class ApiResult {
 public:
  ApiResult(ApiError error) : v_(std::move(error)) {}
  ApiResult(T value) : v_(std::move(value)) {}
  bool ok() const { return std::holds_alternative<T>(v_); }
  const ApiError& error() const { return std::get<ApiError>(v_); }
  T& value() { return std::get<T>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<ApiError, T> v_;
};

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

// One prompt of /v1/completions: text, or token ids used as given.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
};

struct GenerationRequest {
  Api api = Api::kChatCompletions;
  std::string model;
  // Chat APIs: messages in the OpenAI chat shape ({"role", "content", "tool_calls", ...}) and
  // tools in its function shape, rendered by the model's chat template.
  bool chat = false;
  boost::json::array messages;
  boost::json::array tools;
  ToolChoice tool_choice;
  boost::json::object template_kwargs;  // extra template variables (reasoning effort, thinking)
  // The last message is the start of the assistant's answer, to be continued (Anthropic's
  // prefill; vLLM's continue_final_message) instead of opening a new turn.
  bool continue_final_message = false;
  // /v1/completions: one or more raw prompts.
  std::vector<PromptInput> prompts;

  SamplingParams sampling;  // max_tokens filled in once the prompt length is known
  // The field that set sampling.structured ("response_format", "tool_choice", ...), named in
  // errors about the constraint; empty when the output is free.
  std::string structured_param;
  std::optional<int64_t> max_tokens;
  // Unset: the checkpoint's generation defaults.
  std::optional<double> temperature, top_p;
  std::optional<int> top_k;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (always for the other APIs)
  bool logprobs = false;
  int top_logprobs = 0;
  bool echo = false;  // /v1/completions: the prompt precedes the completion
  // Request fields a protocol repeats in its response (the Responses API echoes its settings).
  boost::json::object echo_fields;
};

struct ToolCall {
  std::string id, name, arguments;
};

struct LogprobEntry {
  std::string token;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

// Why a choice ended, in neutral terms; each protocol maps it to its own vocabulary.
enum class Finish { kNone, kEndOfSequence, kStopSequence, kLength, kToolCalls, kAbort, kError };

// Pieces of a choice's output as the output parser separates them (content, reasoning, tool
// calls with streamed arguments).
using output::OutputEvent;

struct ChoiceUpdate {
  int index = 0;
  std::vector<OutputEvent> events;
  std::vector<LogprobEntry> logprobs;
  Finish finish = Finish::kNone;
  std::string stop_sequence;  // kStopSequence: the one matched
  std::string error;          // kError
};

struct ChoiceResult {
  int index = 0;
  std::string text, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<LogprobEntry> logprobs;
  Finish finish = Finish::kNone;
  std::string stop_sequence;
  std::string error;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;  // of completion_tokens, those that produced only reasoning
};

struct Usage {
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0, reasoning_tokens = 0;
};

}  // namespace dinfer::server
