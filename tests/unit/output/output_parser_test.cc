// OutputParser: every fixture parses to its expected content, reasoning, tool calls and stop
// sequence, and to the same events however the text is cut (whole, at every single split
// point, byte by byte, character by character, at real tokenizers' token boundaries, at random
// points); plus the format-specific edges.

#include "server/output/output_parser.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"

namespace dinfer::output {
namespace {

using Type = OutputEvent::Type;

std::string TokenizersDir() {
  if (const char* dir = std::getenv("DINFER_TEST_TOKENIZERS"); dir && *dir) return dir;
  return DINFER_SOURCE_DIR "/build/test-data/tokenizers";
}

OutputFormat Format(ReasoningFormat reasoning, ToolCallFormat tools,
                    std::vector<std::string> stop = {}) {
  OutputFormat f;
  f.reasoning = reasoning;
  f.tools = tools;
  f.stop = std::move(stop);
  f.tool_call_id = [](int index) { return fmt::format("call_{}", index); };
  return f;
}

OutputFormat InReasoning(OutputFormat f) {
  f.starts_in_reasoning = true;
  return f;
}

struct Case {
  std::string name;
  OutputFormat format;
  std::string text;
  ParsedOutput expected;
};

ToolCall Call(int index, std::string name, std::string arguments) {
  return {fmt::format("call_{}", index), std::move(name), std::move(arguments)};
}

ParsedOutput Out(std::string content, std::string reasoning = "", std::vector<ToolCall> calls = {},
                 std::optional<std::string> stop = std::nullopt) {
  return {std::move(content), std::move(reasoning), std::move(calls), std::move(stop)};
}

constexpr auto kNoReasoning = ReasoningFormat::kNone;
constexpr auto kThink = ReasoningFormat::kThink;
constexpr auto kNoTools = ToolCallFormat::kNone;
constexpr auto kHermes = ToolCallFormat::kHermes;
constexpr auto kLlama = ToolCallFormat::kLlama3Json;
constexpr auto kDsml = ToolCallFormat::kDeepSeekDsml;

std::vector<Case> Cases() {
  const std::string weather_dsml =
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Paris "
      "\"centre\"\n</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n";
  const std::string weather_args = R"({"location": "Paris \"centre\"\n", "days": 3})";
  OutputFormat forced = Format(kNoReasoning, kDsml);
  forced.starts_in_tool_calls = true;
  return {
      {"plain", Format(kNoReasoning, kNoTools), "Hello, world!", Out("Hello, world!")},
      {"empty", Format(kThink, kHermes), "", Out("")},
      {"think_opened_by_output", Format(kThink, kNoTools),
       "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
       Out("The answer is 4.", "Let me think.")},
      {"think_opened_by_prompt", InReasoning(Format(kThink, kNoTools)),
       "\nReasoning here.\n\nMore.\n</think>Answer", Out("Answer", "Reasoning here.\n\nMore.")},
      {"think_unterminated", InReasoning(Format(kThink, kNoTools)), "Still thinking\n",
       Out("", "Still thinking")},
      {"think_not_at_start", Format(kThink, kNoTools), "Hi <think> there </think>",
       Out("Hi <think> there </think>")},
      {"no_think_tag", Format(kThink, kHermes), "Just an answer.", Out("Just an answer.")},
      {"hermes_one", Format(kNoReasoning, kHermes),
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\", \"days\": [1, 2]}}\n</tool_call>",
       Out("Let me check.", "", {Call(0, "get_weather", R"({"city": "Paris", "days": [1, 2]})")})},
      {"hermes_two_after_reasoning", Format(kThink, kHermes),
       "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": \"y\\\"z}\"}}\n"
       "</tool_call>",
       Out("", "plan", {Call(0, "a", "{}"), Call(1, "b", R"({"x": "y\"z}"})")})},
      {"hermes_malformed_is_content", Format(kNoReasoning, kHermes),
       "Sure <tool_call>not json</tool_call> done",
       Out("Sure <tool_call>not json</tool_call> done")},
      {"hermes_no_name_is_content", Format(kNoReasoning, kHermes),
       "<tool_call>{\"arguments\": {}}</tool_call>",
       Out("<tool_call>{\"arguments\": {}}</tool_call>")},
      {"hermes_arguments_before_name", Format(kNoReasoning, kHermes),
       "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"search\"}</tool_call>",
       Out("", "", {Call(0, "search", R"({"q": 1})")})},
      {"hermes_arguments_as_string", Format(kNoReasoning, kHermes),
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"\\u00e9\\\"}\"}</tool_call>",
       Out("", "", {Call(0, "f", "{\"a\": \"é\"}")})},
      {"hermes_no_arguments", Format(kNoReasoning, kHermes),
       "<tool_call>{\"name\": \"now\"}</tool_call>", Out("", "", {Call(0, "now", "{}")})},
      {"hermes_unterminated", Format(kNoReasoning, kHermes),
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1",
       Out("", "", {Call(0, "f", R"({"a": 1)")})},
      {"hermes_cut_before_name", Format(kNoReasoning, kHermes), "Hi <tool_call>{\"na",
       Out("Hi <tool_call>{\"na")},
      {"hermes_junk_then_text", Format(kNoReasoning, kHermes),
       "<tool_call>{\"name\": \"f\", \"arguments\": {}} extra</tool_call>\nafter",
       Out("after", "", {Call(0, "f", "{}")})},
      {"hermes_unicode", Format(kNoReasoning, kHermes),
       "天气：<tool_call>{\"name\": \"天气\", \"arguments\": {\"城市\": \"北京 "
       "🌧\"}}</tool_call>",
       Out("天气：", "", {Call(0, "天气", R"({"城市": "北京 🌧"})")})},
      {"llama_python_tag", Format(kNoReasoning, kLlama),
       "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}",
       Out("", "", {Call(0, "get_time", R"({"tz": "UTC"})")})},
      {"llama_chained", Format(kNoReasoning, kLlama),
       " {\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
       Out("", "", {Call(0, "a", R"({"x": 1})"), Call(1, "b", "{}")})},
      {"llama_chained_then_text", Format(kNoReasoning, kLlama),
       "{\"name\": \"a\", \"parameters\": {}}; not a call",
       Out("not a call", "", {Call(0, "a", "{}")})},
      {"llama_json_answer_is_content", Format(kNoReasoning, kLlama), "{\"answer\": 42}",
       Out("{\"answer\": 42}")},
      {"llama_text_then_tag", Format(kNoReasoning, kLlama),
       "Let me call.<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
       Out("Let me call.", "", {Call(0, "f", "{}")})},
      {"llama_brace_later_is_content", Format(kNoReasoning, kLlama),
       "Use {\"name\": \"x\"} as input", Out("Use {\"name\": \"x\"} as input")},
      {"dsml_v4_thinking", InReasoning(Format(kThink, kDsml)),
       "Need the weather.</think>\n\n<｜DSML｜tool_calls>\n" + weather_dsml +
           "</｜DSML｜tool_calls>",
       Out("", "Need the weather.", {Call(0, "get_weather", weather_args), Call(1, "now", "{}")})},
      {"dsml_v32_block", Format(kNoReasoning, kDsml),
       "Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
       "name=\"q\" string=\"true\">天气\t\\</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
       "</｜DSML｜function_calls>",
       Out("Sure.", "", {Call(0, "f", R"({"q": "天气\t\\"})")})},
      {"dsml_malformed_is_content", Format(kNoReasoning, kDsml),
       "Look: <｜DSML｜tool_calls> nothing here", Out("Look: <｜DSML｜tool_calls> nothing here")},
      {"dsml_opened_by_prompt", forced,
       "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">{\"k\": [1, "
       "2]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       Out("", "", {Call(0, "f", R"({"a": {"k": [1, 2]}})")})},
      {"dsml_text_after_block", Format(kNoReasoning, kDsml),
       "<｜DSML｜tool_calls>\n" + weather_dsml + "</｜DSML｜tool_calls>\n\nDone.",
       Out("Done.", "", {Call(0, "get_weather", weather_args), Call(1, "now", "{}")})},
      {"dsml_unterminated", Format(kNoReasoning, kDsml),
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"s\" "
       "string=\"true\">part",
       Out("", "", {Call(0, "f", R"({"s": "part)")})},
      {"stop", Format(kNoReasoning, kNoTools, {"STOP"}), "Hello STOP world",
       Out("Hello ", "", {}, "STOP")},
      {"stop_prefix_released", Format(kNoReasoning, kNoTools, {"STOP"}), "Hello STO and more ST",
       Out("Hello STO and more ST")},
      {"stop_not_in_reasoning", InReasoning(Format(kThink, kNoTools, {"STOP"})),
       "a STOP b</think>c STOP d", Out("c ", "a STOP b", {}, "STOP")},
      {"stop_not_in_markup", Format(kNoReasoning, kHermes, {"<tool", "name"}),
       "x<tool_call>{\"name\": \"f\"}</tool_call>y", Out("xy", "", {Call(0, "f", "{}")})},
      {"stop_earliest_wins", Format(kNoReasoning, kNoTools, {"ghi", "def", "de"}), "abc def ghi",
       Out("abc ", "", {}, "de")},
      {"stop_after_call", Format(kNoReasoning, kHermes, {"END"}),
       "<tool_call>{\"name\": \"f\"}</tool_call>\nThe END here",
       Out("The ", "", {Call(0, "f", "{}")}, "END")},
      {"stop_unicode", Format(kNoReasoning, kNoTools, {"世界"}), "你好世界，再见",
       Out("你好", "", {}, "世界")},
      {"stop_in_reverted_markup", Format(kNoReasoning, kHermes, {"json"}),
       "a <tool_call>not json</tool_call>", Out("a <tool_call>not ", "", {}, "json")},
      {"stop_newline", Format(kNoReasoning, kHermes, {"\n\n"}), "para one\n\npara two",
       Out("para one", "", {}, "\n\n")},
  };
}

// Adjacent pieces of the same kind joined, so that event lists from different cuts compare.
std::vector<OutputEvent> Merge(const std::vector<OutputEvent>& events) {
  std::vector<OutputEvent> out;
  for (const OutputEvent& e : events) {
    const bool joins =
        e.type == Type::kText || e.type == Type::kReasoning || e.type == Type::kToolCallArgs;
    if (joins && !out.empty() && out.back().type == e.type &&
        out.back().tool_index == e.tool_index) {
      out.back().text += e.text;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

std::vector<OutputEvent> Feed(const OutputFormat& format, const std::vector<std::string>& pieces) {
  OutputParser parser(format);
  std::vector<OutputEvent> events;
  for (const std::string& piece : pieces) {
    for (OutputEvent& e : parser.Push(piece)) events.push_back(std::move(e));
  }
  for (OutputEvent& e : parser.Finish()) events.push_back(std::move(e));
  return events;
}

std::vector<std::string> Bytes(const std::string& text) {
  std::vector<std::string> out;
  for (char c : text) out.emplace_back(1, c);
  return out;
}

std::vector<std::string> Utf8Chars(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;
    while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

std::vector<std::string> RandomCuts(const std::string& text, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::uniform_int_distribution<size_t>(1, 7)(rng);
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

// Text deltas as the engine streams them: one per token, whole UTF-8 characters only.
std::vector<std::string> TokenDeltas(const tokenizer::Tokenizer& tok, const std::string& text) {
  tokenizer::IncrementalDetokenizer detok(tok, /*skip_special=*/false);
  std::vector<std::string> out;
  for (int32_t id : tok.Encode(text)) out.push_back(detok.Push(id));
  out.push_back(detok.Flush());
  return out;
}

const std::vector<std::unique_ptr<tokenizer::Tokenizer>>& Tokenizers() {
  static const auto* toks = [] {
    auto* v = new std::vector<std::unique_ptr<tokenizer::Tokenizer>>;
    for (const char* name : {"smollm2", "qwen2", "deepseek_v4"}) {
      auto tok = tokenizer::Tokenizer::FromTokenizerJsonFile(TokenizersDir() + "/" + name);
      if (tok.ok()) v->push_back(std::move(tok).value());
    }
    return v;
  }();
  return *toks;
}

TEST(OutputParserTest, FixturesParseAsExpected) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(ParseOutput(c.format, c.text), c.expected);
    EXPECT_EQ(Accumulate(Feed(c.format, {c.text})), c.expected);
  }
}

TEST(OutputParserTest, EventsDoNotDependOnHowTheTextIsCut) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<OutputEvent> whole = Merge(Feed(c.format, {c.text}));
    EXPECT_EQ(Merge(Feed(c.format, Bytes(c.text))), whole) << "byte by byte";
    EXPECT_EQ(Merge(Feed(c.format, Utf8Chars(c.text))), whole) << "character by character";
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      EXPECT_EQ(Merge(Feed(c.format, RandomCuts(c.text, seed))), whole) << "seed " << seed;
    }
    for (size_t cut = 1; cut < c.text.size(); ++cut) {
      EXPECT_EQ(Merge(Feed(c.format, {c.text.substr(0, cut), c.text.substr(cut)})), whole)
          << "cut at " << cut;
    }
  }
}

TEST(OutputParserTest, EventsDoNotDependOnTokenBoundaries) {
  if (Tokenizers().empty()) GTEST_SKIP() << "no tokenizers in " << TokenizersDir();
  for (const auto& tok : Tokenizers()) {
    for (const Case& c : Cases()) {
      SCOPED_TRACE(c.name);
      const std::vector<std::string> deltas = TokenDeltas(*tok, c.text);
      std::string joined;
      for (const std::string& d : deltas) joined += d;
      ASSERT_EQ(joined, c.text);
      EXPECT_EQ(Merge(Feed(c.format, deltas)), Merge(Feed(c.format, {c.text})));
    }
  }
}

// Random texts built from markup fragments, whole and complete or cut short, in every format:
// the events are the same however the text is cut, and tool-call events are well formed.
TEST(OutputParserTest, RandomMarkupIsCutInvariant) {
  const std::vector<std::string> fragments = {"a",
                                              " ",
                                              "\n",
                                              "é",
                                              "世界",
                                              "STOP",
                                              "ST",
                                              "<",
                                              ">",
                                              "{",
                                              "}",
                                              "\"",
                                              ",",
                                              ":",
                                              "\\",
                                              ";",
                                              "<think>",
                                              "</think>",
                                              "<thi",
                                              "<tool_call>",
                                              "</tool_call>",
                                              "{\"name\": \"f\"",
                                              ", \"arguments\": ",
                                              "{\"a\": [1, \"}\"]}",
                                              "\"name\"",
                                              "<|python_tag|>",
                                              "{\"name\": \"g\", \"parameters\": {}}",
                                              "<｜DSML｜tool_calls>",
                                              "</｜DSML｜tool_calls>",
                                              "<｜DSML｜invoke name=\"f\">",
                                              "</｜DSML｜invoke>",
                                              "<｜DSML｜parameter name=\"p\" string=\"true\">",
                                              "<｜DSML｜parameter name=\"q\" string=\"false\">",
                                              "</｜DSML｜parameter>",
                                              "｜DSML｜"};
  std::mt19937_64 rng(7);
  for (ToolCallFormat tools : {kNoTools, kHermes, kLlama, kDsml}) {
    for (int reasoning = 0; reasoning < 3; ++reasoning) {
      for (bool stop : {false, true}) {
        OutputFormat format = Format(reasoning == 0 ? kNoReasoning : kThink, tools);
        format.starts_in_reasoning = reasoning == 2;
        if (stop) format.stop = {"STOP", "a\n"};
        for (int n = 0; n < 150; ++n) {
          std::string text;
          const size_t count = std::uniform_int_distribution<size_t>(1, 24)(rng);
          for (size_t i = 0; i < count; ++i) {
            text += fragments[std::uniform_int_distribution<size_t>(0, fragments.size() - 1)(rng)];
          }
          SCOPED_TRACE(text);
          const std::vector<OutputEvent> whole = Merge(Feed(format, {text}));
          ASSERT_EQ(Merge(Feed(format, Bytes(text))), whole);
          ASSERT_EQ(Merge(Feed(format, RandomCuts(text, rng()))), whole);
          int begun = 0;
          bool open = false;
          for (const OutputEvent& e : whole) {
            if (e.type == Type::kToolCallBegin) {
              EXPECT_FALSE(open);
              EXPECT_EQ(e.tool_index, begun++);
              open = true;
            } else if (e.type == Type::kToolCallArgs || e.type == Type::kToolCallEnd) {
              EXPECT_TRUE(open);
              EXPECT_EQ(e.tool_index, begun - 1);
              open = e.type == Type::kToolCallArgs;
            } else {
              EXPECT_FALSE(open) << "content inside a call";
            }
          }
          EXPECT_FALSE(open) << "a call was not ended";
        }
      }
    }
  }
}

// Streaming emits as early as correctness allows: text that cannot be part of a marker or a
// stop sequence is not held back.
TEST(OutputParserTest, EmitsAsSoonAsTextIsDecided) {
  OutputParser parser(Format(kThink, kHermes, {"STOP"}));
  EXPECT_TRUE(parser.Push("<thi").empty());
  EXPECT_TRUE(parser.Push("nk>").empty());
  auto events = parser.Push("I think");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, Type::kReasoning);
  EXPECT_EQ(events[0].text, "I think");
  EXPECT_TRUE(parser.Push("\n</thi").empty());  // a newline before </think> is layout
  events = parser.Push("nk>\n\nHello ST");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "Hello");  // " ST" may start "STOP"; the space may precede a call
  events = parser.Push("ART <tool_");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, " START");
  events = parser.Push("call>{\"name\": \"f\", \"arguments\": {\"a\"");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, Type::kToolCallBegin);
  EXPECT_EQ(events[0].name, "f");
  EXPECT_EQ(events[0].id, "call_0");
  EXPECT_EQ(events[1].type, Type::kToolCallArgs);
  EXPECT_EQ(events[1].text, "{\"a\"");
  events = parser.Push(": 1}}</tool_call>");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].text, ": 1}");
  EXPECT_EQ(events[1].type, Type::kToolCallEnd);
  EXPECT_EQ(parser.tool_calls(), 1);
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(OutputParserTest, StopEndsTheStream) {
  OutputParser parser(Format(kNoReasoning, kNoTools, {"\n\nUser:", "END"}));
  EXPECT_EQ(Accumulate(parser.Push("Answer.\n\nUse")).content, "Answer.");
  EXPECT_FALSE(parser.stopped());
  const std::vector<OutputEvent> events = parser.Push("r: more");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, Type::kStop);
  EXPECT_EQ(events[0].text, "\n\nUser:");
  EXPECT_TRUE(parser.stopped());
  EXPECT_TRUE(parser.Push("END").empty());
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(OutputParserTest, DsmlArgumentsStreamAsJson) {
  OutputParser parser(Format(kNoReasoning, kDsml));
  std::string args;
  for (const std::string& piece :
       {std::string("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
                    "name=\"text\" string=\"true\">line 1\n"),
        std::string("line \"2\"</｜DSML｜para"), std::string("meter>\n</｜DSML｜invoke>")}) {
    for (const OutputEvent& e : parser.Push(piece)) {
      if (e.type == Type::kToolCallArgs) args += e.text;
    }
    if (piece.starts_with("<")) {
      EXPECT_EQ(args, R"({"text": "line 1\n)");
    }
  }
  EXPECT_EQ(args, R"({"text": "line 1\nline \"2\""})");
}

TEST(OutputParserTest, DefaultToolCallIdsAreUnique) {
  OutputFormat format = Format(kNoReasoning, kHermes);
  format.tool_call_id = nullptr;
  const ParsedOutput out = ParseOutput(
      format, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  for (const ToolCall& call : out.tool_calls) {
    EXPECT_TRUE(call.id.starts_with("call_")) << call.id;
    EXPECT_EQ(call.id.size(), 29u);
  }
  EXPECT_NE(out.tool_calls[0].id, out.tool_calls[1].id);
}

TEST(SelectOutputFormatTest, FromTemplateAndPrompt) {
  using Seg = PromptSegment;
  const std::vector<Seg> none;
  EXPECT_EQ(SelectOutputFormat({"qwen2", "{{ '<tool_call>' }}"}, none).tools, kHermes);
  EXPECT_EQ(SelectOutputFormat({"llama", "{{ '<|python_tag|>' }}"}, none).tools, kLlama);
  EXPECT_EQ(SelectOutputFormat({"llama", "role ipython ... \"parameters\": dict"}, none).tools,
            kLlama);
  EXPECT_EQ(SelectOutputFormat({"smollm2", "{{ messages }}"}, none).tools, kNoTools);
  EXPECT_EQ(SelectOutputFormat({"smollm2", "{{ messages }}"}, none).reasoning, kNoReasoning);

  // Qwen3: the template opens reasoning, or writes an empty block when thinking is off.
  const ModelTraits qwen3{"qwen3", "<tool_call> <think> </think>"};
  const OutputFormat open =
      SelectOutputFormat(qwen3, std::vector<Seg>{{"<|im_start|>assistant\n<think>\n", true}});
  EXPECT_EQ(open.reasoning, kThink);
  EXPECT_TRUE(open.starts_in_reasoning);
  EXPECT_FALSE(
      SelectOutputFormat(qwen3, std::vector<Seg>{{"assistant\n<think>\n\n</think>\n\n", true}})
          .starts_in_reasoning);
  // A <think> the user typed does not count.
  EXPECT_FALSE(SelectOutputFormat(qwen3, std::vector<Seg>{{"user\n", true}, {"<think>", false}})
                   .starts_in_reasoning);

  // DeepSeek V4: thinking, or a call forced by tool_choice.
  const ModelTraits v4{"deepseek_v4", "", true};
  const OutputFormat thinking =
      SelectOutputFormat(v4, std::vector<Seg>{{"<｜Assistant｜>", true}, {"<think>", true}});
  EXPECT_EQ(thinking.tools, kDsml);
  EXPECT_TRUE(thinking.starts_in_reasoning);
  const OutputFormat forced = SelectOutputFormat(
      v4, std::vector<Seg>{
              {"</think>", true}, {"\n\n<", false}, {"｜DSML｜", true}, {"tool_calls>\n", false}});
  EXPECT_FALSE(forced.starts_in_reasoning);
  EXPECT_TRUE(forced.starts_in_tool_calls);
}

}  // namespace
}  // namespace dinfer::output
