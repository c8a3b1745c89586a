#include "server/protocol/output_pipeline.h"

namespace dinfer::server {

namespace {

Finish EngineFinish(const std::string& reason) {
  if (reason == "length") return Finish::kLength;
  if (reason == "abort") return Finish::kAbort;
  if (reason == "error") return Finish::kError;
  return Finish::kEndOfSequence;
}

}  // namespace

ChoiceOutput::ChoiceOutput(int index, const GenerationRequest& request, output::OutputFormat format,
                           DecodeFn decode)
    : in_reasoning_(format.starts_in_reasoning),
      parser_(std::move(format)),
      decode_(std::move(decode)),
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
  u.events = parser_.Push(out.text);
  if (out.finished && !parser_.stopped()) {
    std::vector<OutputEvent> rest = parser_.Finish();
    u.events.insert(u.events.end(), rest.begin(), rest.end());
  }
  Apply(u.events);
  // Usage counts reasoning in tokens: a delta's tokens are reasoning when all it produced was
  // reasoning, or when it produced nothing (held back) inside reasoning. Deltas are a token or a
  // few, so the boundary is off by a token at most.
  bool reasoning = false, other = false;
  for (const OutputEvent& e : u.events) {
    (e.type == OutputEvent::Type::kReasoning ? reasoning : other) = true;
  }
  if (reasoning || other) in_reasoning_ = reasoning && !other;
  if (in_reasoning_) result_.reasoning_tokens += static_cast<int64_t>(out.token_ids.size());
  for (const OutputEvent& e : u.events) {
    if (e.type == OutputEvent::Type::kStop) {
      u.finish = Finish::kStopSequence;
      u.stop_sequence = e.text;
    }
  }
  if (u.finish == Finish::kNone && out.finished) {
    u.finish = EngineFinish(out.finish_reason);
    u.error = out.error;
    if (u.finish == Finish::kEndOfSequence && parser_.tool_calls() > 0) {
      u.finish = Finish::kToolCalls;
    }
  }
  result_.finish = u.finish;
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
      case OutputEvent::Type::kToolCallEnd:
      case OutputEvent::Type::kStop:
        break;
    }
  }
}

}  // namespace dinfer::server
