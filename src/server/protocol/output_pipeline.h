// What happens to a choice's text between the engine and the encoder: stop strings are matched
// (text that may be the start of one is held back), then the output parser separates content,
// reasoning and tool calls into OutputEvents. One ChoiceOutput per choice, used from one thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dinfer/engine.h"
#include "server/protocol/types.h"

namespace dinfer::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds generated text and returns the part that can be released. Once a stop string is
  // complete, returns the text before it and matched() names it; later text is dropped.
  std::string Push(std::string_view text);
  // The end of the output: whatever was held back.
  std::string Flush();
  const std::optional<std::string>& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::optional<std::string> matched_;
};

// Splits generated text into content, reasoning and tool-call events. The plain parser treats
// everything as content; models whose output carries reasoning or tool-call markup get theirs
// from MakeOutputParser.
class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual void Feed(std::string_view text, std::vector<OutputEvent>& events) = 0;
  // The end of the output: anything held back.
  virtual void Finish(std::vector<OutputEvent>& events) = 0;
};

std::unique_ptr<OutputParser> MakeOutputParser(const ModelInfo& model,
                                               const GenerationRequest& request);

// The text of token ids, for logprobs.
using DecodeFn = std::function<std::string(int32_t token)>;

class ChoiceOutput {
 public:
  ChoiceOutput(int index, const GenerationRequest& request, std::unique_ptr<OutputParser> parser,
               DecodeFn decode);
  // One engine output of this choice → the update to send (events may be empty).
  ChoiceUpdate Process(const RequestOutput& out);
  bool done() const { return result_.finish != Finish::kNone; }
  // Everything so far, for non-streaming responses.
  const ChoiceResult& result() const { return result_; }

 private:
  void Apply(const std::vector<OutputEvent>& events);

  ChoiceResult result_;
  StopMatcher stop_;
  std::unique_ptr<OutputParser> parser_;
  DecodeFn decode_;
  Api api_;
  bool logprobs_;
};

}  // namespace dinfer::server
