// Stop strings across chunk boundaries, and how a choice's engine outputs become updates.
#include "server/protocol/output_pipeline.h"

#include <gtest/gtest.h>

namespace dinfer::server {
namespace {

TEST(StopMatcher, HoldsBackPossibleStarts) {
  StopMatcher m({"STOP", "xyz"});
  EXPECT_EQ(m.Push("hello S"), "hello ");
  EXPECT_EQ(m.Push("T"), "");
  EXPECT_EQ(m.Push("ART x"), "START ");
  EXPECT_EQ(m.Push("y"), "");
  EXPECT_EQ(m.Flush(), "xy");
  EXPECT_FALSE(m.matched().has_value());
}

TEST(StopMatcher, MatchesAcrossChunksAndDropsTheRest) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("abc ST"), "abc ");
  EXPECT_EQ(m.Push("OP and more"), "");
  ASSERT_TRUE(m.matched().has_value());
  EXPECT_EQ(*m.matched(), "STOP");
  EXPECT_EQ(m.Push("later"), "");
}

TEST(StopMatcher, EarliestStopWins) {
  StopMatcher m({"world", "o w"});
  EXPECT_EQ(m.Push("hello world"), "hell");
  EXPECT_EQ(*m.matched(), "o w");
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
}

// Emits a tool call for text "<call>" and content otherwise: a stand-in for a model's parser.
class CallParser final : public OutputParser {
 public:
  void Feed(std::string_view text, std::vector<OutputEvent>& events) override {
    if (text == "<call>") {
      events.push_back({OutputEvent::Type::kToolCallBegin, "", 0, "", "f"});
      events.push_back({OutputEvent::Type::kToolCallArgs, "{}", 0, "", ""});
    } else if (!text.empty()) {
      events.push_back({OutputEvent::Type::kText, std::string(text), 0, "", ""});
    }
  }
  void Finish(std::vector<OutputEvent>&) override {}
};

RequestOutput Out(std::string text, std::vector<int32_t> ids, std::string finish = "") {
  RequestOutput o;
  o.text = std::move(text);
  o.token_ids = std::move(ids);
  o.finished = !finish.empty();
  o.finish_reason = std::move(finish);
  return o;
}

TEST(ChoiceOutput, StopSequenceEndsTheChoice) {
  GenerationRequest req;
  req.stop = {"\n\n"};
  ChoiceOutput c(3, req, MakeOutputParser(ModelInfo{}, req), [](int32_t) { return ""; });
  ChoiceUpdate u = c.Process(Out("Hi\n", {1, 2}));
  EXPECT_EQ(u.index, 3);
  EXPECT_EQ(u.events.size(), 1u);
  EXPECT_EQ(u.finish, Finish::kNone);
  u = c.Process(Out("\nmore", {3}));
  EXPECT_TRUE(u.events.empty());
  EXPECT_EQ(u.finish, Finish::kStopSequence);
  EXPECT_EQ(u.stop_sequence, "\n\n");
  EXPECT_TRUE(c.done());
  EXPECT_EQ(c.result().text, "Hi");
  EXPECT_EQ(c.result().completion_tokens, 3);
  // Outputs the engine produced before it saw the abort change nothing.
  u = c.Process(Out("x", {4}, "abort"));
  EXPECT_EQ(u.finish, Finish::kNone);
  EXPECT_EQ(c.result().finish, Finish::kStopSequence);
}

TEST(ChoiceOutput, FinishReasonsAndHeldBackTextAtTheEnd) {
  GenerationRequest req;
  req.stop = {"END"};
  ChoiceOutput c(0, req, MakeOutputParser(ModelInfo{}, req), [](int32_t) { return ""; });
  c.Process(Out("text E", {1}));
  const ChoiceUpdate u = c.Process(Out("N", {2}, "length"));
  EXPECT_EQ(u.finish, Finish::kLength);
  EXPECT_EQ(c.result().text, "text EN");
  GenerationRequest plain;
  ChoiceOutput eos(0, plain, MakeOutputParser(ModelInfo{}, plain), [](int32_t) { return ""; });
  EXPECT_EQ(eos.Process(Out("", {}, "stop")).finish, Finish::kEndOfSequence);
  ChoiceOutput err(0, plain, MakeOutputParser(ModelInfo{}, plain), [](int32_t) { return ""; });
  const ChoiceUpdate e = err.Process(Out("", {}, "error"));
  EXPECT_EQ(e.finish, Finish::kError);
}

TEST(ChoiceOutput, ToolCallsGetIdsAndFinishAsToolCalls) {
  GenerationRequest req;
  req.api = Api::kMessages;
  ChoiceOutput c(0, req, std::make_unique<CallParser>(), [](int32_t) { return ""; });
  ChoiceUpdate u = c.Process(Out("<call>", {1}));
  ASSERT_EQ(u.events.size(), 2u);
  EXPECT_EQ(u.events[0].id.rfind("toolu_", 0), 0u);
  u = c.Process(Out("", {2}, "stop"));
  EXPECT_EQ(u.finish, Finish::kToolCalls);
  ASSERT_EQ(c.result().tool_calls.size(), 1u);
  EXPECT_EQ(c.result().tool_calls[0].name, "f");
  EXPECT_EQ(c.result().tool_calls[0].arguments, "{}");
}

TEST(ChoiceOutput, LogprobsCarryTokenText) {
  GenerationRequest req;
  req.logprobs = true;
  ChoiceOutput c(0, req, MakeOutputParser(ModelInfo{}, req),
                 [](int32_t t) { return "t" + std::to_string(t); });
  RequestOutput o = Out("x", {5});
  o.logprobs = {TokenLogprob{5, -0.25f, {{5, -0.25f}, {6, -2.0f}}}};
  const ChoiceUpdate u = c.Process(o);
  ASSERT_EQ(u.logprobs.size(), 1u);
  EXPECT_EQ(u.logprobs[0].token, "t5");
  EXPECT_EQ(u.logprobs[0].top[1].first, "t6");
  EXPECT_EQ(c.result().logprobs.size(), 1u);
}

}  // namespace
}  // namespace dinfer::server
