// How a choice's engine outputs become updates: stop sequences, tool calls and reasoning from
// the output parser, finish reasons, and logprobs with their token text.
#include "server/protocol/output_pipeline.h"

#include <gtest/gtest.h>

namespace dinfer::server {
namespace {

RequestOutput Out(std::string text, std::vector<int32_t> ids, std::string finish = "") {
  RequestOutput o;
  o.text = std::move(text);
  o.token_ids = std::move(ids);
  o.finished = !finish.empty();
  o.finish_reason = std::move(finish);
  return o;
}

std::string NoText(int32_t) { return ""; }

TEST(ChoiceOutput, StopSequenceEndsTheChoice) {
  GenerationRequest req;
  output::OutputFormat f;
  f.stop = {"\n\n"};
  ChoiceOutput c(3, req, f, NoText);
  ChoiceUpdate u = c.Process(Out("Hi\n", {1, 2}));
  EXPECT_EQ(u.index, 3);
  EXPECT_EQ(u.finish, Finish::kNone);
  u = c.Process(Out("\nmore", {3}));
  EXPECT_EQ(u.finish, Finish::kStopSequence);
  EXPECT_EQ(u.stop_sequence, "\n\n");
  EXPECT_TRUE(c.done());
  EXPECT_EQ(c.result().text, "Hi");
  EXPECT_EQ(c.result().completion_tokens, 3);
  // What the engine produced before it saw the abort changes nothing.
  u = c.Process(Out("x", {4}, "abort"));
  EXPECT_EQ(u.finish, Finish::kNone);
  EXPECT_TRUE(u.events.empty());
  EXPECT_EQ(c.result().finish, Finish::kStopSequence);
}

TEST(ChoiceOutput, EngineFinishReasonsAndHeldBackText) {
  GenerationRequest req;
  output::OutputFormat f;
  f.stop = {"END"};
  ChoiceOutput c(0, req, f, NoText);
  c.Process(Out("text E", {1}));
  EXPECT_EQ(c.result().text, "text ");  // "E" may start "END"
  EXPECT_EQ(c.Process(Out("N", {2}, "length")).finish, Finish::kLength);
  EXPECT_EQ(c.result().text, "text EN");
  ChoiceOutput eos(0, req, {}, NoText);
  EXPECT_EQ(eos.Process(Out("", {}, "stop")).finish, Finish::kEndOfSequence);
  ChoiceOutput err(0, req, {}, NoText);
  RequestOutput e = Out("", {}, "error");
  e.error = "boom";
  const ChoiceUpdate u = err.Process(e);
  EXPECT_EQ(u.finish, Finish::kError);
  EXPECT_EQ(u.error, "boom");
}

TEST(ChoiceOutput, ToolCallsFinishAsToolCalls) {
  GenerationRequest req;
  output::OutputFormat f;
  f.tools = output::ToolCallFormat::kHermes;
  f.tool_call_id = [](int i) { return "toolu_" + std::to_string(i); };
  ChoiceOutput c(0, req, f, NoText);
  c.Process(Out("<tool_call>\n{\"name\": \"get_weather\", ", {1}));
  c.Process(Out("\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", {2}));
  const ChoiceUpdate u = c.Process(Out("", {3}, "stop"));
  EXPECT_EQ(u.finish, Finish::kToolCalls);
  ASSERT_EQ(c.result().tool_calls.size(), 1u);
  EXPECT_EQ(c.result().tool_calls[0].id, "toolu_0");
  EXPECT_EQ(c.result().tool_calls[0].name, "get_weather");
  EXPECT_EQ(c.result().tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(c.result().text, "");
}

TEST(ChoiceOutput, ReasoningIsSeparated) {
  GenerationRequest req;
  output::OutputFormat f;
  f.reasoning = output::ReasoningFormat::kThink;
  f.starts_in_reasoning = true;
  ChoiceOutput c(0, req, f, NoText);
  c.Process(Out("Let me think.</think>", {1, 2}));
  c.Process(Out("Paris.", {3}, "stop"));
  EXPECT_EQ(c.result().reasoning, "Let me think.");
  EXPECT_EQ(c.result().text, "Paris.");
  EXPECT_EQ(c.result().reasoning_tokens, 2);
  EXPECT_EQ(c.result().completion_tokens, 3);
  EXPECT_EQ(c.result().finish, Finish::kEndOfSequence);
}

TEST(ChoiceOutput, LogprobsCarryTokenText) {
  GenerationRequest req;
  req.logprobs = true;
  ChoiceOutput c(0, req, {}, [](int32_t t) { return "t" + std::to_string(t); });
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
