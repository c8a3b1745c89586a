// Chat templates against HF transformers: the Jinja language cases, seeded random programs, and
// every real template of tests/data/chat_templates on every conversation, rendered exactly as
// apply_chat_template renders them, and tokenized (EncodeSegments) to the ids
// apply_chat_template(tokenize=True) gives. Fixtures:
// scripts/fixtures/make_chat_template_fixtures.py.

#include <ctime>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <boost/json.hpp>

#include "tokenizer/chat_template.h"
#include "unit/tokenizer/test_util.h"

namespace dinfer::tokenizer {
namespace {

namespace json = boost::json;
using testutil::FileExists;
using testutil::TokenizersDir;

std::string DataDir() { return DINFER_SOURCE_DIR "/tests/data/chat_templates"; }

std::string ReadText(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : std::string();
}

json::object ReadJson(const std::string& path) { return json::parse(ReadText(path)).as_object(); }

// The fixtures pin strftime_now to a local time ("2026-03-14T09:05:07").
std::chrono::system_clock::time_point FixedNow(std::string_view iso) {
  std::tm tm{};
  std::sscanf(std::string(iso).c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
              &tm.tm_hour, &tm.tm_min, &tm.tm_sec);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&tm));
}

// FNV-1a (64-bit) over the ids as little-endian int32s, as the fixture script hashes them.
std::string Fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    for (int shift = 0; shift < 32; shift += 8) {
      h = (h ^ ((u >> shift) & 0xFF)) * 0x100000001b3ull;
    }
  }
  return fmt::format("{:016x}", h);
}

// The fixture setup's tokenizer: a derived variant with the template's special tokens added.
const Tokenizer* SetupTokenizer(const json::object& setup) {
  std::vector<std::string> specials;
  for (const auto& s : setup.at("added_specials").as_array()) specials.emplace_back(s.as_string());
  return testutil::TokenizerWithSpecials(std::string(setup.at("tokenizer").as_string()), specials);
}

class ChatTemplateFixtures : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setups_ = new json::object(ReadJson(DataDir() + "/setups.json"));
    conversations_ = new json::object(ReadJson(DataDir() + "/conversations.json"));
  }
  static void TearDownTestSuite() {
    delete setups_;
    delete conversations_;
  }

  static ChatRenderOptions Options(const json::object& kwargs, bool add_generation_prompt) {
    ChatRenderOptions o;
    o.add_generation_prompt = add_generation_prompt;
    o.kwargs = kwargs;
    o.now = FixedNow(setups_->at("now").as_string());
    return o;
  }

  static json::object* setups_;
  static json::object* conversations_;
};
json::object* ChatTemplateFixtures::setups_ = nullptr;
json::object* ChatTemplateFixtures::conversations_ = nullptr;

TEST_F(ChatTemplateFixtures, JinjaLanguageMatchesJinja2) {
  const auto rows = testutil::ReadJsonl(DataDir() + "/jinja_cases.jsonl");
  ASSERT_GT(rows.size(), 50u);
  int passed = 0;
  for (const json::object& row : rows) {
    const std::string source(row.at("template").as_string());
    json::object vars = row.at("vars").as_object();
    json::array messages;
    if (const json::value* m = vars.if_contains("messages")) {
      messages = m->as_array();
      vars.erase("messages");
    }
    const bool want_error = row.contains("error");
    auto tmpl = ChatTemplate::Parse(source);
    if (!tmpl.ok()) {
      EXPECT_TRUE(want_error) << source << "\n" << tmpl.status().ToString();
      passed += want_error;
      continue;
    }
    auto segments = tmpl->Render(messages, Options(vars, false));
    if (want_error) {
      EXPECT_FALSE(segments.ok()) << source << "\nrendered: "
                                  << (segments.ok() ? ChatTemplate::Join(*segments) : "");
      passed += !segments.ok();
      continue;
    }
    ASSERT_TRUE(segments.ok()) << source << "\n" << segments.status().ToString();
    const std::string text = ChatTemplate::Join(*segments);
    const std::string want(row.at("text").as_string());
    EXPECT_EQ(text, want) << source;
    passed += text == want;
  }
  std::printf("[   INFO   ] %d/%zu Jinja cases agree with jinja2\n", passed, rows.size());
}

TEST_F(ChatTemplateFixtures, RandomProgramsMatchJinja2) {
  const json::object data = ReadJson(DataDir() + "/jinja_random.json");
  for (const char* kind : {"expressions", "templates"}) {
    const json::object& set = data.at(kind).as_object();
    const json::array& cases = set.at("cases").as_array();
    ASSERT_GT(cases.size(), 100u);
    int agree = 0;
    for (const json::value& c : cases) {
      const std::string source(c.at("template").as_string());
      const bool want_error = c.as_object().contains("error");
      auto tmpl = ChatTemplate::Parse(source);
      auto segments = tmpl.ok() ? tmpl->Render({}, Options(set.at("vars").as_object(), false))
                                : StatusOr<std::vector<PromptSegment>>(tmpl.status());
      if (want_error) {
        EXPECT_FALSE(segments.ok()) << source << "\njinja2: " << c.at("error").as_string()
                                    << "\nrendered: " << ChatTemplate::Join(*segments);
        agree += !segments.ok();
        continue;
      }
      ASSERT_TRUE(segments.ok()) << source << "\n" << segments.status().ToString();
      const std::string text = ChatTemplate::Join(*segments);
      const std::string want(c.at("text").as_string());
      EXPECT_EQ(text, want) << source;
      agree += text == want;
    }
    std::printf("[   INFO   ] %d/%zu random %s agree with jinja2\n", agree, cases.size(), kind);
  }
}

TEST_F(ChatTemplateFixtures, RealTemplatesMatchTransformers) {
  const auto rows = testutil::ReadJsonl(DataDir() + "/chat_cases.jsonl");
  ASSERT_GT(rows.size(), 100u);
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, std::pair<int, int>> agreement;  // template -> (agree, total)
  int ids_checked = 0;
  for (const json::object& row : rows) {
    const std::string name(row.at("template").as_string());
    if (!templates.count(name)) {
      auto t = ChatTemplate::Parse(ReadText(DataDir() + "/" + name + ".jinja"));
      ASSERT_TRUE(t.ok()) << name << ": " << t.status().ToString();
      templates.emplace(name, std::move(t).value());
    }
    const json::object& setup = setups_->at("templates").at(name).as_object();
    const json::object& conv = conversations_->at(row.at("conversation").as_string()).as_object();
    ChatRenderOptions o =
        Options(row.at("kwargs").as_object(), row.at("add_generation_prompt").as_bool());
    o.bos_token = setup.at("bos_token").as_string();
    o.eos_token = setup.at("eos_token").as_string();
    if (const json::value* tools = conv.if_contains("tools")) o.tools = *tools;
    if (const json::value* documents = conv.if_contains("documents")) o.documents = *documents;
    o.continue_final_message = row.contains("continue_final_message");
    const std::string label =
        fmt::format("{} / {} / gen={} / continue={} / {}", name,
                    std::string_view(row.at("conversation").as_string()),
                    row.at("add_generation_prompt").as_bool(), o.continue_final_message,
                    json::serialize(row.at("kwargs")));
    auto segments = templates.at(name).Render(conv.at("messages").as_array(), o);
    auto& [agree, total] = agreement[name];
    ++total;
    if (row.contains("error")) {
      EXPECT_FALSE(segments.ok()) << label << ": transformers fails with "
                                  << row.at("error").as_string();
      if (segments.ok()) continue;
      // raise_exception's message reaches the caller.
      const std::string want(row.at("error").as_string());
      if (want.rfind("TemplateError: ", 0) == 0) {
        EXPECT_NE(segments.status().message().find(want.substr(15)), std::string::npos)
            << label << ": " << segments.status().message();
      }
      ++agree;
      continue;
    }
    ASSERT_TRUE(segments.ok()) << label << ": " << segments.status().ToString();
    const std::string text = ChatTemplate::Join(*segments);
    const std::string want(row.at("text").as_string());
    EXPECT_EQ(text, want) << label;
    agree += text == want;
    // Template markers are special tokens, the rest is text: the ids transformers gives.
    if (const Tokenizer* tok = SetupTokenizer(setup)) {
      const std::vector<int32_t> ids = tok->EncodeSegments(*segments);
      EXPECT_EQ(ids.size(), row.at("num_ids").to_number<size_t>()) << label;
      EXPECT_EQ(Fnv1a(ids), row.at("ids_fnv1a").as_string())
          << label << "\n ids: " << fmt::format("{}", fmt::join(ids, ","));
      ++ids_checked;
    }
  }
  if (ids_checked == 0) {
    std::printf("[   INFO   ] ids not checked: %s\n", testutil::kMissingTokenizers);
  } else {
    std::printf("[   INFO   ] %d renderings tokenized to the ids of transformers\n", ids_checked);
  }
  for (const auto& [name, counts] : agreement) {
    std::printf("[   INFO   ] %-20s %d/%d renderings agree with transformers\n", name.c_str(),
                counts.first, counts.second);
  }
}

}  // namespace
}  // namespace dinfer::tokenizer
