// Structured outputs through the public Engine on the default model: every constrained request
// produces text that follows its JSON Schema, regex, grammar or choice list (checked here
// independently of the matcher), batched with unconstrained ones; an unsupported schema is
// refused at Submit and the engine keeps serving.
#include <gtest/gtest.h>

#include <regex>

#include <boost/json.hpp>

#include "dinfer/engine.h"
#include "model/loader.h"

namespace dinfer {
namespace {

namespace json = boost::json;

Engine* DefaultEngine() {
  static std::unique_ptr<Engine> engine = []() -> std::unique_ptr<Engine> {
    if (!ResolveDefaultModel().ok()) return nullptr;
    EngineOptions o;
    o.model = "default";
    o.show_progress = false;
    o.kv_cache_mib = 256;
    auto e = Engine::Create(o);
    return e.ok() ? std::move(e).value() : nullptr;
  }();
  return engine.get();
}

std::string Chat(const std::string& user) {
  return "<|im_start|>system\nYou are a helpful assistant that answers in JSON.<|im_end|>\n"
         "<|im_start|>user\n" +
         user + "<|im_end|>\n<|im_start|>assistant\n";
}

RequestSpec Spec(const std::string& prompt, StructuredOutput so, uint64_t seed) {
  RequestSpec r;
  r.prompt = Chat(prompt);
  r.sampling.temperature = 0.7;
  r.sampling.seed = seed;
  r.sampling.max_tokens = 192;
  r.sampling.structured = std::move(so);
  return r;
}

struct Result {
  std::string text, finish, error;
};

Result Drain(RequestStream& s) {
  Result r;
  while (auto out = s.Next()) {
    r.text += out->text;
    if (out->finished) {
      r.finish = out->finish_reason;
      r.error = out->error;
    }
  }
  return r;
}

constexpr char kPersonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    "email": {"type": "string", "format": "email", "maxLength": 32}
  },
  "required": ["name", "age", "role"],
  "additionalProperties": false
})";

void CheckPerson(const std::string& text) {
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  ASSERT_FALSE(ec) << "not JSON: " << text;
  ASSERT_TRUE(v.is_object()) << text;
  const json::object& o = v.as_object();
  for (const auto& kv : o) {
    EXPECT_TRUE(kv.key() == "name" || kv.key() == "age" || kv.key() == "role" ||
                kv.key() == "tags" || kv.key() == "email")
        << text;
  }
  ASSERT_TRUE(o.contains("name") && o.at("name").is_string()) << text;
  const size_t name_len = o.at("name").as_string().size();
  EXPECT_GE(name_len, 1u);
  ASSERT_TRUE(o.contains("age") && o.at("age").is_int64()) << text;
  EXPECT_GE(o.at("age").as_int64(), 0);
  EXPECT_LE(o.at("age").as_int64(), 120);
  ASSERT_TRUE(o.contains("role") && o.at("role").is_string()) << text;
  const std::string role(o.at("role").as_string());
  EXPECT_TRUE(role == "admin" || role == "user" || role == "guest") << text;
  if (o.contains("tags")) {
    ASSERT_TRUE(o.at("tags").is_array()) << text;
    EXPECT_LE(o.at("tags").as_array().size(), 3u);
  }
  if (o.contains("email")) {
    const std::string email(o.at("email").as_string());
    EXPECT_NE(email.find('@'), std::string::npos) << text;
  }
}

TEST(StructuredEngine, ConstrainedRequestsFollowTheirGrammarsInOneBatch) {
  Engine* engine = DefaultEngine();
  if (!engine) GTEST_SKIP() << "default model not installed (scripts/setup)";
  std::vector<std::shared_ptr<RequestStream>> person, other;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    auto s = engine->Submit(Spec("Describe a user of our website.",
                                 StructuredOutput{"json_schema", kPersonSchema, {}, 16}, seed));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    person.push_back(*s);
  }
  auto date = engine->Submit(Spec("When was the Eiffel Tower finished?",
                                  StructuredOutput{"regex", R"(\d{4}-\d{2}-\d{2})", {}, 16}, 4));
  auto pick = engine->Submit(Spec("Is the sky green? Answer yes or no.",
                                  StructuredOutput{"choice", "", {"yes", "no"}, 16}, 5));
  auto ebnf = engine->Submit(Spec(
      "Give a short arithmetic sum.",
      StructuredOutput{
          "grammar", "root ::= num (\" + \" num)+ \" = \" num\nnum ::= [1-9] [0-9]?\n", {}, 16},
      6));
  RequestSpec short_object =
      Spec("List two colors as JSON.", StructuredOutput{"json_object", "", {}, 0}, 7);
  short_object.sampling.max_tokens = 24;
  auto any = engine->Submit(short_object);
  RequestSpec free = Spec("Say hello.", StructuredOutput{}, 8);
  free.sampling.max_tokens = 8;
  auto plain = engine->Submit(free);
  for (auto* s : {&date, &pick, &ebnf, &any, &plain})
    ASSERT_TRUE(s->ok()) << s->status().ToString();

  for (auto& s : person) {
    const Result r = Drain(*s);
    EXPECT_EQ(r.finish, "stop") << r.text << r.error;
    CheckPerson(r.text);
  }
  const Result d = Drain(**date);
  EXPECT_TRUE(std::regex_match(d.text, std::regex(R"(\d{4}-\d{2}-\d{2})"))) << d.text;
  EXPECT_EQ(d.finish, "stop");
  const Result p = Drain(**pick);
  EXPECT_TRUE(p.text == "yes" || p.text == "no") << p.text;
  const Result e = Drain(**ebnf);
  EXPECT_TRUE(
      std::regex_match(e.text, std::regex(R"([1-9][0-9]?( \+ [1-9][0-9]?)+ = [1-9][0-9]?)")))
      << e.text;
  // Near its token limit a request is steered to a shortest completion: it ends complete.
  const Result a = Drain(**any);
  EXPECT_EQ(a.finish, "stop") << a.text;
  boost::system::error_code ec;
  const json::value v = json::parse(a.text, ec);
  EXPECT_FALSE(ec) << a.text;
  EXPECT_TRUE(v.is_object()) << a.text;
  EXPECT_EQ(Drain(**plain).finish, "length");
}

TEST(StructuredEngine, UnsupportedOrInvalidConstraintsAreRefusedAtSubmit) {
  Engine* engine = DefaultEngine();
  if (!engine) GTEST_SKIP() << "default model not installed (scripts/setup)";
  auto s = engine->Submit(Spec(
      "x", StructuredOutput{"json_schema", R"({"type": "array", "uniqueItems": true})", {}, 16},
      1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.status().message().find("uniqueItems"), std::string::npos) << s.status().ToString();
  EXPECT_FALSE(
      engine->Submit(Spec("x", StructuredOutput{"json_schema", "{not json", {}, 16}, 1)).ok());
  EXPECT_FALSE(engine->Submit(Spec("x", StructuredOutput{"regex", "(?=a)", {}, 16}, 1)).ok());
  EXPECT_FALSE(engine->Submit(Spec("x", StructuredOutput{"yaml", "a", {}, 16}, 1)).ok());
  // The engine still serves.
  auto ok =
      engine->Submit(Spec("Pick one.", StructuredOutput{"choice", "", {"red", "blue"}, 16}, 2));
  ASSERT_TRUE(ok.ok());
  const Result r = Drain(**ok);
  EXPECT_TRUE(r.text == "red" || r.text == "blue") << r.text;
}

}  // namespace
}  // namespace dinfer
