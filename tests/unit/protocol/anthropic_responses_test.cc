// Anthropic Messages and OpenAI Responses: their inputs converted to chat messages, and their
// event streams and bodies.
#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

#include "server/protocol/anthropic.h"
#include "server/protocol/fields.h"
#include "server/protocol/responses.h"

namespace dinfer::server {
namespace {

namespace json = boost::json;

ApiResult<GenerationRequest> Messages(std::string_view body) {
  auto parsed = ParseBody(body);
  EXPECT_TRUE(parsed.ok()) << body;
  return ParseMessages(*parsed);
}

ApiResult<GenerationRequest> Responses(std::string_view body) {
  auto parsed = ParseBody(body);
  EXPECT_TRUE(parsed.ok()) << body;
  return ParseResponsesRequest(*parsed);
}

// (event name, data) of each SSE event.
std::vector<std::pair<std::string, json::object>> Events(const std::string& sse) {
  std::vector<std::pair<std::string, json::object>> out;
  size_t at = 0;
  while ((at = sse.find("event: ", at)) != std::string::npos) {
    const size_t nl = sse.find('\n', at);
    const size_t end = sse.find("\n\n", nl);
    out.emplace_back(sse.substr(at + 7, nl - at - 7),
                     json::parse(sse.substr(nl + 7, end - nl - 7)).as_object());
    at = end;
  }
  return out;
}

TEST(MessagesParse, ConvertsBlocksToChatMessages) {
  auto r = Messages(R"({"model":"m","max_tokens":100,"system":[{"type":"text","text":"sys"}],
      "messages":[
        {"role":"user","content":"hi"},
        {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},
          {"type":"text","text":"calling"},
          {"type":"tool_use","id":"toolu_1","name":"f","input":{"a":1}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",
          "content":[{"type":"text","text":"42"}]},{"type":"text","text":"thanks"}]}],
      "stop_sequences":["END"],"top_k":5,"temperature":0.2,
      "thinking":{"type":"enabled","budget_tokens":50},
      "tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}],
      "tool_choice":{"type":"auto"}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const json::array& m = r->messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], (json::object{{"role", "system"}, {"content", "sys"}}));
  EXPECT_EQ(m[1].at("content"), "hi");
  EXPECT_EQ(m[2].at("reasoning_content"), "hmm");
  EXPECT_EQ(m[2].at("content"), "calling");
  EXPECT_EQ(m[2].at("tool_calls").at(0).at("function").at("arguments"), R"({"a":1})");
  EXPECT_EQ(m[3], (json::object{{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "42"}}));
  EXPECT_EQ(m[4].at("content"), "thanks");
  EXPECT_EQ(r->stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*r->max_tokens, 100);
  EXPECT_EQ(*r->top_k, 5);
  EXPECT_EQ(r->template_kwargs.at("enable_thinking"), true);
  EXPECT_EQ(r->tools.at(0).at("function").at("parameters"), (json::object{{"type", "object"}}));
}

TEST(MessagesParse, FinalAssistantMessageIsContinued) {
  auto r = Messages(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},
                       {"role":"assistant","content":"The answer is"}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->continue_final_message);
  auto plain = Messages(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->continue_final_message);
}

TEST(MessagesParse, Errors) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"max_tokens":5,"messages":[{"role":"system","content":"x"}]})", "messages[0].role"},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})",
       "temperature"},
      {R"({"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":10},
          "messages":[{"role":"user","content":"x"}]})",
       "thinking.budget_tokens"},
      {R"({"max_tokens":5,"tools":[{"type":"web_search_20250305","name":"s"}],
          "messages":[{"role":"user","content":"x"}]})",
       "tools[0].type"},
      {R"({"max_tokens":5,"output_config":{"format":{"type":"json_schema"}},
          "messages":[{"role":"user","content":"x"}]})",
       "output_config.format"},
  };
  for (const auto& [body, param] : cases) {
    auto r = Messages(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().param, param) << body << ": " << r.error().message;
  }
  auto count = ParseCountTokens(*ParseBody(R"({"messages":[{"role":"user","content":"x"}]})"));
  EXPECT_TRUE(count.ok());
}

TEST(MessagesParse, OutputFormatAndForcedToolUse) {
  auto r = Messages(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->sampling.structured.type, "json_schema");
  EXPECT_EQ(r->structured_param, "output_config.format");
  auto tool = Messages(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}})");
  ASSERT_TRUE(tool.ok()) << tool.error().message;
  EXPECT_EQ(tool->structured_param, "tool_choice");
}

TEST(MessagesEncoder, StreamsContentBlocks) {
  auto enc = MakeMessagesEncoder(ResponseMeta{"msg_1", 0, "m"});
  std::string out;
  enc->StreamStart(Usage{10, 6, 0, 0}, out);
  ChoiceUpdate u;
  u.events = {{OutputEvent::Type::kReasoning, "hm", 0, "", ""},
              {OutputEvent::Type::kText, "A", 0, "", ""},
              {OutputEvent::Type::kText, "B", 0, "", ""},
              {OutputEvent::Type::kToolCallBegin, "", 0, "toolu_1", "f"},
              {OutputEvent::Type::kToolCallArgs, "{\"a\":1}", 0, "", ""}};
  u.finish = Finish::kToolCalls;
  enc->StreamUpdate(u, out);
  enc->StreamEnd(Usage{10, 6, 7, 0}, out);
  const auto events = Events(out);
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.first);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "message_start", "ping", "content_block_start", "content_block_delta",
                "content_block_stop", "content_block_start", "content_block_delta",
                "content_block_delta", "content_block_stop", "content_block_start",
                "content_block_delta", "content_block_stop", "message_delta", "message_stop"}));
  for (const auto& [name, data] : events) EXPECT_EQ(data.at("type").as_string(), name);
  const json::object& usage = events[0].second.at("message").at("usage").as_object();
  EXPECT_EQ(usage.at("input_tokens"), 4);
  EXPECT_EQ(usage.at("cache_read_input_tokens"), 6);
  EXPECT_EQ(events[3].second.at("delta").at("type"), "thinking_delta");
  EXPECT_EQ(events[6].second.at("delta").at("text"), "A");
  EXPECT_EQ(events[6].second.at("index"), 1);
  EXPECT_EQ(events[9].second.at("content_block").at("type"), "tool_use");
  EXPECT_EQ(events[10].second.at("delta").at("partial_json"), "{\"a\":1}");
  EXPECT_EQ(events[12].second.at("delta").at("stop_reason"), "tool_use");
  EXPECT_EQ(events[12].second.at("usage").at("output_tokens"), 7);
}

TEST(MessagesEncoder, BodyWithStopSequence) {
  auto enc = MakeMessagesEncoder(ResponseMeta{"msg_1", 0, "m"});
  ChoiceResult c;
  c.text = "Hi";
  c.finish = Finish::kStopSequence;
  c.stop_sequence = "END";
  const json::object body = json::parse(enc->Body({c}, Usage{5, 0, 2, 0})).as_object();
  EXPECT_EQ(body.at("type"), "message");
  EXPECT_EQ(body.at("stop_reason"), "stop_sequence");
  EXPECT_EQ(body.at("stop_sequence"), "END");
  EXPECT_EQ(body.at("content"), (json::array{json::object{{"type", "text"}, {"text", "Hi"}}}));
  EXPECT_EQ(body.at("usage").at("cache_creation_input_tokens"), 0);
}

TEST(MessagesEncoder, ToolInputThatIsNotJsonIsKept) {
  auto enc = MakeMessagesEncoder(ResponseMeta{"msg_1", 0, "m"});
  ChoiceResult c;
  c.tool_calls = {{"toolu_1", "f", "{broken"}};
  c.finish = Finish::kToolCalls;
  const json::object body = json::parse(enc->Body({c}, Usage{})).as_object();
  EXPECT_EQ(body.at("content").at(0).at("input").at("_raw"), "{broken");
  EXPECT_EQ(body.at("stop_reason"), "tool_use");
}

TEST(ResponsesParse, InputItemsBecomeChatMessages) {
  auto r = Responses(R"({"model":"m","instructions":"be brief","max_output_tokens":9,
      "reasoning":{"effort":"low"},"input":[
        {"role":"user","content":[{"type":"input_text","text":"hi"}]},
        {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
        {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
        {"type":"function_call_output","call_id":"c1","output":"1"},
        {"type":"reasoning","summary":[]}],
      "tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const json::array& m = r->messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].at("role"), "system");
  EXPECT_EQ(m[1].at("content"), "hi");
  EXPECT_EQ(m[2].at("tool_calls").as_array().size(), 2u);
  EXPECT_EQ(m[3].at("tool_call_id"), "c1");
  EXPECT_EQ(*r->max_tokens, 9);
  EXPECT_EQ(r->template_kwargs.at("reasoning_effort"), "low");
  EXPECT_EQ(r->tools.at(0).at("function").at("name"), "f");
  EXPECT_EQ(r->echo_fields.at("instructions"), "be brief");
}

TEST(ResponsesParse, Errors) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({})", "input"},
      {R"({"input":[]})", "input"},
      {R"({"input":5})", "input"},
      {R"({"input":[{"role":"wizard","content":"x"}]})", "input[0].role"},
      {R"({"input":[{"type":"image_generation_call"}]})", "input[0].type"},
      {R"({"input":"x","previous_response_id":"resp_1"})", "previous_response_id"},
      {R"({"input":"x","text":{"format":{"type":"json_schema"}}})", "text.format"},
      {R"({"input":"x","tools":[{"type":"web_search"}]})", "tools[0].type"},
      {R"({"input":"x","tools":[{"type":"function"}]})", "tools[0].name"},
  };
  for (const auto& [body, param] : cases) {
    auto r = Responses(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().param, param) << body << ": " << r.error().message;
  }
}

TEST(ResponsesParse, TextFormat) {
  auto r = Responses(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n",
                        "schema":{"type":"array"},"strict":true}}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->sampling.structured.type, "json_schema");
  EXPECT_EQ(r->structured_param, "text.format");
  auto object = Responses(R"({"input":"x","text":{"format":{"type":"json_object"}}})");
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object->sampling.structured.type, "json_object");
}

TEST(ResponsesEncoder, StreamsItemsWithSequenceNumbers) {
  auto req = Responses(R"({"input":"x","stream":true,"instructions":"i"})");
  ASSERT_TRUE(req.ok());
  auto enc = MakeResponsesEncoder(*req, ResponseMeta{"resp_1", 5, "m"});
  std::string out;
  enc->StreamStart(Usage{}, out);
  ChoiceUpdate u;
  u.events = {{OutputEvent::Type::kReasoning, "r", 0, "", ""},
              {OutputEvent::Type::kText, "A", 0, "", ""},
              {OutputEvent::Type::kText, "B", 0, "", ""},
              {OutputEvent::Type::kToolCallBegin, "", 0, "call_1", "f"},
              {OutputEvent::Type::kToolCallArgs, "{}", 0, "", ""}};
  u.finish = Finish::kToolCalls;
  enc->StreamUpdate(u, out);
  enc->StreamEnd(Usage{3, 1, 4, 0}, out);
  const auto events = Events(out);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].second.at("sequence_number"), static_cast<int64_t>(i));
    EXPECT_EQ(events[i].second.at("type").as_string(), events[i].first);
  }
  EXPECT_EQ(events.front().first, "response.created");
  EXPECT_EQ(events.back().first, "response.completed");
  const json::object& response = events.back().second.at("response").as_object();
  EXPECT_EQ(response.at("status"), "completed");
  EXPECT_EQ(response.at("instructions"), "i");
  const json::array& output = response.at("output").as_array();
  ASSERT_EQ(output.size(), 3u);
  EXPECT_EQ(output[0].at("type"), "reasoning");
  EXPECT_EQ(output[1].at("content").at(0).at("text"), "AB");
  EXPECT_EQ(output[2].at("type"), "function_call");
  EXPECT_EQ(output[2].at("arguments"), "{}");
  EXPECT_EQ(response.at("usage").at("input_tokens_details").at("cached_tokens"), 1);
  std::string text;
  for (const auto& [name, data] : events) {
    if (name == "response.output_text.delta") {
      text += data.at("delta").as_string();
      EXPECT_EQ(data.at("output_index"), 1);
    }
  }
  EXPECT_EQ(text, "AB");
}

TEST(ResponsesEncoder, LengthIsIncomplete) {
  auto req = Responses(R"({"input":"x"})");
  ASSERT_TRUE(req.ok());
  auto enc = MakeResponsesEncoder(*req, ResponseMeta{"resp_1", 5, "m"});
  ChoiceResult c;
  c.text = "partial";
  c.finish = Finish::kLength;
  const json::object body = json::parse(enc->Body({c}, Usage{})).as_object();
  EXPECT_EQ(body.at("status"), "incomplete");
  EXPECT_EQ(body.at("incomplete_details").at("reason"), "max_output_tokens");
  EXPECT_EQ(body.at("output").at(0).at("content").at(0).at("text"), "partial");
}

TEST(ErrorBody, AnthropicShape) {
  const json::object body =
      json::parse(ErrorBody(Api::kMessages, ApiError{ErrorKind::kRequestTooLarge, "big", "", ""}))
          .as_object();
  EXPECT_EQ(body.at("type"), "error");
  EXPECT_EQ(body.at("error").at("type"), "request_too_large");
  EXPECT_EQ(body.at("error").at("message"), "big");
}

}  // namespace
}  // namespace dinfer::server
