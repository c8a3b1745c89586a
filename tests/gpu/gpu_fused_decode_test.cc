// Decode steps of a bf16 model whose widths take the fused path (each RMSNorm and the SiLU·mul run
// inside the staged GEMV after them, the residual stream alternating between two buffers):
// logits of GpuRunner against the CPU runner on a random Llama written as a safetensors
// checkpoint (hidden 2048, MLP 4096, 16 query / 4 KV heads of 128, 2 layers). On the same model,
// an FP8 (e4m3) KV cache against the bf16 one, and the checkpoint's calibrated KV-cache scales
// against the runner's. Skipped without a GPU.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "gpu_test_util.h"
#include "model/layers/decoder.h"
#include "model/loader.h"
#include "row_error.h"
#include "runner/cuda/gpu_decoder.h"
#include "runner/cuda/gpu_runner.h"
#include "runner/model_runner.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace fs = std::filesystem;

constexpr int64_t kHidden = 2048, kInter = 4096, kHeads = 16, kKvHeads = 4, kHeadDim = 128,
                  kVocab = 512, kLayers = 2;

// A random bf16 Llama checkpoint of the widths above, in a fresh directory.
std::string WriteModel() {
  const fs::path dir = fs::temp_directory_path() / ("dinfer_fused_" + std::to_string(::getpid()));
  fs::remove_all(dir);  // no files left by a test that stopped early (kv_scales.safetensors)
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": )"
      << kHidden << R"(, "intermediate_size": )" << kInter << R"(, "num_attention_heads": )"
      << kHeads << R"(, "num_key_value_heads": )" << kKvHeads << R"(, "head_dim": )" << kHeadDim
      << R"(, "num_hidden_layers": )" << kLayers << R"(, "vocab_size": )" << kVocab
      << R"(, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 256,)"
      << R"( "tie_word_embeddings": false, "hidden_act": "silu", "bos_token_id": 1,)"
      << R"( "eos_token_id": 2})";
  std::mt19937 rng(17);
  std::string header = "{", data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto v = Random(static_cast<size_t>(n), rng, scale);
    std::string bytes(static_cast<size_t>(n) * 2, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = F32ToBf16(v[i] + offset);
      std::memcpy(&bytes[static_cast<size_t>(i) * 2], &b, 2);
    }
    std::string dims;
    for (int64_t d : shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"BF16\",\"shape\":[" + dims + "],\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + bytes.size()) + "]}";
    data += bytes;
  };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(kHidden));
  add("model.embed_tokens.weight", {kVocab, kHidden}, 1.0f, 0.0f);
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden}, 0.1f, 1.0f);
    add(p + "post_attention_layernorm.weight", {kHidden}, 0.1f, 1.0f);
    add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden}, in_scale, 0.0f);
    add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden}, in_scale, 0.0f);
    add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden}, in_scale, 0.0f);
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim}, in_scale, 0.0f);
    add(p + "mlp.gate_proj.weight", {kInter, kHidden}, in_scale, 0.0f);
    add(p + "mlp.up_proj.weight", {kInter, kHidden}, in_scale, 0.0f);
    add(p + "mlp.down_proj.weight", {kHidden, kInter}, 1.0f / std::sqrt(float{kInter}), 0.0f);
  }
  add("model.norm.weight", {kHidden}, 0.1f, 1.0f);
  add("lm_head.weight", {kVocab, kHidden}, in_scale, 0.0f);
  header += "}";
  std::string len(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(len.data(), &n, 8);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << len << header << data;
  return dir.string();
}

TEST(GpuFusedDecodeTest, LogitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::string dir = WriteModel();
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const std::vector<int32_t> prompt = {5, 77, 300, 12, 9, 411, 64, 3};
  const std::vector<int32_t> decode = {100, 7, 255, 42, 1, 500};
  std::vector<int32_t> table(4);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());
  // Prompt (last logits row), then one decode step per token.
  auto run = [&](auto&& exec) {
    std::vector<float> rows;
    SeqChunk prefill{prompt, 0, table, SeqChunk::Logits::kLast};
    auto l = exec(std::span(&prefill, 1));
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return rows;
    rows.insert(rows.end(), l->template as<float>(), l->template as<float>() + kVocab);
    int64_t pos = static_cast<int64_t>(prompt.size());
    for (size_t i = 0; i < decode.size(); ++i, ++pos) {
      SeqChunk step{std::span(&decode[i], 1), pos, table, SeqChunk::Logits::kLast};
      auto r = exec(std::span(&step, 1));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return rows;
      rows.insert(rows.end(), r->template as<float>(), r->template as<float>() + kVocab);
    }
    return rows;
  };
  RunnerOptions ro;
  ro.block_size = 16;
  ro.num_blocks = 4;
  ro.threads = 2;
  ModelRunner cpu(*lm->model, ro);
  const auto cpu_rows = run([&](auto c) { return cpu.Execute(c); });

  const auto* decoder = dynamic_cast<const layers::DecoderModel*>(lm->model.get());
  ASSERT_NE(decoder, nullptr);
  auto gpu_model = GpuDecoder::Upload(*decoder, DType::kBF16);
  ASSERT_TRUE(gpu_model.ok()) << gpu_model.status().ToString();
  GpuRunnerOptions go;
  go.num_blocks = 4;
  go.block_size = 16;
  go.max_seq_len = 64;
  go.max_num_tokens = 64;
  go.max_num_seqs = 2;
  auto gpu = GpuRunner::Create(std::move(*gpu_model), go);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const auto gpu_rows = run([&](auto c) { return (*gpu)->Execute(c); });
  const size_t rows = 1 + decode.size();
  ASSERT_EQ(cpu_rows.size(), rows * kVocab);
  ASSERT_EQ(gpu_rows.size(), rows * kVocab);
  EXPECT_GE((*gpu)->graphs_captured(), 1u);
  for (size_t r = 0; r < rows; ++r) {
    EXPECT_LE(RowRelError(&gpu_rows[r * kVocab], &cpu_rows[r * kVocab], kVocab), 3e-2)
        << "row " << r;
  }
  fs::remove_all(dir);
}

// A prompt of 80 tokens in two chunks (the second's prefill tiles read the first's keys from the
// cache), then decode steps, through GpuRunner with the given KV cache; all logits rows.
struct Fp8Run {
  DType kv_dtype = DType::kBF16;
  bool fp8_weights = false;
  float kv_scale = 1.0f;  // GpuRunnerOptions::kv_scale
};
std::vector<float> RunTwoChunksThenDecode(const layers::DecoderModel& decoder, const Fp8Run& o) {
  std::vector<int32_t> prompt(80);
  std::mt19937 rng(5);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
  const std::vector<int32_t> decode = {100, 7, 255, 42, 1, 500};
  std::vector<int32_t> table(8);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());
  std::vector<float> rows;
  auto model = GpuDecoder::Upload(decoder, DType::kBF16);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return rows;
  if (o.fp8_weights) {
    const Status q = (*model)->QuantizeWeightsFp8();
    EXPECT_TRUE(q.ok()) << q.ToString();
    if (!q.ok()) return rows;
  }
  GpuRunnerOptions go;
  go.num_blocks = 8;
  go.max_seq_len = 128;
  go.max_num_tokens = 128;
  go.max_num_seqs = 2;
  go.max_logits_rows = 64;
  go.kv_cache_dtype = o.kv_dtype;
  go.kv_scale = o.kv_scale;
  auto gpu = GpuRunner::Create(std::move(*model), go);
  EXPECT_TRUE(gpu.ok()) << gpu.status().ToString();
  if (!gpu.ok()) return rows;
  const std::span<const int32_t> all(prompt);
  const SeqChunk chunks[2] = {{all.first(48), 0, table, SeqChunk::Logits::kLast},
                              {all.subspan(48), 48, table, SeqChunk::Logits::kAll}};
  for (const SeqChunk& c : chunks) {
    auto l = (*gpu)->Execute(std::span(&c, 1));
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return rows;
    rows.insert(rows.end(), l->as<float>(), l->as<float>() + l->numel());
  }
  int64_t pos = static_cast<int64_t>(prompt.size());
  for (size_t i = 0; i < decode.size(); ++i, ++pos) {
    SeqChunk step{std::span(&decode[i], 1), pos, table, SeqChunk::Logits::kLast};
    auto r = (*gpu)->Execute(std::span(&step, 1));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return rows;
    rows.insert(rows.end(), r->as<float>(), r->as<float>() + kVocab);
  }
  return rows;
}
constexpr size_t kTwoChunkRows = 1 + (80 - 48) + 6;

// The FP8 KV cache, then also FP8 weights (per-channel scales, FP8 GEMMs), against bf16; e4m3
// keeps about 2 significant digits of each element, so logits move by a few percent, not more.
TEST(GpuFusedDecodeTest, Fp8KvCacheAndWeightsStayCloseToBf16) {
  SKIP_WITHOUT_GPU();
  const std::string dir = WriteModel();
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const auto* decoder = dynamic_cast<const layers::DecoderModel*>(lm->model.get());
  ASSERT_NE(decoder, nullptr);
  const auto bf16_rows = RunTwoChunksThenDecode(*decoder, {});
  const size_t rows = kTwoChunkRows;
  ASSERT_EQ(bf16_rows.size(), rows * kVocab);
  for (bool fp8_weights : {false, true}) {
    const auto fp8_rows = RunTwoChunksThenDecode(*decoder, {DType::kF8E4M3, fp8_weights});
    ASSERT_EQ(fp8_rows.size(), rows * kVocab);
    double worst = 0;
    for (size_t r = 0; r < rows; ++r) {
      const double e = RowRelError(&fp8_rows[r * kVocab], &bf16_rows[r * kVocab], kVocab);
      worst = std::max(worst, e);
      EXPECT_LE(e, fp8_weights ? 0.15 : 0.1) << "row " << r << (fp8_weights ? " fp8 weights" : "");
    }
    std::printf("FP8 KV cache%s: worst row error %.3g against bf16\n",
                fp8_weights ? " and FP8 weights" : "", worst);
  }
  fs::remove_all(dir);
}

// Calibrated KV-cache scales in the checkpoint (vLLM's self_attn.k_scale / v_scale, here the
// same in every layer) reach the cache writes and the attention of every step: the same bits as
// no scales in the checkpoint and that value as the runner's --kv-cache-scale. 3 is not a power
// of two, so it changes which e4m3 values the cache holds, and the runner's default of 1 gives
// other logits.
TEST(GpuFusedDecodeTest, CheckpointKvScalesAreUsed) {
  SKIP_WITHOUT_GPU();
  constexpr float kScale = 3.0f;
  const std::string dir = WriteModel();
  std::vector<float> plain_rows, scaled_rows, checkpoint_rows;
  {
    auto lm = LoadModel(dir, LoadOptions{false, false});
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    const auto* decoder = dynamic_cast<const layers::DecoderModel*>(lm->model.get());
    ASSERT_NE(decoder, nullptr);
    plain_rows = RunTwoChunksThenDecode(*decoder, {DType::kF8E4M3, false, 1.0f});
    scaled_rows = RunTwoChunksThenDecode(*decoder, {DType::kF8E4M3, false, kScale});
  }
  {  // A second file of the checkpoint: a 0-d f32 k_scale and v_scale for every layer.
    std::string header = "{", data;
    for (int64_t l = 0; l < kLayers; ++l) {
      for (const char* which : {"k_scale", "v_scale"}) {
        if (header.size() > 1) header += ",";
        header += "\"model.layers." + std::to_string(l) + ".self_attn." + which +
                  "\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[" +
                  std::to_string(data.size()) + "," + std::to_string(data.size() + 4) + "]}";
        data.append(reinterpret_cast<const char*>(&kScale), 4);
      }
    }
    header += "}";
    std::string len(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(len.data(), &n, 8);
    std::ofstream(fs::path(dir) / "kv_scales.safetensors", std::ios::binary)
        << len << header << data;
  }
  {
    auto lm = LoadModel(dir, LoadOptions{false, false});
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    const auto* decoder = dynamic_cast<const layers::DecoderModel*>(lm->model.get());
    ASSERT_NE(decoder, nullptr);
    checkpoint_rows = RunTwoChunksThenDecode(*decoder, {DType::kF8E4M3, false, 1.0f});
  }
  const size_t n = kTwoChunkRows * kVocab;
  ASSERT_EQ(plain_rows.size(), n);
  ASSERT_EQ(scaled_rows.size(), n);
  ASSERT_EQ(checkpoint_rows.size(), n);
  EXPECT_NE(std::memcmp(plain_rows.data(), scaled_rows.data(), n * sizeof(float)), 0)
      << "a KV-cache scale of " << kScale << " changed no logit";
  EXPECT_EQ(std::memcmp(checkpoint_rows.data(), scaled_rows.data(), n * sizeof(float)), 0)
      << "the checkpoint's scales and --kv-cache-scale " << kScale << " differ";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dinfer
