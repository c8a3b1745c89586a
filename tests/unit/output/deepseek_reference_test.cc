// The DSML and reasoning parsing against DeepSeek's own stream parser (deepseek-recipe): the
// outputs in tests/data/output/deepseek_v4_outputs.jsonl and what it made of them (made by
// scripts/fixtures/make_deepseek_v4_fixtures.py); and where the output of a prompt rendered by
// the DeepSeek V4 encoding starts.

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include "server/output/output_parser.h"
#include "tokenizer/deepseek_v4_encoding.h"

namespace dinfer::output {
namespace {

namespace json = boost::json;

TEST(DeepSeekReferenceTest, ParsesOutputsAsDeepSeeksParser) {
  std::ifstream in(DINFER_SOURCE_DIR "/tests/data/output/deepseek_v4_outputs.jsonl");
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    const json::object row = json::parse(line).as_object();
    SCOPED_TRACE(json::value_to<std::string>(row.at("name")));
    OutputFormat format;
    format.reasoning = ReasoningFormat::kThink;
    format.tools = ToolCallFormat::kDeepSeekDsml;
    format.starts_in_reasoning = row.at("thinking").as_bool();
    for (const json::value& s : row.at("stop").as_array()) {
      format.stop.push_back(json::value_to<std::string>(s));
    }
    const std::string text = json::value_to<std::string>(row.at("text"));
    const ParsedOutput out = ParseOutput(format, text);
    EXPECT_EQ(out.content, row.at("content").as_string());
    EXPECT_EQ(out.reasoning, row.at("reasoning").as_string());
    const json::array& calls = row.at("tool_calls").as_array();
    ASSERT_EQ(out.tool_calls.size(), calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(out.tool_calls[i].name, calls[i].as_array().at(0).as_string());
      EXPECT_EQ(out.tool_calls[i].arguments, calls[i].as_array().at(1).as_string());
    }
    EXPECT_EQ(out.tool_calls.empty(), row.at("finish_reason") != "tool_calls");
    // Character by character, as a stream.
    OutputParser parser(format);
    std::vector<OutputEvent> events;
    for (size_t i = 0; i < text.size();) {
      size_t n = 1;
      while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
      for (OutputEvent& e : parser.Push(std::string_view(text).substr(i, n))) events.push_back(e);
      i += n;
    }
    for (OutputEvent& e : parser.Finish()) events.push_back(e);
    ParsedOutput streamed = Accumulate(events);
    for (size_t i = 0; i < streamed.tool_calls.size() && i < out.tool_calls.size(); ++i) {
      streamed.tool_calls[i].id = out.tool_calls[i].id;  // random ids
    }
    EXPECT_EQ(streamed, out);
    ++rows;
  }
  EXPECT_GE(rows, 15);
}

TEST(DeepSeekReferenceTest, EncodedPromptDecidesWhereTheOutputStarts) {
  using tokenizer::DeepSeekV4Options;
  const ModelTraits v4{"deepseek_v4", "", true};
  auto start = [&](const json::array& messages, const DeepSeekV4Options& options) {
    auto segments = tokenizer::EncodeDeepSeekV4(messages, options);
    EXPECT_TRUE(segments.ok()) << segments.status().ToString();
    const OutputFormat f =
        SelectOutputFormat(v4, segments.ok() ? *segments : std::vector<PromptSegment>{});
    EXPECT_EQ(f.reasoning, ReasoningFormat::kThink);
    EXPECT_EQ(f.tools, ToolCallFormat::kDeepSeekDsml);
    return std::pair{f.starts_in_reasoning, f.starts_in_tool_calls};
  };
  const json::array user = {{{"role", "user"}, {"content", "Hi </think> <think>"}}};
  DeepSeekV4Options thinking, chat, forced;
  chat.thinking = forced.thinking = false;
  forced.tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  forced.tool_choice = DeepSeekV4Options::ToolChoice::kRequired;
  EXPECT_EQ(start(user, thinking), std::pair(true, false));
  EXPECT_EQ(start(user, chat), std::pair(false, false));
  EXPECT_EQ(start(user, forced), std::pair(false, true));
  // Continuing an assistant message: inside its reasoning until it has content.
  json::array partial = user;
  partial.push_back(
      {{"role", "assistant"}, {"content", ""}, {"reasoning_content", "So"}, {"prefix", true}});
  EXPECT_EQ(start(partial, thinking), std::pair(true, false));
  partial.back().as_object()["content"] = "Answer:";
  EXPECT_EQ(start(partial, thinking), std::pair(false, false));
}

}  // namespace
}  // namespace dinfer::output
