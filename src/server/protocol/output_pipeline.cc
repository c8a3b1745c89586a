#include "server/protocol/output_pipeline.h"

#include <algorithm>

#include "server/protocol/encoder.h"

namespace dinfer::server {

std::string StopMatcher::Push(std::string_view text) {
  if (matched_) return "";
  held_ += text;
  if (stops_.empty()) return std::exchange(held_, "");
  // The earliest complete stop string ends the output.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (matched_) {
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that could still grow into a stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() { return std::exchange(held_, ""); }

namespace {

class PlainTextParser final : public OutputParser {
 public:
  void Feed(std::string_view text, std::vector<OutputEvent>& events) override {
    if (text.empty()) return;
    if (!events.empty() && events.back().type == OutputEvent::Type::kText) {
      events.back().text += text;
    } else {
      events.push_back({OutputEvent::Type::kText, std::string(text), 0, "", ""});
    }
  }
  void Finish(std::vector<OutputEvent>&) override {}
};

Finish EngineFinish(const std::string& reason) {
  if (reason == "length") return Finish::kLength;
  if (reason == "abort") return Finish::kAbort;
  if (reason == "error") return Finish::kError;
  return Finish::kEndOfSequence;
}

}  // namespace

std::unique_ptr<OutputParser> MakeOutputParser(const ModelInfo&, const GenerationRequest&) {
  return std::make_unique<PlainTextParser>();
}

ChoiceOutput::ChoiceOutput(int index, const GenerationRequest& request,
                           std::unique_ptr<OutputParser> parser, DecodeFn decode)
    : stop_(request.stop),
      parser_(std::move(parser)),
      decode_(std::move(decode)),
      api_(request.api),
      logprobs_(request.logprobs) {
  result_.index = index;
}

ChoiceUpdate ChoiceOutput::Process(const RequestOutput& out) {
  ChoiceUpdate u;
  u.index = result_.index;
  if (done()) return u;
  result_.completion_tokens += static_cast<int64_t>(out.token_ids.size());
  if (logprobs_) {
    for (const TokenLogprob& lp : out.logprobs) {
      LogprobEntry e{decode_(lp.token), lp.logprob, {}};
      for (const auto& [token, logprob] : lp.top) e.top.emplace_back(decode_(token), logprob);
      u.logprobs.push_back(std::move(e));
    }
    result_.logprobs.insert(result_.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
  }
  Finish finish = Finish::kNone;
  parser_->Feed(stop_.Push(out.text), u.events);
  if (stop_.matched()) {
    parser_->Finish(u.events);
    finish = Finish::kStopSequence;
    u.stop_sequence = *stop_.matched();
  } else if (out.finished) {
    parser_->Feed(stop_.Flush(), u.events);
    parser_->Finish(u.events);
    finish = EngineFinish(out.finish_reason);
    u.error = out.error;
  }
  for (OutputEvent& e : u.events) {
    if (e.type == OutputEvent::Type::kToolCallBegin && e.id.empty()) {
      e.id = NewId(api_ == Api::kMessages ? "toolu_" : "call_");
    }
  }
  Apply(u.events);
  if (finish == Finish::kEndOfSequence && !result_.tool_calls.empty()) finish = Finish::kToolCalls;
  u.finish = result_.finish = finish;
  result_.stop_sequence = u.stop_sequence;
  result_.error = u.error;
  return u;
}

void ChoiceOutput::Apply(const std::vector<OutputEvent>& events) {
  for (const OutputEvent& e : events) {
    switch (e.type) {
      case OutputEvent::Type::kText:
        result_.text += e.text;
        break;
      case OutputEvent::Type::kReasoning:
        result_.reasoning += e.text;
        break;
      case OutputEvent::Type::kToolCallBegin:
        result_.tool_calls.push_back({e.id, e.name, ""});
        break;
      case OutputEvent::Type::kToolCallArgs:
        if (e.tool_index >= 0 && static_cast<size_t>(e.tool_index) < result_.tool_calls.size()) {
          result_.tool_calls[static_cast<size_t>(e.tool_index)].arguments += e.text;
        }
        break;
    }
  }
}

}  // namespace dinfer::server
