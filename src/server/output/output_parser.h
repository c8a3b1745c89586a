// OutputParser: turns a completion's text, as the engine streams it, into what a chat API
// returns: content, reasoning, tool calls with incrementally streamed JSON arguments, and the
// stop sequence that ended it. It owns the model-specific output formats (reasoning in
// <think>…</think>; tool calls as Hermes/Qwen <tool_call>{json}</tool_call>, Llama 3 JSON and
// DeepSeek DSML) and stop sequences, and which format a model uses (SelectOutputFormat).
// An OutputParser belongs to one stream: not thread-safe; the free functions are.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dinfer/prompt.h"

namespace dinfer::output {

enum class ReasoningFormat {
  kNone,
  // <think>…</think>: Qwen3, DeepSeek R1/V3.1+/V4, and templates that mention <think>. The
  // reasoning opens with <think> at the start of the output, or is already open when the prompt
  // ended inside it (OutputFormat::starts_in_reasoning).
  kThink,
};

enum class ToolCallFormat {
  kNone,
  kHermes,      // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes, Qwen2.5/3)
  kLlama3Json,  // the whole output is {"name": ..., "parameters": {...}} (optionally after
                // <|python_tag|>, several separated by ';'), Llama 3.1-3.3
  kDeepSeekDsml,  // <｜DSML｜tool_calls> (V4) or <｜DSML｜function_calls> (V3.2) blocks of invokes
};

struct OutputFormat {
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  bool starts_in_reasoning = false;  // the prompt ended inside an open <think>
  ToolCallFormat tools = ToolCallFormat::kNone;
  bool starts_in_tool_calls = false;  // DSML: the prompt opened the tool-calls block itself
  // OpenAI `stop`: the content is cut before the first one that appears in it. They apply to
  // content only, never to reasoning or tool-call markup, and match within one run of content.
  std::vector<std::string> stop;
  // The id of the tool call with this index (0, 1, ...); unset: "call_" and 24 random letters
  // and digits.
  std::function<std::string(int index)> tool_call_id;
};

struct OutputEvent {
  enum class Type {
    kText,           // content
    kReasoning,      // reasoning content
    kToolCallBegin,  // tool_index, id, name
    kToolCallArgs,   // a piece of the call's JSON arguments (the pieces concatenate to them)
    kToolCallEnd,    // the call's arguments are complete
    kStop,           // a stop sequence (text) ended the output; nothing follows
  };
  Type type = Type::kText;
  std::string text;      // kText, kReasoning, kToolCallArgs, kStop
  int tool_index = 0;    // kToolCallBegin, kToolCallArgs, kToolCallEnd
  std::string id, name;  // kToolCallBegin

  bool operator==(const OutputEvent&) const = default;
};

// Feed text deltas as they arrive (whole UTF-8 characters; markers may be cut anywhere); each
// call returns what became certain. Text that may still turn out to be a marker or a stop
// sequence is held back until it is decided. Finish() releases what is held at the end of the
// output. The concatenation of all events does not depend on how the text was cut.
//
// Malformed tool calls (vLLM returns unparsable calls as content): a block from which no call
// can be read — JSON that is not an object with a string "name", a DSML block without an invoke
// — is content, its markup included. Stray text inside a DSML block is skipped, as DeepSeek's
// parser does. Once a call has begun, its arguments stream as written; output that ends inside a
// call ends the call there.
class OutputParser {
 public:
  explicit OutputParser(OutputFormat format);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  std::vector<OutputEvent> Push(std::string_view delta);
  std::vector<OutputEvent> Finish();
  // A stop sequence matched: the caller should end the request; further text is ignored.
  bool stopped() const;
  int tool_calls() const;  // tool calls begun so far

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

struct ToolCall {
  std::string id, name, arguments;
  bool operator==(const ToolCall&) const = default;
};

// A whole output parsed at once (non-streaming responses): the same as concatenating the
// events of Push(text) + Finish().
struct ParsedOutput {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  std::optional<std::string> stop;  // the stop sequence that ended the content
  bool operator==(const ParsedOutput&) const = default;
};
ParsedOutput ParseOutput(const OutputFormat& format, std::string_view text);

// Joins streamed events into a ParsedOutput (adjacent pieces of the same kind concatenate).
ParsedOutput Accumulate(const std::vector<OutputEvent>& events);

// What decides a model's output format.
struct ModelTraits {
  std::string architecture;   // ModelInfo::architecture ("llama", "qwen3", "deepseek_v4", ...)
  std::string chat_template;  // Jinja source (empty when the prompt is DeepSeek's encoding)
  bool deepseek_v4_encoding = false;  // prompts rendered by tokenizer::EncodeDeepSeekV4
};
// The formats the model writes (no stop sequences), and where its output starts, from the
// markup the template wrote into the rendered prompt (trusted segments only, so text a user typed
// cannot change it): inside <think> when the last <think> is not closed, inside a DSML tool-calls
// block when the prompt ends by opening one. Set `tools` to kNone when the request declares no
// tools (or tool_choice is "none"), so that plain JSON answers are not taken for calls.
OutputFormat SelectOutputFormat(const ModelTraits& model, std::span<const PromptSegment> prompt);

}  // namespace dinfer::output
