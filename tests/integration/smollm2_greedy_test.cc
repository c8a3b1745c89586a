// The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF): greedy 64-token continuations of
// five chat prompts equal those of a reference implementation on the same file — llama.cpp, or
// transformers loading the GGUF dequantized (fixtures from bench/peers/llamacpp_greedy.py and
// scripts/fixtures/make_smollm2_greedy.py).
#include <gtest/gtest.h>

#include <filesystem>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "engine/generate.h"
#include "model/loader.h"

namespace dinfer {
namespace {

struct Reference {
  std::string source;
  std::vector<std::vector<int32_t>> prompts, outputs;
};

std::vector<int32_t> Ints(const boost::json::value& v) {
  std::vector<int32_t> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<int32_t>(x.to_number<int64_t>()));
  return out;
}

std::vector<Reference> LoadReferences() {
  std::vector<Reference> refs;
  for (const char* name : {"greedy_llamacpp.json", "greedy_transformers.json"}) {
    const std::string path = std::string(DINFER_SOURCE_DIR) + "/tests/data/smollm2/" + name;
    auto text = ReadFileToString(path);
    if (!text.ok()) continue;
    const auto root = boost::json::parse(*text).as_object();
    Reference r;
    r.source = std::string(root.at("source").as_string());
    for (const auto& p : root.at("prompts").as_array()) {
      r.prompts.push_back(Ints(p.at("prompt_ids")));
      r.outputs.push_back(Ints(p.at("output_ids")));
    }
    refs.push_back(std::move(r));
  }
  return refs;
}

TEST(SmolLM2Greedy, MatchesReferenceImplementation) {
  const auto refs = LoadReferences();
  ASSERT_FALSE(refs.empty()) << "no fixtures in tests/data/smollm2";
  auto lm = LoadModel("default", LoadOptions{false, true});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  RunnerOptions ro;
  ro.threads = 2;
  ro.max_seq_len = 512;
  ModelRunner runner(*lm->model, ro);
  GenerateOptions go;
  go.max_tokens = 64;
  go.sampling.temperature = 0;
  go.ignore_eos = true;
  const size_t num_prompts = refs[0].prompts.size();
  ASSERT_EQ(num_prompts, 5u);
  for (size_t i = 0; i < num_prompts; ++i) {
    auto out = Generate(runner, refs[0].prompts[i], go);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    std::vector<std::string> matched;
    for (const auto& r : refs) {
      ASSERT_EQ(r.prompts[i], refs[0].prompts[i]) << "fixtures disagree on prompt " << i;
      if (out->tokens == r.outputs[i]) matched.push_back(r.source);
    }
    EXPECT_FALSE(matched.empty()) << "prompt " << i << ": greedy output matches no reference";
    for (const auto& m : matched) std::printf("prompt %zu: equal to %s\n", i, m.c_str());
  }
}

}  // namespace
}  // namespace dinfer
