// The engine on the GPU: EngineCore with its forward pass on CUDA (f32 weights, so numerics stay
// next to the CPU's) produces the same tokens as on the CPU, for greedy and seeded sampled
// requests arriving at different steps, with chunked prefill and asynchronous scheduling; and
// with bf16 weights it serves the same requests to completion.
#include <map>
#include <random>

#include "engine/engine_core.h"
#include "gpu_test_util.h"
#include "model/loader.h"

namespace dinfer {
namespace {

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % 256);
  return p;
}

std::map<int64_t, std::vector<int32_t>> Serve(EngineCore& core, int requests) {
  std::map<int64_t, std::vector<int32_t>> out;
  int added = 0;
  for (int step = 0; added < requests || core.HasWork(); ++step) {
    if (added < requests && step % 2 == 0) {
      RequestOptions o;
      o.max_tokens = 12 + added;
      o.has_seed = true;
      o.sampling.seed = 100 + added;
      o.sampling.temperature = added % 2 == 0 ? 0.0 : 0.8;
      EXPECT_TRUE(core.AddRequest(added + 1, Prompt(9 + 11 * added, added + 1), o).ok());
      ++added;
    }
    for (const TokenDelta& d : core.Step()) {
      EXPECT_TRUE(d.error.empty()) << d.error;
      auto& v = out[d.request_id];
      v.insert(v.end(), d.tokens.begin(), d.tokens.end());
    }
    if (step > 10000) break;
  }
  return out;
}

TEST(GpuEngine, SameTokensAsTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* arch : {"llama", "qwen3", "mistral"}) {
    auto lm = LoadModel(std::string(DINFER_SOURCE_DIR) + "/tests/data/models/" + arch,
                        LoadOptions{false, false});
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    EngineConfig cfg;
    cfg.threads = 2;
    cfg.num_kv_blocks = 128;
    cfg.scheduler.max_num_batched_tokens = 48;  // prompts are cut into chunks
    cfg.scheduler.max_model_len = 256;
    EngineCore cpu(*lm->model, cfg);
    const auto want = Serve(cpu, 6);
    cfg.device = Device::kCuda;
    cfg.cuda_dtype = DType::kF32;
    EngineCore gpu(*lm->model, cfg);
    ASSERT_TRUE(gpu.runner().status().ok()) << gpu.runner().status().ToString();
    const auto got = Serve(gpu, 6);
    ASSERT_EQ(want.size(), 6u);
    EXPECT_EQ(got, want) << arch;

    cfg.cuda_dtype = DType::kBF16;
    EngineCore gpu_bf16(*lm->model, cfg);
    const auto bf16 = Serve(gpu_bf16, 6);
    ASSERT_EQ(bf16.size(), 6u);
    for (const auto& [id, tokens] : bf16) {
      EXPECT_EQ(tokens.size(), want.at(id).size()) << arch << " request " << id;
    }
  }
}

}  // namespace
}  // namespace dinfer
