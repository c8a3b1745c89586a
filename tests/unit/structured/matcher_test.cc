#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "structured/json_schema.h"
#include "structured/regex.h"
#include "test_util.h"

namespace dinfer::structured {
namespace {

using testutil::DefaultCompiler;
using testutil::DefaultTokenizer;
using testutil::ExpectMaskIsExact;

// value ::= "[" (value ("," value)*)? "]" | "\"" counted-chars "\"" | [0-9]+
Grammar NestedListGrammar(uint32_t min_len, uint32_t max_len) {
  Grammar g;
  const RuleId value = g.AddRule("value");
  const RuleId str = g.AddRule("string");
  g.SetBody(str, g.Seq({g.Byte('"'),
                        g.Star(g.Chars({{0, kMaxCodepoint}}, CharEncoding::kJsonStringAnyEscape)),
                        g.Byte('"', ByteMark::kClose)}));
  g.SetCounted(str, min_len, max_len);
  const ExprId list = g.Seq(
      {g.Byte('['), g.Optional(g.Seq({g.Ref(value), g.Star(g.Seq({g.Byte(','), g.Ref(value)}))})),
       g.Byte(']')});
  g.SetBody(value, g.Alt({list, g.Ref(str), g.Plus(g.Bytes({{'0', '9'}}))}));
  g.set_root(value);
  return g;
}

// Walks `text` with the tokenizer's encoding, checking the mask against brute force before each
// token, and that each token of the text is allowed.
void WalkAndCheck(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text,
                  bool expect_complete, size_t check_every = 1) {
  Matcher m(g);
  const auto ids = DefaultTokenizer()->Encode(text, false);
  std::vector<uint32_t> mask(BitmaskWords(m.vocab_size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % check_every == 0) ExpectMaskIsExact(m, text + " @" + std::to_string(i));
    m.FillNextTokenBitmask(mask.data());
    ASSERT_TRUE(TestBit(mask.data(), ids[i])) << text << " token " << i;
    ASSERT_TRUE(m.AcceptToken(ids[i])) << text << " token " << i;
  }
  ExpectMaskIsExact(m, text + " @end");
  EXPECT_EQ(m.IsCompleted(), expect_complete) << text;
}

TEST(Matcher, MasksEqualBruteForceOnNestedGrammar) {
  DINFER_REQUIRE_TOKENIZER();
  auto g = DefaultCompiler()->Compile(NestedListGrammar(0, kUnbounded));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  WalkAndCheck(*g, "[[\"hello world\",12],\"x\\n\\u00e9\",[]]", true, 3);
  WalkAndCheck(*g, "[1,[2,[3", false, 2);
}

// JSON grammars exercise every kind of mask: derived and shared string masks, the key-exclusion
// rule of additional properties, counted whitespace and lengths, masks computed on first use.
TEST(Matcher, MasksEqualBruteForceOnJsonSchema) {
  DINFER_REQUIRE_TOKENIZER();
  const std::string schema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":12},"id":{"type":"string","pattern":"^[a-f0-9]{4,8}$"},
    "when":{"type":"string","format":"date"},"score":{"type":"number","minimum":-1,"maximum":1},
    "kind":{"enum":["alpha","beta"]},"tags":{"type":"array","items":{"type":"integer"},"maxItems":3}},
    "required":["name"]})";
  auto grammar = JsonSchemaToGrammar(std::string_view(schema));
  ASSERT_TRUE(grammar.ok()) << grammar.status().ToString();
  auto g = DefaultCompiler()->Compile(*grammar);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  WalkAndCheck(*g,
               R"({"name": "Zoë \"Z\"", "id":"beef01", "when":"2024-02-29",)"
               R"( "score":-0.25,"kind":"beta","tags":[1, 22],"extra":{"x":[true,null]}})",
               true, 2);
  WalkAndCheck(*g, "{\n  \"name\": \"a\",\n  \"tags\": [\n", false, 1);
}

TEST(Matcher, CountedStringBoundsAreExact) {
  DINFER_REQUIRE_TOKENIZER();
  auto g = DefaultCompiler()->Compile(NestedListGrammar(3, 7));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  WalkAndCheck(*g, "[\"abcde\",\"xyz\"]", true);
  Matcher m(*g);
  EXPECT_TRUE(m.AcceptBytes("[\"ab"));
  EXPECT_FALSE(m.AcceptBytes("\""));  // too short
  EXPECT_TRUE(m.AcceptBytes("cdefg"));
  EXPECT_FALSE(m.AcceptBytes("h"));  // too long
  EXPECT_TRUE(m.AcceptBytes("\"]"));
  EXPECT_TRUE(m.IsCompleted());
}

TEST(Matcher, RegexMasks) {
  DINFER_REQUIRE_TOKENIZER();
  for (const std::string& pattern :
       {std::string("[a-z]+( [a-z]+)*\\."), std::string("(\\d{3}-){2}\\d{4}"),
        std::string("(cat|category|dog)s?")}) {
    Grammar gr;
    auto e = RegexToExpr(pattern, {}, &gr);
    ASSERT_TRUE(e.ok());
    gr.set_root(gr.DefineRule("root", *e));
    auto g = DefaultCompiler()->Compile(gr);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Matcher m(*g);
    ExpectMaskIsExact(m, pattern);
    ASSERT_TRUE(m.AcceptBytes(pattern[0] == '['
                                  ? "hello wor"
                                  : (pattern[0] == '(' && pattern[1] == '\\' ? "555-12" : "cat")));
    ExpectMaskIsExact(m, pattern + " after prefix");
  }
}

TEST(Matcher, RollbackRestoresState) {
  DINFER_REQUIRE_TOKENIZER();
  auto g = DefaultCompiler()->Compile(NestedListGrammar(0, 5));
  ASSERT_TRUE(g.ok());
  Matcher m(*g);
  const auto ids = DefaultTokenizer()->Encode("[\"ab\",[1,2]]", false);
  std::vector<std::vector<uint32_t>> masks;
  for (int32_t id : ids) {
    masks.emplace_back(BitmaskWords(m.vocab_size()));
    m.FillNextTokenBitmask(masks.back().data());
    ASSERT_TRUE(m.AcceptToken(id));
  }
  EXPECT_TRUE(m.IsCompleted());
  ASSERT_TRUE(m.Rollback(static_cast<int32_t>(ids.size()) - 1));
  EXPECT_FALSE(m.Rollback(5));
  std::vector<uint32_t> mask(BitmaskWords(m.vocab_size()));
  for (size_t i = 1; i < ids.size(); ++i) {
    m.FillNextTokenBitmask(mask.data());
    EXPECT_EQ(mask, masks[i]) << "step " << i;
    ASSERT_TRUE(m.AcceptToken(ids[i]));
  }
  EXPECT_TRUE(m.IsCompleted());
  // A stop token terminates; rolling it back resumes.
  const int32_t stop = m.grammar().tokens().stop_ids().at(0);
  ASSERT_TRUE(m.AcceptToken(stop));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.AcceptToken(ids[0]));
  ASSERT_TRUE(m.Rollback(1));
  EXPECT_TRUE(m.IsCompleted());
  EXPECT_TRUE(m.AcceptToken(stop));
}

TEST(Matcher, StopTokensOnlyWhereComplete) {
  DINFER_REQUIRE_TOKENIZER();
  auto g = DefaultCompiler()->Compile(NestedListGrammar(0, kUnbounded));
  ASSERT_TRUE(g.ok());
  Matcher m(*g);
  const int32_t stop = m.grammar().tokens().stop_ids().at(0);
  EXPECT_FALSE(m.AcceptToken(stop));
  ASSERT_TRUE(m.AcceptBytes("12"));
  std::vector<uint32_t> mask(BitmaskWords(m.vocab_size()));
  m.FillNextTokenBitmask(mask.data());
  EXPECT_TRUE(TestBit(mask.data(), stop));
  // Special tokens other than the stop token are never allowed.
  const auto special = DefaultTokenizer()->TokenId("<|im_start|>");
  ASSERT_TRUE(special.has_value());
  EXPECT_FALSE(TestBit(mask.data(), *special));
}

TEST(Matcher, JumpForwardFollowsForcedText) {
  Grammar g;
  auto e = RegexToExpr("\\{\"name\": \"[a-z]+\", \"kind\": \"(user|admin)\"\\}", {}, &g);
  ASSERT_TRUE(e.ok());
  g.set_root(g.DefineRule("root", *e));
  auto c = testutil::ByteCompiler().Compile(g);
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  EXPECT_EQ(m.FindJumpForwardString(), "{\"name\": \"");
  ASSERT_TRUE(m.AcceptBytes("{\"name\": \"bob"));
  EXPECT_EQ(m.FindJumpForwardString(), "");
  ASSERT_TRUE(m.AcceptBytes("\""));
  EXPECT_EQ(m.FindJumpForwardString(), ", \"kind\": \"");
  ASSERT_TRUE(m.AcceptBytes(", \"kind\": \"a"));
  EXPECT_EQ(m.FindJumpForwardString(), "dmin\"}");
  EXPECT_EQ(m.FindJumpForwardString(3), "dmi");
}

// With a token budget, random walks (that favour long tokens, which rarely close anything) still
// end complete: near the end only a shortest completion is allowed.
TEST(Matcher, TokenBudgetEndsTheTextComplete) {
  DINFER_REQUIRE_TOKENIZER();
  auto grammar = JsonSchemaToGrammar(std::string_view(R"({"type":"object","properties":{
    "title":{"type":"string","minLength":3},"items":{"type":"array","items":{"type":"string"},
    "minItems":1},"meta":{"type":"object"}},"required":["title","items","meta"]})"));
  ASSERT_TRUE(grammar.ok());
  auto g = DefaultCompiler()->Compile(*grammar);
  ASSERT_TRUE(g.ok());
  std::mt19937 rng(7);
  std::vector<uint32_t> mask(BitmaskWords((*g)->tokens().vocab_size()));
  for (int trial = 0; trial < 6; ++trial) {
    Matcher m(*g);
    const int64_t budget = 60 + 20 * trial;
    EXPECT_LT(m.CompletionBytes() + 2, static_cast<uint64_t>(budget));
    int64_t used = 0;
    for (; used < budget && !m.IsTerminated(); ++used) {
      m.FillNextTokenBitmask(mask.data(), budget - used);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < m.vocab_size(); ++t) {
        if (TestBit(mask.data(), t)) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty());
      // Pick among the longest few allowed tokens, stop tokens last.
      std::sort(allowed.begin(), allowed.end(), [&](int32_t x, int32_t y) {
        return m.grammar().tokens().bytes(x).size() > m.grammar().tokens().bytes(y).size();
      });
      const int32_t t = allowed[rng() % std::min<size_t>(allowed.size(), 8)];
      ASSERT_TRUE(m.AcceptToken(t));
    }
    EXPECT_TRUE(m.IsTerminated() || m.IsCompleted()) << "budget " << budget;
  }
}

TEST(Matcher, LeftRecursionIsRefused) {
  Grammar g;
  const RuleId expr = g.AddRule("expr");
  g.SetBody(expr, g.Alt({g.Seq({g.Ref(expr), g.Byte('+'), g.Byte('1')}), g.Byte('1')}));
  g.set_root(expr);
  auto c = testutil::ByteCompiler().Compile(g);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("left-recursive"), std::string::npos);
}

}  // namespace
}  // namespace dinfer::structured
