// End to end on the GPU: the tiny random-weight models of every dense architecture
// (tests/data/models/<arch>), run by GpuRunner with f32 and with bf16 weights, against the CPU
// runner on the same chunks (a 64-token prompt, then 16 decode steps, blocks in scrambled
// order) and against the transformers logits those fixtures record. Also: decode steps replayed
// as CUDA graphs (padded to their bucket) match eager ones, and greedy decoding with the tokens
// kept on the device matches decoding through host logits.
#include <algorithm>
#include <numeric>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "gpu_test_util.h"
#include "model/layers/decoder.h"
#include "model/loader.h"
#include "row_error.h"
#include "runner/cuda/gpu_decoder.h"
#include "runner/cuda/gpu_runner.h"
#include "runner/model_runner.h"
#include "sample/sampler.h"

namespace dinfer {
namespace {

using namespace gpu_test;

std::string ModelDir(const std::string& arch) {
  return std::string(DINFER_SOURCE_DIR) + "/tests/data/models/" + arch;
}

std::vector<int32_t> Ints(const boost::json::value& v) {
  std::vector<int32_t> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<int32_t>(x.to_number<int64_t>()));
  return out;
}

// Largest |a - b| over a row, relative to the row's largest reference magnitude (the metric of
// tests/integration/hf_logits_test.cc).
struct Fixture {
  std::vector<int32_t> prompt, decode;
  std::string ref_bytes;  // transformers' logits, f32, prompt rows then decode rows
};

Fixture LoadFixture(const std::string& dir) {
  Fixture f;
  auto text = ReadFileToString(dir + "/fixture.json");
  EXPECT_TRUE(text.ok());
  if (!text.ok()) return f;
  const auto root = boost::json::parse(*text).as_object();
  f.prompt = Ints(root.at("prompt_ids"));
  f.decode = Ints(root.at("decode_ids"));
  auto ref = ReadFileToString(dir + "/logits.f32");
  EXPECT_TRUE(ref.ok());
  if (ref.ok()) f.ref_bytes = std::move(*ref);
  return f;
}

// Runs prompt (all logits) then one decode step per token; returns all rows.
template <typename Exec>
std::vector<float> RunSequence(const Fixture& f, const std::vector<int32_t>& table, int64_t vocab,
                               Exec&& exec) {
  std::vector<float> rows;
  SeqChunk prefill{f.prompt, 0, table, SeqChunk::Logits::kAll};
  auto l = exec(std::span(&prefill, 1));
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return rows;
  rows.insert(rows.end(), l->template as<float>(), l->template as<float>() + l->numel());
  int64_t pos = static_cast<int64_t>(f.prompt.size());
  for (size_t i = 0; i < f.decode.size(); ++i, ++pos) {
    SeqChunk step{std::span(&f.decode[i], 1), pos, table, SeqChunk::Logits::kLast};
    auto r = exec(std::span(&step, 1));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return rows;
    rows.insert(rows.end(), r->template as<float>(), r->template as<float>() + vocab);
  }
  return rows;
}

struct Case {
  std::string arch;
  DType dtype;
};

class GpuModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuModelTest, LogitsMatchCpuAndTransformers) {
  SKIP_WITHOUT_GPU();
  const Case tc = GetParam();
  const std::string dir = ModelDir(tc.arch);
  const Fixture f = LoadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const int64_t vocab = lm->config.vocab_size;
  const size_t total_rows = f.prompt.size() + f.decode.size();
  ASSERT_EQ(f.ref_bytes.size(), total_rows * vocab * sizeof(float));
  const auto* hf = reinterpret_cast<const float*>(f.ref_bytes.data());
  std::vector<int32_t> table(16);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());

  RunnerOptions ro;
  ro.block_size = 16;
  ro.num_blocks = 16;
  ro.threads = 2;
  ModelRunner cpu(*lm->model, ro);
  const auto cpu_rows = RunSequence(f, table, vocab, [&](auto c) { return cpu.Execute(c); });

  const auto* decoder = dynamic_cast<const layers::DecoderModel*>(lm->model.get());
  ASSERT_NE(decoder, nullptr);
  auto gpu_model = GpuDecoder::Upload(*decoder, tc.dtype);
  ASSERT_TRUE(gpu_model.ok()) << gpu_model.status().ToString();
  GpuRunnerOptions go;
  go.num_blocks = 16;
  go.block_size = 16;
  go.max_seq_len = 256;
  go.max_num_tokens = 256;
  go.max_num_seqs = 8;
  go.max_logits_rows = 128;
  auto gpu = GpuRunner::Create(std::move(*gpu_model), go);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const auto gpu_rows = RunSequence(f, table, vocab, [&](auto c) { return (*gpu)->Execute(c); });
  ASSERT_EQ(gpu_rows.size(), total_rows * vocab);
  ASSERT_EQ(cpu_rows.size(), total_rows * vocab);
  EXPECT_GE((*gpu)->graphs_captured(), 1u);  // decode steps ran as graphs

  // f32 on the GPU computes what transformers and the CPU compute (the CPU test's bound);
  // bf16 weights and activations carry about 3 significant digits.
  const double tol = tc.dtype == DType::kF32 ? 1e-4 : 3e-2;
  double worst_cpu = 0, worst_hf = 0;
  for (size_t r = 0; r < total_rows; ++r) {
    const float* g = gpu_rows.data() + r * vocab;
    const double e_cpu = RowRelError(g, cpu_rows.data() + r * vocab, vocab);
    const double e_hf = RowRelError(g, hf + r * vocab, vocab);
    worst_cpu = std::max(worst_cpu, e_cpu);
    worst_hf = std::max(worst_hf, e_hf);
    EXPECT_LE(e_cpu, tol) << tc.arch << " row " << r << " against the CPU";
    EXPECT_LE(e_hf, tol) << tc.arch << " row " << r << " against transformers";
  }
  std::printf("%s %s: worst row error %.3g against the CPU, %.3g against transformers\n",
              tc.arch.c_str(), std::string(DTypeName(tc.dtype)).c_str(), worst_cpu, worst_hf);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const char* arch : {"llama", "smollm2", "qwen2", "qwen3", "mistral"}) {
    cases.push_back({arch, DType::kF32});
    cases.push_back({arch, DType::kBF16});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Architectures, GpuModelTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) {
                           return info.param.arch + "_" + std::string(DTypeName(info.param.dtype));
                         });

// A batch of decode steps: replayed graphs (padded to a bucket) against eager runs, and greedy
// tokens fed back on the device against the host's argmax of the logits.
TEST(GpuRunnerTest, GraphsAndDeviceTokensMatchEager) {
  SKIP_WITHOUT_GPU();
  auto lm = LoadModel(ModelDir("qwen3"), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const auto* decoder = dynamic_cast<const layers::DecoderModel*>(lm->model.get());
  ASSERT_NE(decoder, nullptr);
  const int64_t vocab = lm->config.vocab_size;
  constexpr int kSeqs = 3, kPrompt = 20, kSteps = 12;
  auto make = [&](bool graphs) {
    auto m = GpuDecoder::Upload(*decoder, DType::kF32);
    EXPECT_TRUE(m.ok());
    GpuRunnerOptions o;
    o.num_blocks = 64;
    o.max_seq_len = 128;
    o.max_num_tokens = 128;
    o.max_num_seqs = 8;
    o.cuda_graphs = graphs;
    auto r = GpuRunner::Create(std::move(*m), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(*r);
  };
  std::vector<std::vector<int32_t>> tables(kSeqs), prompts(kSeqs);
  std::mt19937 rng(9);
  for (int s = 0; s < kSeqs; ++s) {
    for (int b = 0; b < 16; ++b) tables[s].push_back(s * 16 + b);
    std::reverse(tables[s].begin(), tables[s].end());
    for (int i = 0; i < kPrompt; ++i) prompts[s].push_back(static_cast<int32_t>(rng() % vocab));
  }
  // Eager, tokens through the host; graphs, tokens from the device.
  auto eager = make(false), graphs = make(true);
  std::vector<std::vector<int32_t>> out_eager(kSeqs), out_graph(kSeqs);
  for (auto* r : {eager.get(), graphs.get()}) {
    std::vector<SeqChunk> chunks;
    for (int s = 0; s < kSeqs; ++s) {
      chunks.push_back({prompts[s], 0, tables[s], SeqChunk::Logits::kLast});
    }
    ASSERT_STATUS_OK(r->Launch(chunks, LaunchOptions{true, false}));
    auto first = r->GreedyTokens();
    ASSERT_TRUE(first.ok());
    std::vector<int32_t> last(first->begin(), first->end());
    auto& out = r == eager.get() ? out_eager : out_graph;
    for (int step = 0; step < kSteps; ++step) {
      for (int s = 0; s < kSeqs; ++s) out[s].push_back(last[s]);
      chunks.clear();
      for (int s = 0; s < kSeqs; ++s) {
        chunks.push_back(
            {std::span(&last[s], 1), kPrompt + step, tables[s], SeqChunk::Logits::kLast});
      }
      if (r == eager.get()) {
        auto logits = r->Execute(chunks);
        ASSERT_TRUE(logits.ok()) << logits.status().ToString();
        for (int s = 0; s < kSeqs; ++s) {
          last[s] = sample::Argmax(std::span<const float>(logits->as<float>() + s * vocab, vocab));
        }
      } else {
        ASSERT_STATUS_OK(r->Launch(chunks, LaunchOptions{true, step > 0}));
        auto tokens = r->GreedyTokens();
        ASSERT_TRUE(tokens.ok());
        last.assign(tokens->begin(), tokens->end());
      }
    }
  }
  EXPECT_EQ(out_eager, out_graph);
  EXPECT_GE(graphs->graphs_captured(), 1u);
  EXPECT_EQ(eager->graphs_captured(), 0u);
}

}  // namespace
}  // namespace dinfer
