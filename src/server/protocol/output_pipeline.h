// ChoiceOutput: what happens to one choice's engine outputs before an encoder sees them — the
// output parser (output::OutputParser: content, reasoning, tool calls, stop sequences) turns the
// text into events, logprobs get their token text, and the engine's finish reason becomes the
// neutral Finish. One ChoiceOutput per choice, used from one thread.
#pragma once

#include <functional>
#include <string>

#include "dinfer/engine.h"
#include "server/output/output_parser.h"
#include "server/protocol/types.h"

namespace dinfer::server {

// The text of a token id, for logprobs.
using DecodeFn = std::function<std::string(int32_t token)>;

class ChoiceOutput {
 public:
  // `format` says how the model writes reasoning and tool calls and holds the request's stop
  // sequences.
  ChoiceOutput(int index, const GenerationRequest& request, output::OutputFormat format,
               DecodeFn decode);
  // One engine output of this choice → the update to send (events may be empty).
  ChoiceUpdate Process(const RequestOutput& out);
  bool done() const { return result_.finish != Finish::kNone; }
  // Everything so far, for non-streaming responses.
  const ChoiceResult& result() const { return result_; }

 private:
  void Apply(const std::vector<OutputEvent>& events);

  ChoiceResult result_;
  bool in_reasoning_;  // the output is inside reasoning (for counting reasoning tokens)
  output::OutputParser parser_;
  DecodeFn decode_;
  bool logprobs_;
};

}  // namespace dinfer::server
