#include "structured/structural_tag.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "structured/constraint.h"
#include "test_util.h"

namespace dinfer::structured {
namespace {

using testutil::ByteCompiler;
using testutil::FullMatch;

// Two tools in the Hermes format: free text, and each "<tool_call>" must begin a call.
constexpr const char* kTag = R"({"type": "structural_tag", "triggers": ["<tool_call>"],
  "structures": [
    {"begin": "<tool_call>\n{\"name\": \"weather\", \"arguments\": ",
     "schema": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false},
     "end": "}\n</tool_call>"},
    {"begin": "<tool_call>\n{\"name\": \"time\", \"arguments\": ",
     "schema": {"type": "object", "properties": {"tz": {"enum": ["utc", "cet"]}},
                "required": ["tz"], "additionalProperties": false},
     "end": "}\n</tool_call>"}]})";

std::shared_ptr<const CompiledGrammar> CompileTag(const char* text) {
  Constraint c;
  c.kind = ConstraintKind::kStructuralTag;
  c.text = text;
  c.json.max_whitespace = 0;
  auto grammar = BuildGrammar(c);
  EXPECT_TRUE(grammar.ok()) << grammar.status().ToString();
  auto compiled = ByteCompiler().Compile(*grammar);
  EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
  return *compiled;
}

TEST(StructuralTag, FreeTextAndTaggedCalls) {
  auto g = CompileTag(kTag);
  const std::string weather =
      "<tool_call>\n{\"name\": \"weather\", \"arguments\": "
      "{\"city\":\"Oslo\"}}\n</tool_call>";
  const std::string time =
      "<tool_call>\n{\"name\": \"time\", \"arguments\": {\"tz\":\"cet\"}}\n"
      "</tool_call>";
  for (const std::string& ok : std::vector<std::string>{
           std::string(""), std::string("Just text, with <b>markup</b> and <tool_cal almost."),
           weather, "Let me check.\n" + weather + "\n" + time + " Done.", weather + time,
           std::string("ends in a trigger prefix <tool_ca")}) {
    EXPECT_TRUE(FullMatch(g, ok)) << ok;
  }
  for (const std::string& bad : std::vector<std::string>{
           std::string("<tool_call>"), std::string("text <tool_call>{\"name\": \"weather\"}"),
           "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"tz\":\"cet\"}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"time\", \"arguments\": {\"tz\":\"pst\"}}\n</tool_call>",
           weather.substr(0, weather.size() - 3)}) {
    EXPECT_FALSE(FullMatch(g, bad)) << bad;
  }
}

TEST(StructuralTag, MasksAreExactWithARealTokenizer) {
  DINFER_REQUIRE_TOKENIZER();
  Constraint c;
  c.kind = ConstraintKind::kStructuralTag;
  c.text = kTag;
  auto grammar = BuildGrammar(c);
  ASSERT_TRUE(grammar.ok());
  auto g = testutil::DefaultCompiler()->Compile(*grammar);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Matcher m(*g);
  const std::string text =
      "Sure.<tool_call>\n{\"name\": \"time\", \"arguments\": {\"tz\": \"utc\"}}"
      "\n</tool_call>";
  const auto ids = testutil::DefaultTokenizer()->Encode(text, false);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 4 == 0) testutil::ExpectMaskIsExact(m, "@" + std::to_string(i));
    ASSERT_TRUE(m.AcceptToken(ids[i])) << i;
  }
  EXPECT_TRUE(m.IsCompleted());
  EXPECT_FALSE(m.IsTerminated());  // free text may follow
}

TEST(StructuralTag, Errors) {
  for (const char* bad : {R"([])", R"({"structures": [], "triggers": ["<a>"]})",
                          R"({"structures": [{"begin": "<a>", "schema": {}, "end": ""}]})",
                          R"({"structures": [{"begin": "<b>", "schema": {}, "end": ""}],
                              "triggers": ["<a>"]})",
                          R"({"structures": [{"begin": "<a>", "end": ""}], "triggers": ["<a>"]})",
                          R"({"structures": [{"begin": "<a>", "schema": {"not": {}}, "end": ""}],
                              "triggers": ["<a>"]})"}) {
    Constraint c;
    c.kind = ConstraintKind::kStructuralTag;
    c.text = bad;
    EXPECT_FALSE(BuildGrammar(c).ok()) << bad;
  }
}

TEST(StructuralTag, AvoidingDfa) {
  auto dfa = AvoidingDfa({"abc", "bd"});
  auto accepts = [&](std::string_view s) {
    int32_t state = 0;
    for (char ch : s) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t next = -1;
      for (const ByteDfa::Edge& e : dfa->states[state].edges) {
        if (e.lo <= b && b <= e.hi) next = e.to;
      }
      if (next < 0) return false;
      state = next;
    }
    return true;
  };
  EXPECT_TRUE(accepts("ab ab bc ac ab"));
  EXPECT_TRUE(accepts("aab"));
  EXPECT_FALSE(accepts("xxabc"));
  EXPECT_FALSE(accepts("aabd"));  // "bd" inside "abd"
  EXPECT_FALSE(accepts("bd"));
}

}  // namespace
}  // namespace dinfer::structured
