// Chat Completions and Completions: request parsing (fields, errors naming the parameter) and the
// response shapes, streamed and not.
#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "server/protocol/fields.h"
#include "server/protocol/openai.h"

namespace dinfer::server {
namespace {

namespace json = boost::json;

ApiResult<GenerationRequest> Chat(std::string_view body) {
  auto parsed = ParseBody(body);
  EXPECT_TRUE(parsed.ok()) << body;
  return ParseChatCompletion(*parsed);
}

ApiResult<GenerationRequest> Completion(std::string_view body) {
  auto parsed = ParseBody(body);
  EXPECT_TRUE(parsed.ok()) << body;
  return ParseCompletion(*parsed);
}

// The JSON objects of "data: ..." lines ([DONE] excluded).
std::vector<json::object> Events(const std::string& sse) {
  std::vector<json::object> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const std::string data = sse.substr(at + 6, end - at - 6);
    if (data != "[DONE]") out.push_back(json::parse(data).as_object());
    at = end;
  }
  return out;
}

TEST(ChatCompletionParse, ReadsSamplingAndLimits) {
  auto r = Chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,
                   "top_p":0.9,"top_k":40,"min_p":0.1,"seed":-1,"max_tokens":10,
                   "max_completion_tokens":20,"n":3,"stop":["a","b"],"presence_penalty":1,
                   "frequency_penalty":-1,"repetition_penalty":1.1,"logit_bias":{"42":-100},
                   "logprobs":true,"top_logprobs":5,"stream":true,
                   "stream_options":{"include_usage":true}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "m");
  EXPECT_DOUBLE_EQ(*r->temperature, 0.5);
  EXPECT_DOUBLE_EQ(*r->top_p, 0.9);
  EXPECT_EQ(*r->top_k, 40);
  EXPECT_DOUBLE_EQ(r->sampling.min_p, 0.1);
  EXPECT_EQ(*r->sampling.seed, static_cast<uint64_t>(-1));
  EXPECT_EQ(*r->max_tokens, 20);  // max_completion_tokens wins
  EXPECT_EQ(r->sampling.n, 3);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(r->sampling.presence_penalty, 1.0);
  EXPECT_DOUBLE_EQ(r->sampling.frequency_penalty, -1.0);
  EXPECT_DOUBLE_EQ(r->sampling.repetition_penalty, 1.1);
  ASSERT_EQ(r->sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r->sampling.logit_bias[0], (std::pair<int32_t, float>{42, -100.0f}));
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 5);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

TEST(ChatCompletionParse, NullMeansUnset) {
  auto r = Chat(R"({"messages":[{"role":"user","content":"hi"}],"temperature":null,"stop":null,
                   "max_tokens":null,"tools":null})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->temperature.has_value());
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_TRUE(r->stop.empty());
}

TEST(ChatCompletionParse, NormalisesMessages) {
  auto r = Chat(R"({"messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].at("role"), "system");
  EXPECT_EQ(r->messages[1].at("content"), "a\nb");
  EXPECT_EQ(r->messages[2].at("content"), "");
  EXPECT_EQ(r->messages[2].at("tool_calls").at(0).at("id"), "c1");
  EXPECT_EQ(r->messages[3].at("tool_call_id"), "c1");
}

TEST(ChatCompletionParse, ErrorsNameTheParameter) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages":[]})", "messages"},
      {R"({})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0]"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":2.5})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":129})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":500}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{}})", "stream_options"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})",
       "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},
          "structured_outputs":{"regex":"a"}})",
       "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"structured_outputs":{"regex":"a",
          "choice":["b"]}})",
       "structured_outputs"},
      {R"({"messages":[{"role":"user","content":"x"}],"structured_outputs":{"choice":[1]}})",
       "structured_outputs.choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})",
       "continue_final_message"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
          "function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice"},
  };
  for (const auto& [body, param] : cases) {
    auto r = Chat(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().param, param) << body << ": " << r.error().message;
    EXPECT_EQ(r.error().kind, ErrorKind::kInvalidRequest);
    EXPECT_FALSE(r.error().message.empty());
  }
}

TEST(ChatCompletionParse, ToolChoiceModes) {
  const char* tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}])";
  auto none = Chat(fmt::format(R"({{"messages":[{{"role":"user","content":"x"}}],{},
                                  "tool_choice":"none"}})",
                               tools));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(none->tools.size(), 1u);
  auto required = Chat(fmt::format(R"({{"messages":[{{"role":"user","content":"x"}}],{},
                                      "tool_choice":"required"}})",
                                   tools));
  ASSERT_TRUE(required.ok());
  EXPECT_EQ(required->structured_param, "tool_choice");
  EXPECT_EQ(required->sampling.structured.type, "json_schema");
}

// Forced calls become one JSON Schema: {"name": const, "parameters": the tool's schema} for each
// tool allowed, with the tools' own references rebased to where their schema now sits.
TEST(ChatCompletionParse, ForcedToolCallSchema) {
  auto req = Chat(R"({"messages":[{"role":"user","content":"x"}],"tools":[
      {"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"u":{"$ref":"#/$defs/u"}},"$defs":{"u":{"enum":["a"]}}}}},
      {"type":"function","function":{"name":"g"}}],
      "tool_choice":{"type":"function","function":{"name":"f"}}})");
  ASSERT_TRUE(req.ok()) << req.error().message;
  const json::value schema = json::parse(req->sampling.structured.value);
  const json::array& any = schema.at("anyOf").as_array();
  ASSERT_EQ(any.size(), 1u);
  const json::object& props = any[0].at("properties").as_object();
  EXPECT_EQ(props.at("name").at("const"), "f");
  EXPECT_EQ(props.at("parameters").at("properties").at("u").at("$ref"),
            "#/anyOf/0/properties/parameters/$defs/u");
  auto all = Chat(R"({"messages":[{"role":"user","content":"x"}],"tools":[
      {"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],
      "tool_choice":"required"})");
  ASSERT_TRUE(all.ok());
  const json::value both = json::parse(all->sampling.structured.value);
  ASSERT_EQ(both.at("anyOf").as_array().size(), 2u);
  EXPECT_EQ(both.at("anyOf").at(1).at("properties").at("parameters"),
            json::parse(R"({"type":"object"})"));
}

TEST(ChatCompletionParse, StructuredOutputFields) {
  auto schema = Chat(R"({"messages":[{"role":"user","content":"x"}],"response_format":{
      "type":"json_schema","json_schema":{"name":"p","schema":{"type":"integer"},"strict":true}}})");
  ASSERT_TRUE(schema.ok());
  EXPECT_EQ(schema->sampling.structured.type, "json_schema");
  EXPECT_EQ(json::parse(schema->sampling.structured.value), json::parse(R"({"type":"integer"})"));
  EXPECT_EQ(schema->structured_param, "response_format.json_schema");
  auto object = Chat(R"({"messages":[{"role":"user","content":"x"}],
                        "response_format":{"type":"json_object"}})");
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object->sampling.structured.type, "json_object");
  auto text = Chat(R"({"messages":[{"role":"user","content":"x"}],
                      "response_format":{"type":"text"}})");
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(text->sampling.structured.type.empty());
  auto choice = Chat(R"({"messages":[{"role":"user","content":"x"}],
      "structured_outputs":{"choice":["yes","no"],"disable_any_whitespace":true}})");
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->sampling.structured.type, "choice");
  EXPECT_EQ(choice->sampling.structured.choices, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ(choice->sampling.structured.max_whitespace, 0);
  auto guided = Chat(R"({"messages":[{"role":"user","content":"x"}],"guided_regex":"[a-z]+"})");
  ASSERT_TRUE(guided.ok());
  EXPECT_EQ(guided->sampling.structured.type, "regex");
  EXPECT_EQ(guided->sampling.structured.value, "[a-z]+");
  EXPECT_EQ(guided->structured_param, "guided_regex");
}

TEST(ChatEncoder, StreamsChunksThenUsageThenDone) {
  auto req = Chat(R"({"messages":[{"role":"user","content":"x"}],"n":2,"stream":true,
                     "stream_options":{"include_usage":true}})");
  ASSERT_TRUE(req.ok());
  auto enc = MakeChatEncoder(*req, ResponseMeta{"chatcmpl-1", 1700000000, "m"});
  std::string out;
  enc->StreamStart(Usage{}, out);
  ChoiceUpdate u;
  u.index = 1;
  u.events = {{OutputEvent::Type::kReasoning, "think", 0, "", ""},
              {OutputEvent::Type::kText, "Hel", 0, "", ""},
              {OutputEvent::Type::kText, "lo", 0, "", ""},
              {OutputEvent::Type::kToolCallBegin, "", 0, "call_1", "f"},
              {OutputEvent::Type::kToolCallArgs, "{\"a\":", 0, "", ""}};
  u.finish = Finish::kToolCalls;
  enc->StreamUpdate(u, out);
  enc->StreamEnd(Usage{10, 4, 5, 0}, out);
  EXPECT_EQ(out.substr(out.size() - 14), "data: [DONE]\n\n");
  const auto events = Events(out);
  ASSERT_EQ(events.size(), 5u);
  for (int i = 0; i < 2; ++i) {
    const auto& delta = events[i].at("choices").at(0).at("delta");
    EXPECT_EQ(events[i].at("choices").at(0).at("index"), i);
    EXPECT_EQ(delta.at("role"), "assistant");
  }
  const auto& chunk = events[2];
  EXPECT_EQ(chunk.at("object"), "chat.completion.chunk");
  EXPECT_EQ(chunk.at("id"), "chatcmpl-1");
  const auto& delta = chunk.at("choices").at(0).at("delta").as_object();
  EXPECT_EQ(delta.at("content"), "Hello");
  EXPECT_EQ(delta.at("reasoning_content"), "think");
  EXPECT_EQ(delta.at("tool_calls").at(0).at("id"), "call_1");
  EXPECT_EQ(delta.at("tool_calls").at(1).at("function").at("arguments"), "{\"a\":");
  EXPECT_EQ(events[3].at("choices").at(0).at("finish_reason"), "tool_calls");
  EXPECT_TRUE(events[4].at("choices").as_array().empty());
  EXPECT_EQ(events[4].at("usage").at("prompt_tokens_details").at("cached_tokens"), 4);
  EXPECT_EQ(events[4].at("usage").at("total_tokens"), 15);
}

TEST(ChatEncoder, Body) {
  auto req = Chat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})");
  ASSERT_TRUE(req.ok());
  auto enc = MakeChatEncoder(*req, ResponseMeta{"chatcmpl-1", 1700000000, "m"});
  ChoiceResult c;
  c.tool_calls = {{"call_1", "f", "{}"}};
  c.finish = Finish::kToolCalls;
  c.logprobs = {{"x", -0.5f, {{"x", -0.5f}, {"y", -1.5f}}}};
  const json::object body = json::parse(enc->Body({c}, Usage{3, 0, 1, 0})).as_object();
  EXPECT_EQ(body.at("object"), "chat.completion");
  EXPECT_EQ(body.at("created"), 1700000000);
  const auto& choice = body.at("choices").at(0);
  EXPECT_TRUE(choice.at("message").at("content").is_null());
  EXPECT_EQ(choice.at("message").at("tool_calls").at(0).at("function").at("name"), "f");
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  EXPECT_EQ(choice.at("logprobs").at("content").at(0).at("top_logprobs").as_array().size(), 2u);
  EXPECT_EQ(choice.at("logprobs").at("content").at(0).at("bytes"), json::array{'x'});
}

TEST(CompletionParse, PromptShapes) {
  auto text = Completion(R"({"prompt":"hi"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->prompts.size(), 1u);
  EXPECT_EQ(text->prompts[0].text, "hi");
  auto ids = Completion(R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  auto batch = Completion(R"({"prompt":["a",[4,5]],"logprobs":2,"echo":false})");
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->prompts.size(), 2u);
  EXPECT_EQ(batch->prompts[1].ids, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(batch->logprobs);
  EXPECT_EQ(batch->top_logprobs, 2);
  for (const char* bad : {R"({})", R"({"prompt":[]})", R"({"prompt":[1,"a"]})",
                          R"({"prompt":[-1]})", R"({"prompt":""})", R"({"prompt":{}})"}) {
    auto r = Completion(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().param, "prompt") << bad;
  }
  auto suffix = Completion(R"({"prompt":"a","suffix":"b"})");
  ASSERT_FALSE(suffix.ok());
  EXPECT_EQ(suffix.error().param, "suffix");
}

TEST(CompletionEncoder, EchoAndLogprobOffsets) {
  auto req = Completion(R"({"prompt":"Hi","echo":true,"stream":true})");
  ASSERT_TRUE(req.ok());
  auto enc = MakeCompletionEncoder(*req, ResponseMeta{"cmpl-1", 1, "m"});
  std::string out;
  enc->StreamStart(Usage{}, out);
  ChoiceUpdate u;
  u.events = {{OutputEvent::Type::kText, " there", 0, "", ""}};
  u.finish = Finish::kLength;
  enc->StreamUpdate(u, out);
  enc->StreamEnd(Usage{}, out);
  const auto events = Events(out);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].at("choices").at(0).at("text"), "Hi");
  EXPECT_EQ(events[1].at("choices").at(0).at("text"), " there");
  EXPECT_EQ(events[2].at("choices").at(0).at("finish_reason"), "length");

  auto lp_req = Completion(R"({"prompt":"Hi","logprobs":1})");
  ASSERT_TRUE(lp_req.ok());
  auto lp_enc = MakeCompletionEncoder(*lp_req, ResponseMeta{"cmpl-2", 1, "m"});
  ChoiceResult c;
  c.text = "ab c";
  c.logprobs = {{"ab", -0.1f, {{"ab", -0.1f}}}, {" c", -0.2f, {{" c", -0.2f}}}};
  c.finish = Finish::kEndOfSequence;
  const json::object body = json::parse(lp_enc->Body({c}, Usage{})).as_object();
  const auto& lp = body.at("choices").at(0).at("logprobs");
  EXPECT_EQ(lp.at("text_offset"), (json::array{0, 2}));
  EXPECT_EQ(lp.at("top_logprobs").at(1).at(" c").as_double(), static_cast<double>(-0.2f));
  EXPECT_EQ(body.at("choices").at(0).at("finish_reason"), "stop");
}

TEST(ErrorBody, OpenAiShape) {
  ApiError e = InvalidParam("temperature", "too hot");
  const json::object body = json::parse(ErrorBody(Api::kChatCompletions, e)).as_object();
  EXPECT_EQ(body.at("error").at("message"), "too hot");
  EXPECT_EQ(body.at("error").at("type"), "invalid_request_error");
  EXPECT_EQ(body.at("error").at("param"), "temperature");
  EXPECT_TRUE(body.at("error").at("code").is_null());
  const json::object auth =
      json::parse(ErrorBody(Api::kCompletions, ApiError{ErrorKind::kAuthentication, "no", "", ""}))
          .as_object();
  EXPECT_EQ(auth.at("error").at("code"), "invalid_api_key");
  EXPECT_EQ(HttpStatus(ErrorKind::kAuthentication), 401u);
  EXPECT_EQ(HttpStatus(ErrorKind::kOverloaded), 503u);
}

}  // namespace
}  // namespace dinfer::server
