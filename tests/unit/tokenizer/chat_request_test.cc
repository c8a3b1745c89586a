// Request preparation for chat templates: content format detection, tool-call arguments parsed
// from JSON strings, text parts joined, continue_final_message and documents options.

#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include "tokenizer/chat_template.h"
#include "unit/tokenizer/test_util.h"

namespace dinfer::tokenizer {
namespace {

namespace json = boost::json;

ChatTemplate Load(const std::string& name) {
  auto text = ReadFileToString(DINFER_SOURCE_DIR "/tests/data/chat_templates/" + name + ".jinja");
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  auto t = ChatTemplate::Parse(*text);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(ChatRequest, ContentFormatFollowsTheTemplate) {
  // The templates that loop over message['content'] read parts; the others want strings.
  const std::set<std::string> parts = {"gemma3", "mistral-small-3.2", "devstral-small", "kimi-k2"};
  for (const char* name :
       {"smollm2", "qwen2.5", "qwen3", "llama-3.1", "llama-3.2", "mistral-v0.3", "mistral-nemo",
        "deepseek-v3", "deepseek-r1", "gemma3", "mistral-small-3.2", "devstral-small", "kimi-k2"}) {
    EXPECT_EQ(Load(name).content_format(),
              parts.count(name) ? ContentFormat::kParts : ContentFormat::kString)
        << name;
  }
  auto filtered = ChatTemplate::Parse("{% for p in m.content|reverse %}{{ p }}{% endfor %}");
  ASSERT_TRUE(filtered.ok());
  EXPECT_EQ(filtered->content_format(), ContentFormat::kParts);
}

TEST(ChatRequest, ToolCallArgumentsBecomeObjects) {
  json::array messages = json::parse(R"([
    {"role": "user", "content": "x"},
    {"role": "assistant", "tool_calls": [
      {"type": "function", "function": {"name": "a", "arguments": "{\"q\": [1, \"<|x|>\"]}"}},
      {"type": "function", "function": {"name": "b", "arguments": ""}},
      {"type": "function", "function": {"name": "c"}},
      {"type": "function", "function": {"name": "d", "arguments": {"already": true}}}]}])")
                             .as_array();
  ASSERT_TRUE(ParseToolCallArguments(&messages).ok());
  const json::array& calls = messages[1].at("tool_calls").as_array();
  EXPECT_EQ(calls[0].at("function").at("arguments"), json::parse(R"({"q": [1, "<|x|>"]})"));
  EXPECT_EQ(calls[1].at("function").at("arguments"), json::object());
  EXPECT_EQ(calls[2].at("function").at("arguments"), json::object());
  EXPECT_EQ(calls[3].at("function").at("arguments"), json::parse(R"({"already": true})"));

  json::array bad = json::parse(R"([{"role": "assistant", "tool_calls": [
      {"type": "function", "function": {"name": "a", "arguments": "{not json"}}]}])")
                        .as_array();
  const Status s = ParseToolCallArguments(&bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("messages[0]"), std::string::npos) << s.message();
}

TEST(ChatRequest, TextPartsJoinForStringTemplates) {
  json::array messages = json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
    {"role": "assistant", "content": "plain"}])")
                             .as_array();
  ASSERT_TRUE(FlattenTextContent(&messages).ok());
  EXPECT_EQ(messages[0].at("content"), "one\ntwo");
  EXPECT_EQ(messages[1].at("content"), "plain");
  // Qwen2.5 concatenates content as a string: it renders once the parts are joined.
  ChatRenderOptions o;
  auto segments = Load("qwen2.5").Render(messages, o);
  ASSERT_TRUE(segments.ok()) << segments.status().ToString();
  EXPECT_NE(ChatTemplate::Join(*segments).find("user\none\ntwo<|im_end|>"), std::string::npos);

  json::array image = json::parse(R"([{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "x"}}]}])")
                          .as_array();
  EXPECT_EQ(FlattenTextContent(&image).code(), StatusCode::kInvalidArgument);
}

TEST(ChatRequest, ContinueFinalMessageRules) {
  const ChatTemplate t = Load("qwen2.5");
  const json::array messages =
      json::parse(
          R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}])")
          .as_array();
  ChatRenderOptions o;
  o.continue_final_message = true;
  // It excludes the generation prompt, as in transformers.
  EXPECT_EQ(t.Render(messages, o).status().code(), StatusCode::kInvalidArgument);
  o.add_generation_prompt = false;
  auto segments = t.Render(messages, o);
  ASSERT_TRUE(segments.ok()) << segments.status().ToString();
  const std::string text = ChatTemplate::Join(*segments);
  EXPECT_EQ(text.substr(text.size() - 28), "<|im_start|>assistant\nSure, ");
  // The continued message keeps its provenance: the user's text stays untrusted.
  EXPECT_FALSE(segments->back().trusted);
  o.documents = json::parse(R"("not a list")");
  EXPECT_EQ(t.Render(messages, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatRequest, MangledTemplatesFailCleanly) {
  // Real templates with random cuts and insertions of Jinja syntax: parsing and rendering give
  // errors or text, never crash or hang.
  std::vector<std::string> sources;
  for (const char* name : {"qwen3", "llama-3.1", "mistral-small-3.2", "gemma3", "deepseek-v3.1"}) {
    sources.push_back(ReadFileToString(DINFER_SOURCE_DIR "/tests/data/chat_templates/" +
                                       std::string(name) + ".jinja")
                          .value());
  }
  const char* fragments[] = {"{{",  "}}",     "{%",     "%}",    "{#",   "#}",       "-",
                             "'",   "(",      ")",      "[",     "]",    "|",        ".",
                             ",",   " if ",   " else ", " for ", " in ", " endfor ", " endif ",
                             "raw", "endraw", "loop",   "\\",    "\n",   " is ",     " not "};
  const json::array messages = json::parse(R"([{"role": "system", "content": "s"},
      {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
      {"role": "user", "content": "v"}])")
                                   .as_array();
  std::mt19937 rng(5);
  int parsed = 0;
  for (int i = 0; i < 300; ++i) {
    std::string t = sources[rng() % sources.size()];
    for (int edit = 0; edit < 3; ++edit) {
      const size_t pos = rng() % t.size();
      if (rng() % 2) {
        t.erase(pos, 1 + rng() % 8);
      } else {
        t.insert(pos, fragments[rng() % std::size(fragments)]);
      }
    }
    auto tmpl = ChatTemplate::Parse(t);
    if (!tmpl.ok()) {
      EXPECT_EQ(tmpl.status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    ++parsed;
    auto r = tmpl->Render(messages, {});
    if (!r.ok()) EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_GT(parsed, 20);
}

}  // namespace
}  // namespace dinfer::tokenizer
