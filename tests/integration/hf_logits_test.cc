// Tiny random-weight models of every dense architecture: dinfer's logits against those of HF
// transformers (float32), over a 64-token prompt and 16 decode steps. Fixtures come from
// scripts/fixtures/make_model_fixtures.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "model/loader.h"
#include "row_error.h"
#include "runner/model_runner.h"

namespace dinfer {
namespace {

constexpr double kRelTol = 1e-4;

std::string ModelDir(const std::string& arch) {
  return std::string(DINFER_SOURCE_DIR) + "/tests/data/models/" + arch;
}

std::vector<int32_t> Ints(const boost::json::value& v) {
  std::vector<int32_t> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<int32_t>(x.to_number<int64_t>()));
  return out;
}

// Largest |a - b| over a row, relative to the row's largest reference magnitude.
class HfLogitsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfLogitsTest, MatchesTransformers) {
  const std::string dir = ModelDir(GetParam());
  auto fixture_text = ReadFileToString(dir + "/fixture.json");
  ASSERT_TRUE(fixture_text.ok()) << fixture_text.status().ToString();
  const auto fixture = boost::json::parse(*fixture_text).as_object();
  const std::vector<int32_t> prompt = Ints(fixture.at("prompt_ids"));
  const std::vector<int32_t> decode = Ints(fixture.at("decode_ids"));
  auto ref_bytes = ReadFileToString(dir + "/logits.f32");
  ASSERT_TRUE(ref_bytes.ok());
  const auto* ref = reinterpret_cast<const float*>(ref_bytes->data());

  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const int64_t vocab = lm->config.vocab_size;
  ASSERT_EQ(ref_bytes->size(), (prompt.size() + decode.size()) * vocab * sizeof(float));

  // Block size 16 with the blocks in scrambled order, so the paged layout is exercised.
  RunnerOptions ro;
  ro.block_size = 16;
  ro.num_blocks = 16;
  ro.threads = 2;
  ModelRunner runner(*lm->model, ro);
  std::vector<int32_t> table(16);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());

  SeqChunk prefill{prompt, 0, table, SeqChunk::Logits::kAll};
  auto logits = runner.Execute(std::span(&prefill, 1));
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ASSERT_EQ(logits->rows(), static_cast<int64_t>(prompt.size()));
  double worst = 0;
  for (size_t r = 0; r < prompt.size(); ++r) {
    const double e = RowRelError(logits->as<float>() + r * vocab, ref + r * vocab, vocab);
    worst = std::max(worst, e);
    EXPECT_LE(e, kRelTol) << GetParam() << " prompt row " << r;
  }
  int64_t pos = static_cast<int64_t>(prompt.size());
  for (size_t i = 0; i < decode.size(); ++i, ++pos) {
    SeqChunk step{std::span(&decode[i], 1), pos, table, SeqChunk::Logits::kLast};
    auto l = runner.Execute(std::span(&step, 1));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    const float* want = ref + (prompt.size() + i) * vocab;
    const double e = RowRelError(l->as<float>(), want, vocab);
    worst = std::max(worst, e);
    EXPECT_LE(e, kRelTol) << GetParam() << " decode step " << i;
  }
  std::printf("%s: worst relative logit error %.3g over %zu rows\n", GetParam().c_str(), worst,
              prompt.size() + decode.size());
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfLogitsTest,
                         ::testing::Values("llama", "smollm2", "qwen2", "qwen3", "mistral"));

}  // namespace
}  // namespace dinfer
