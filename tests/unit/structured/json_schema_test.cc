// JSON Schema translation beyond the official suite: drafts 2019/2020 keywords, generation
// policies (property order, whitespace, compact literals), bounds, formats and refusals.
#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "structured/number_range.h"
#include "test_util.h"

namespace dinfer::structured {
namespace {

std::shared_ptr<const CompiledGrammar> Schema(const std::string& schema, int max_ws = 16) {
  JsonSchemaOptions o;
  o.max_whitespace = max_ws;
  auto g = JsonSchemaToGrammar(std::string_view(schema), o);
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto c = testutil::ByteCompiler().Compile(*g);
  EXPECT_TRUE(c.ok()) << schema << ": " << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

void Expect(const std::string& schema, const std::vector<std::string>& valid,
            const std::vector<std::string>& invalid, int max_ws = 16) {
  auto g = Schema(schema, max_ws);
  ASSERT_NE(g, nullptr);
  for (const auto& v : valid) EXPECT_TRUE(testutil::FullMatch(g, v)) << schema << " ~ " << v;
  for (const auto& v : invalid) EXPECT_FALSE(testutil::FullMatch(g, v)) << schema << " !~ " << v;
}

TEST(JsonSchema, PropertiesInSchemaOrderWithOptionalOnes) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},
    "b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})";
  Expect(s,
         {R"({"b":"x"})", R"({"a":1,"b":"x","c":true})", R"({"a":1,"b":"x"})",
          R"({"b":"","c":false})"},
         {R"({})", R"({"b":"x","a":1})", R"({"a":1})", R"({"b":"x",})", R"({"b":"x","d":1})"});
}

TEST(JsonSchema, AdditionalPropertiesComeLastAndNeverRepeatListedNames) {
  const std::string s = R"({"type":"object","properties":{"id":{"type":"integer"}}})";
  Expect(s, {R"({"id":1,"x":"any","y":[1,{}]})", R"({"other":null})", R"({"ids":2})", R"({"i":3})"},
         {R"({"id":1,"id":2})", R"({"x":1,"id":2})", R"({"id":"no"})"});
  Expect(R"({"type":"object","additionalProperties":{"type":"integer"}})", {R"({"a":1,"b":2})"},
         {R"({"a":"1"})"});
}

TEST(JsonSchema, WhitespacePolicy) {
  const std::string s =
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}})";
  Expect(s, {"{\n  \"a\": [ 1, 2 ]\n}", R"({"a":[1,2]})"}, {" {\"a\":[]}", "{\"a\":[]}\n"});
  Expect(s, {R"({"a":[1,2]})"}, {R"({"a": [1]})", R"({ "a":[1]})"}, /*max_ws=*/0);
  Expect(s, {"{\"a\":  [1]}"}, {"{\"a\":   [1]}"}, /*max_ws=*/2);
}

TEST(JsonSchema, Draft2020Keywords) {
  Expect(R"({"$defs":{"n":{"type":"integer","minimum":0}},"type":"array",
    "prefixItems":[{"type":"string"},{"$ref":"#/$defs/n"}],"items":false})",
         {R"(["a",1])", R"(["a"])", "[]"}, {R"(["a",-1])", R"(["a",1,2])", R"([1])"});
  Expect(R"({"$defs":{"x":{"$anchor":"pos","type":"integer","exclusiveMinimum":0}},"$ref":"#pos"})",
         {"1", "42"}, {"0", "-3"});
  // 2020-12: keywords next to $ref apply too.
  Expect(R"({"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":2})", {R"("ab")"},
         {R"("abc")"});
}

TEST(JsonSchema, RecursionThroughRefs) {
  const std::string s = R"({"$ref":"#/definitions/node","definitions":{"node":{"type":"object",
    "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/definitions/node"}}},
    "required":["v"],"additionalProperties":false}}})";
  Expect(s, {R"({"v":1})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"},
         {R"({"v":1,"kids":[{}]})", R"({"kids":[]})"});
}

TEST(JsonSchema, StringsCountCharactersNotBytesOrEscapes) {
  Expect(R"({"type":"string","minLength":2,"maxLength":3})",
         {R"("ab")", R"("abc")", "\"\xC3\xA9\xC3\xA9\"", R"("\n\t")", R"("\u00e9x")",
          R"("\ud83d\ude00a")"},
         {R"("a")", R"("abcd")", "\"\xC3\xA9\"", R"("\ud83d")"});
  Expect(R"({"type":"string","pattern":"^[a-z]{2,4}$","maxLength":3})", {R"("ab")", R"("abc")"},
         {R"("abcd")", R"("a")", R"("aB")"});
  Expect(R"({"type":"string","pattern":"a\"b"})", {R"("xa\"by")"}, {R"("a\\b")"});
}

TEST(JsonSchema, NumbersWithBoundsAndMultipleOf) {
  Expect(R"({"type":"integer","minimum":-5,"exclusiveMaximum":12})", {"-5", "0", "11", "7"},
         {"-6", "12", "100", "-0", "1.0", "01"});
  Expect(R"({"type":"number","minimum":0.5,"maximum":2.25})", {"0.5", "1", "2.25", "2.2", "0.75"},
         {"0.49", "2.26", "-1", "3", "1e0"});
  Expect(R"({"type":"number","exclusiveMinimum":0,"multipleOf":0.01})",
         {"0.01", "3.5", "12.34", "1.500"}, {"0", "0.001", "-1", "1.234"});
  Expect(R"({"type":"number"})", {"-0.5e-3", "1E+9", "0", "12.0"}, {"01", ".5", "1.", "+1"});
}

TEST(JsonSchema, FormatsAreEnforced) {
  Expect(R"({"type":"string","format":"date-time"})",
         {R"("2024-02-29T12:30:00Z")", R"("1999-12-31t23:59:59.5+01:00")"},
         {R"("2023-02-29T12:30:00Z")", R"("2024-13-01T00:00:00Z")", R"("2024-01-01")"});
  Expect(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
         {R"("123e4567e89b12d3a456426614174000")"});
  Expect(R"({"type":"string","format":"ipv4"})", {R"("192.168.0.1")"},
         {R"("256.1.1.1")", R"("01.1.1.1")"});
  Expect(R"({"type":"string","format":"email"})", {R"("a.b@example.org")"},
         {R"("a@b")", R"("@x.org")"});
  // Unknown formats only annotate.
  Expect(R"({"type":"string","format":"my-own"})", {R"("anything")"}, {});
}

TEST(JsonSchema, LiteralsAreCompactAndFilteredByTheOtherKeywords) {
  Expect(R"({"enum":[1,"a",{"k":[true,null]},"b"],"type":["string","object"],"maxLength":1})",
         {R"("a")", R"("b")", R"({"k":[true,null]})"}, {"1", R"({"k": [true,null]})"});
  Expect(R"({"const":2.5})", {"2.5"}, {"2.50"});
}

TEST(JsonSchema, AnyOfOneOfAllOf) {
  Expect(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})", {"1", R"("a")"},
         {R"("ab")", "true"});
  Expect(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},
    "required":["kind"]},{"type":"object","properties":{"kind":{"const":"b"}},"required":["kind"]}]})",
         {R"({"kind":"a","x":1})", R"({"kind":"b"})"}, {R"({"kind":"c"})"});
  Expect(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
    {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
         {R"({"a":1,"b":"x"})", R"({"a":1,"b":"x","c":1})"}, {R"({"a":1})", R"({"b":"x","a":1})"});
  // additionalProperties does not see properties listed inside allOf: nothing matches this.
  auto none = JsonSchemaToGrammar(std::string_view(
      R"({"type":"object","allOf":[{"properties":{"a":{}},"required":["a"]}],"additionalProperties":false})"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(testutil::ByteCompiler().Compile(*none).ok());
}

TEST(JsonSchema, OneOfToldApartByRequiredPropertiesExcludesTheOthers) {
  // Each alternative is generated without what only the others require: nothing matches two.
  Expect(R"({"type":"object","properties":{"ssn":{"type":"string"},"ein":{"type":"string"}},
    "oneOf":[{"required":["ssn"]},{"required":["ein"]}]})",
         {R"({"ssn":"1"})", R"({"ein":"2"})", R"({"ssn":"1","x":0})"},
         {R"({"ssn":"1","ein":"2"})", R"({})", R"({"x":0,"ein":"2","ssn":"1"})"});
  auto g = JsonSchemaToGrammar(
      std::string_view(R"({"oneOf":[{"required":["a"]},{"required":["a","b"]}]})"));
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);  // the second contains the first
}

TEST(JsonSchema, PatternPropertiesForEveryKeyAreAdditionalProperties) {
  Expect(R"({"type":"object","patternProperties":{".*":{"type":"integer"}}})", {R"({"a":1,"b":2})"},
         {R"({"a":"x"})"});
}

TEST(JsonSchema, PatternPropertiesAndOtherKeys) {
  // Keys matching ^x- take integers, other keys strings; the listed "x-id" takes both schemas.
  const std::string s = R"({"type":"object","properties":{"x-id":{"minimum":5}},
    "patternProperties":{"^x-":{"type":"integer"}},"additionalProperties":{"type":"string"}})";
  Expect(s, {R"({"x-id":7,"x-a":1,"b":"s"})", R"({"b":"s","x-c":-2})", R"({})"},
         {R"({"x-id":3})", R"({"x-a":"s"})", R"({"b":1})", R"({"x-id":7,"x-id":8})"});
  Expect(R"({"patternProperties":{"^a":{"type":"integer"},"^b":{"type":"string"}},
    "additionalProperties":false,"type":"object"})",
         {R"({"a1":1,"b1":"x"})"}, {R"({"c":1})", R"({"a":"x"})"});
  auto g = JsonSchemaToGrammar(
      std::string_view(R"({"patternProperties":{"a":{"type":"integer"},"b":{"type":"string"}}})"));
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);  // "ab" would need both
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"not":{"type":"string"}})", "not"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
      {R"({"type":"array","contains":{"type":"integer"}})", "contains"},
      {R"({"if":{"type":"string"},"then":{"maxLength":2}})", "if"},
      {R"({"type":"object","dependencies":{"a":["b"]}})", "dependencies"},
      {R"({"oneOf":[{"type":"integer"},{"minimum":2}]})", "oneOf"},
      {R"({"type":"number","multipleOf":3})", "multipleOf"},
      {R"({"$ref":"http://example.com/schema.json"})", "remote"},
      {R"J({"type":"string","pattern":"(?=x)"})J", "lookahead"},
  };
  for (const auto& [schema, word] : cases) {
    auto g = JsonSchemaToGrammar(std::string_view(schema));
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented) << g.status().ToString();
    EXPECT_NE(g.status().message().find(word), std::string::npos) << g.status().ToString();
  }
  EXPECT_EQ(JsonSchemaToGrammar(std::string_view("{bad json")).status().code(),
            StatusCode::kInvalidArgument);
  auto empty =
      JsonSchemaToGrammar(std::string_view(R"({"type":"integer","minimum":5,"maximum":3})"));
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(testutil::ByteCompiler().Compile(*empty).ok());  // no value: refused
}

TEST(NumberRange, DecimalParsing) {
  auto d = Decimal::Parse("-12.5000e-1");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->ToString(), "-1.25");
  EXPECT_EQ(Decimal::Parse("1e3")->ToString(), "1000");
  EXPECT_EQ(Decimal::Parse("-0.0")->ToString(), "0");
  EXPECT_FALSE(Decimal::Parse("1.2.3").has_value());
  EXPECT_LT(Decimal::Compare(*Decimal::Parse("-2"), *Decimal::Parse("-1.5")), 0);
  EXPECT_GT(Decimal::Compare(*Decimal::Parse("0.11"), *Decimal::Parse("0.1")), 0);
}

// Every integer in a window and every two-decimal number, against the bounds directly.
TEST(NumberRange, ExhaustiveSmallWindows) {
  for (const auto& [lo, hi] :
       std::vector<std::pair<int, int>>{{-13, 7}, {0, 99}, {5, 5}, {-100, -10}}) {
    Grammar g;
    NumberBounds b;
    b.min = Decimal::Parse(std::to_string(lo));
    b.max = Decimal::Parse(std::to_string(hi));
    g.set_root(g.DefineRule("root", IntegerExpr(b, &g)));
    auto c = testutil::ByteCompiler().Compile(g);
    ASSERT_TRUE(c.ok());
    for (int v = -150; v <= 150; ++v) {
      EXPECT_EQ(testutil::FullMatch(*c, std::to_string(v)), v >= lo && v <= hi)
          << lo << ".." << hi << ": " << v;
    }
  }
  Grammar g;
  NumberBounds b;
  b.min = Decimal::Parse("-1.05");
  b.max = Decimal::Parse("0.3");
  b.max_exclusive = true;
  g.set_root(g.DefineRule("root", NumberExpr(b, &g)));
  auto c = testutil::ByteCompiler().Compile(g);
  ASSERT_TRUE(c.ok());
  for (int v = -200; v <= 200; ++v) {
    char text[32];
    std::snprintf(text, sizeof(text), "%s%d.%02d", v < 0 ? "-" : "", std::abs(v) / 100,
                  std::abs(v) % 100);
    const bool in = v >= -105 && v < 30;
    EXPECT_EQ(testutil::FullMatch(*c, text), in) << text;
  }
}

}  // namespace
}  // namespace dinfer::structured
