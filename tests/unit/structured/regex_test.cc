#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "structured/regex.h"
#include "test_util.h"

namespace dinfer::structured {
namespace {

using testutil::FullMatch;

std::shared_ptr<const CompiledGrammar> CompileRegex(const std::string& pattern, bool search) {
  Grammar g;
  auto expr = RegexToExpr(pattern, {.search = search}, &g);
  EXPECT_TRUE(expr.ok()) << expr.status().ToString();
  if (!expr.ok()) return nullptr;
  g.set_root(g.DefineRule("root", *expr));
  auto compiled = testutil::ByteCompiler().Compile(g);
  EXPECT_TRUE(compiled.ok()) << pattern << ": " << compiled.status().ToString();
  return compiled.ok() ? *compiled : nullptr;
}

struct Case {
  std::string pattern;
  std::vector<std::string> match, no_match;
};

TEST(Regex, FullMatchSemantics) {
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "xabc"}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"a*b+c?", {"b", "aab", "abbc"}, {"", "ac", "abcc"}},
      {"a{3}", {"aaa"}, {"aa", "aaaa"}},
      {"a{2,}", {"aa", "aaaaa"}, {"a"}},
      {"a{1,3}?", {"a", "aaa"}, {"", "aaaa"}},
      {"[a-c]x[^a-c]", {"axd", "cx\xC3\xA9"}, {"axa", "dxd"}},
      {"\\d\\D\\w\\W\\s\\S", {"1a_- x", "9Zz!\tq"}, {"aa_- x", "1a_-xx"}},
      {"[\\d.-]+", {"1.5-2", "-"}, {"", "a"}},
      {"[a\\-z]", {"a", "-", "z"}, {"b"}},
      {"(?:ab)+(?<n>c)", {"abc", "ababc"}, {"c", "abab"}},
      {".", {"a", "\xE2\x82\xAC", "\xF0\x9F\x90\xB2"}, {"\n", "\r", "", "\xE2\x80\xA8"}},
      {"\\x41\\u0042\\u{1F432}\\t\\/\\.", {"AB\xF0\x9F\x90\xB2\t/."}, {"AB"}},
      {"\\uD83D\\uDC32", {"\xF0\x9F\x90\xB2"}, {}},
      {"a{,2}", {"a{,2}"}, {"a", "aa"}},
      {"x{", {"x{"}, {"x"}},
      {"^abc$", {"abc"}, {"xabc"}},
      {"[^]", {"a", "\n"}, {""}},
      {"\\cJ", {"\n"}, {"J"}},
      {"é+", {"é", "éé"}, {"e"}},
  };
  for (const Case& c : cases) {
    auto g = CompileRegex(c.pattern, false);
    ASSERT_NE(g, nullptr);
    for (const auto& s : c.match) EXPECT_TRUE(FullMatch(g, s)) << c.pattern << " ~ " << s;
    for (const auto& s : c.no_match) EXPECT_FALSE(FullMatch(g, s)) << c.pattern << " !~ " << s;
  }
}

TEST(Regex, SearchSemanticsOfJsonSchemaPatterns) {
  const std::vector<Case> cases = {
      {"abc", {"abc", "xxabcyy"}, {"ab", "acb"}},
      {"^abc", {"abc", "abcx"}, {"xabc"}},
      {"abc$", {"abc", "xabc"}, {"abcx"}},
      {"^a|b$", {"ax", "xb", "a", "b"}, {"xa", "bx"}},
      {"^(a|b)$", {"a", "b"}, {"ab", "xa"}},
      {"(^a|^b)", {"a", "bx"}, {"xa"}},
      {"^$", {""}, {"a"}},
      {"", {"", "anything"}, {}},
      {"^\\d{4}-\\d{2}$", {"2024-01"}, {"2024-1", "x2024-01"}},
  };
  for (const Case& c : cases) {
    auto g = CompileRegex(c.pattern, true);
    ASSERT_NE(g, nullptr);
    for (const auto& s : c.match) EXPECT_TRUE(FullMatch(g, s)) << c.pattern << " ~ " << s;
    for (const auto& s : c.no_match) EXPECT_FALSE(FullMatch(g, s)) << c.pattern << " !~ " << s;
  }
}

TEST(Regex, UnsupportedFeaturesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a(?=b)", "lookahead"},
      {"(?<=a)b", "lookbehind"},
      {"(a)\\1", "backreference"},
      {"\\bword", "word boundary"},
      {"\\p{L}", "property"},
      {"a^b", "anchor"},
      {"(?<n>a)\\k<n>", "backreference"},
  };
  for (const auto& [pattern, feature] : cases) {
    Grammar g;
    auto expr = RegexToExpr(pattern, {}, &g);
    ASSERT_FALSE(expr.ok()) << pattern;
    EXPECT_NE(expr.status().message().find(feature), std::string::npos)
        << pattern << ": " << expr.status().ToString();
  }
  Grammar g;
  EXPECT_FALSE(RegexToExpr("a{3,2}", {}, &g).ok());
  EXPECT_FALSE(RegexToExpr("(ab", {}, &g).ok());
  EXPECT_FALSE(RegexToExpr("ab)", {}, &g).ok());
  EXPECT_FALSE(RegexToExpr("[b-a]", {}, &g).ok());
  EXPECT_FALSE(RegexToExpr("*a", {}, &g).ok());
  // An empty class matches nothing: the grammar is refused when compiled.
  Grammar empty;
  empty.set_root(empty.DefineRule("root", *RegexToExpr("[]a", {}, &empty)));
  EXPECT_FALSE(testutil::ByteCompiler().Compile(empty).ok());
}

TEST(Regex, ClassRepeatShapes) {
  auto r = AsClassRepeat("^[a-z0-9_]{3,32}$", true);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->min, 3u);
  EXPECT_EQ(r->max, 32u);
  EXPECT_EQ(r->codepoints.size(), 3u);
  EXPECT_FALSE(AsClassRepeat("[a-z]{3}", true).has_value());  // unanchored: substring search
  EXPECT_TRUE(AsClassRepeat("[a-z]{3}", false).has_value());
  EXPECT_FALSE(AsClassRepeat("^ab$", true).has_value());
  EXPECT_TRUE(AsClassRepeat("^.*$", true).has_value());
}

}  // namespace
}  // namespace dinfer::structured
