#include "structured/ebnf.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace dinfer::structured {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const std::string& text) {
  auto g = EbnfToGrammar(text);
  EXPECT_TRUE(g.ok()) << text << ": " << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto c = testutil::ByteCompiler().Compile(*g);
  EXPECT_TRUE(c.ok()) << text << ": " << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

void Expect(const std::string& grammar, const std::vector<std::string>& valid,
            const std::vector<std::string>& invalid) {
  auto g = Compile(grammar);
  ASSERT_NE(g, nullptr);
  for (const auto& v : valid) EXPECT_TRUE(testutil::FullMatch(g, v)) << grammar << " ~ " << v;
  for (const auto& v : invalid) EXPECT_FALSE(testutil::FullMatch(g, v)) << grammar << " !~ " << v;
}

TEST(Ebnf, Gbnf) {
  const std::string arithmetic = R"G(
# Arithmetic with precedence, written without left recursion.
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+
)G";
  Expect(arithmetic, {"1", "1+2*3", "(1+2)*3", "((4))"}, {"", "1+", "(1", "1**2", "a"});
  Expect(R"(root ::= "a"{2,3} "b"? [^x\n]{,2} "\x41\u00e9")",
         {"aaA\xC3\xA9", "aaabyzA\xC3\xA9", "aab-A\xC3\xA9"}, {"aA\xC3\xA9", "aaxA\xC3\xA9"});
  Expect(R"(root ::= . "\"" [\]\-]+)", {"\xE2\x82\xAC\"]-"}, {"ab\"]"});
  Expect("root ::= item+\nitem ::= \"<\" name \">\"\nname ::= [a-z-]+", {"<a><b-c>"},
         {"<>", "<A>"});
}

TEST(Ebnf, W3c) {
  const std::string xmlish = R"G(
/* W3C notation: #x characters, single quotes, set difference. */
doc  ::= '<' Name '>' Char* '</' Name '>'
Name ::= [a-zA-Z_] [a-zA-Z0-9_]*
Char ::= [#x20-#x7E] - [<&]
)G";
  Expect(xmlish, {"<a>hi</a>", "<x_1></y>"}, {"<a>h<i</a>", "<1>x</a>"});
}

TEST(Ebnf, RootIsRootElseTheFirstRule) {
  Expect("first ::= \"x\"\nroot ::= \"y\"", {"y"}, {"x"});
  Expect("start ::= \"x\" other\nother ::= \"y\"", {"xy"}, {"y"});
}

TEST(Ebnf, Errors) {
  for (const char* bad :
       {"root ::= undefined", "root ::= \"a", "root ::= [a-", "root ::= (\"a\"",
        "root ::= \"a\"{3,2}", "root ::= \"a\"\nroot ::= \"b\"", "::= \"a\"", ""}) {
    EXPECT_FALSE(EbnfToGrammar(bad).ok()) << bad;
  }
  auto g = EbnfToGrammar("root ::= root \"a\" | \"a\"");
  ASSERT_TRUE(g.ok());
  auto c = testutil::ByteCompiler().Compile(*g);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("left-recursive"), std::string::npos);
  auto diff = EbnfToGrammar("root ::= \"ab\" - \"a\"");
  ASSERT_FALSE(diff.ok());
  EXPECT_EQ(diff.status().code(), StatusCode::kUnimplemented);
}

TEST(Ebnf, Choices) {
  auto c = testutil::ByteCompiler().Compile(ChoiceGrammar({"yes", "no", "yesterday"}));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(testutil::FullMatch(*c, "yes"));
  EXPECT_TRUE(testutil::FullMatch(*c, "yesterday"));
  EXPECT_FALSE(testutil::FullMatch(*c, "ye"));
  EXPECT_FALSE(testutil::FullMatch(*c, "maybe"));
}

}  // namespace
}  // namespace dinfer::structured
