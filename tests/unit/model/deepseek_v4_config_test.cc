// DeepSeek-V4's config.json as DeepSeek publishes it (V4-Flash) and as transformers saves it, the
// KV planes of each layer kind, and the KV bytes per token they add up to.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/config.h"
#include "model/layers/compressed_attention.h"
#include "model/model.h"

namespace dinfer {
namespace {

// DeepSeek-V4-Flash's config.json (the keys the model reads).
constexpr const char* kFlashConfig = R"json({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
  "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
  "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
  "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
  "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "num_hash_layers": 3,
  "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "rope_theta": 10000,
  "compress_rope_theta": 160000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "sliding_window": 128,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 0],
  "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
  "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_nextn_predict_layers": 1,
  "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4",
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
})json";

TEST(DeepseekV4Config, ParsesFlash) {
  auto c = ParseHfConfig(kFlashConfig, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->deepseek_v4.has_value());
  const DeepseekV4Config& v = *c->deepseek_v4;
  EXPECT_EQ(c->arch, "deepseek_v4");
  EXPECT_EQ(c->num_layers, 43);
  EXPECT_EQ(c->head_dim, 512);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_EQ(c->intermediate_size, 2048);
  EXPECT_EQ(c->sliding_window, 128);
  ASSERT_EQ(v.layer_attention.size(), 44u);  // 43 layers and the MTP layer
  EXPECT_EQ(v.layer_attention[0], V4Attention::kSliding);
  EXPECT_EQ(v.layer_attention[1], V4Attention::kSliding);
  EXPECT_EQ(v.layer_attention[2], V4Attention::kCompressedSparse);
  EXPECT_EQ(v.layer_attention[3], V4Attention::kHeavilyCompressed);
  EXPECT_EQ(v.layer_attention[42], V4Attention::kCompressedSparse);
  EXPECT_EQ(v.layer_attention[43], V4Attention::kSliding);
  EXPECT_EQ(v.csa_rate, 4);
  EXPECT_EQ(v.hca_rate, 128);
  EXPECT_EQ(std::count(v.layer_hash_moe.begin(), v.layer_hash_moe.end(), true), 3);
  EXPECT_TRUE(v.layer_hash_moe[2]);
  EXPECT_FALSE(v.layer_hash_moe[3]);
  EXPECT_EQ(v.compress_rope.type, RopeScalingType::kYarn);
  EXPECT_EQ(v.compress_rope.factor, 16.0);
  EXPECT_EQ(v.compress_rope.original_max_position, 65536);
  EXPECT_EQ(v.compress_rope_theta, 160000.0);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(v.num_experts, 256);
  EXPECT_EQ(v.experts_per_token, 6);
  EXPECT_EQ(v.routed_scaling, 1.5);
  EXPECT_EQ(v.swiglu_limit, 10.0);
  EXPECT_EQ(v.index_topk, 512);
  EXPECT_EQ(v.hc_mult, 4);
  EXPECT_EQ(v.num_mtp_layers, 1);
  EXPECT_EQ(v.fp8_block_rows, 128);
  // Only the sliding-window layers stop needing blocks that leave the window.
  EXPECT_TRUE(c->layer_sliding[0]);
  EXPECT_FALSE(c->layer_sliding[2]);
}

// transformers' own keys (a config saved by DeepseekV4Config).
TEST(DeepseekV4Config, ParsesTransformersKeys) {
  constexpr const char* kSaved = R"json({
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 256, "hidden_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
    "q_lora_rank": 96, "o_lora_rank": 16, "o_groups": 2, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "sliding_window": 16,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    "mlp_layer_types": ["hash_moe", "moe", "moe"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.25},
                        "compress": {"rope_type": "yarn", "rope_theta": 160000, "factor": 4,
                                     "original_max_position_embeddings": 30000, "beta_fast": 32,
                                     "beta_slow": 1, "partial_rotary_factor": 0.25}},
    "index_n_heads": 8, "index_head_dim": 16, "index_topk": 5, "hc_mult": 4,
    "hc_sinkhorn_iters": 20
  })json";
  auto c = ParseHfConfig(kSaved, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const DeepseekV4Config& v = *c->deepseek_v4;
  EXPECT_EQ(c->rotary_dim, 8);
  EXPECT_EQ(v.layer_attention[1], V4Attention::kCompressedSparse);
  EXPECT_EQ(v.layer_attention[2], V4Attention::kHeavilyCompressed);
  EXPECT_EQ(v.hca_rate, 8);
  EXPECT_TRUE(v.layer_hash_moe[0]);
  EXPECT_FALSE(v.layer_hash_moe[1]);
  EXPECT_EQ(v.compress_rope.type, RopeScalingType::kYarn);
  EXPECT_EQ(v.compress_rope.original_max_position, 30000);
}

TEST(DeepseekV4Config, RejectsWhatItCannotRun) {
  std::string text = kFlashConfig;
  const auto ratios = text.find("[0, 0, 4, 128");
  ASSERT_NE(ratios, std::string::npos);
  text.replace(ratios, 13, "[0, 0, 4, 64");  // a compress ratio that names no layer kind
  auto c = ParseHfConfig(text, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("compress ratio 64"), std::string::npos);
  std::string heads = kFlashConfig;
  heads.replace(heads.find("\"num_key_value_heads\": 1"), 24, "\"num_key_value_heads\": 2");
  EXPECT_FALSE(ParseHfConfig(heads, "config.json").ok());
}

// Bytes per token of dinfer's KV planes for V4-Flash with blocks of 16 tokens: every token keeps
// its window key (512 dims) in every layer; compressed layers add the per-block compressor state
// (f32) and the compressed entries (docs/architecture.md works these out). Keys and entries are
// bf16 by default, f32 with kv_dtype f32.
TEST(DeepseekV4Config, FlashKvBytesPerToken) {
  auto c = ParseHfConfig(kFlashConfig, "config.json");
  ASSERT_TRUE(c.ok());
  const int64_t block = 16;
  auto per_token = [&](V4Attention kind, DType kv_dtype) {
    return KvStorage::BytesPerBlock({layers::DeepseekV4LayerPlanes(*c, kind, block, kv_dtype)}) /
           block;
  };
  auto total = [&](DType kv_dtype) {
    KvLayout layout;
    for (V4Attention kind : c->deepseek_v4->layer_attention) {
      layout.push_back(layers::DeepseekV4LayerPlanes(*c, kind, block, kv_dtype));
    }
    return KvStorage::BytesPerBlock(layout) / block;
  };
  EXPECT_EQ(per_token(V4Attention::kSliding, DType::kF32), 2048);
  EXPECT_EQ(per_token(V4Attention::kHeavilyCompressed, DType::kF32), 2048 + 384 + 128);
  EXPECT_EQ(per_token(V4Attention::kCompressedSparse, DType::kF32), 2048 + 768 + 512 + 192 + 128);
  EXPECT_EQ(total(DType::kF32), 133952);
  EXPECT_EQ(per_token(V4Attention::kSliding, DType::kBF16), 1024);
  EXPECT_EQ(per_token(V4Attention::kHeavilyCompressed, DType::kBF16), 1024 + 384 + 64);
  EXPECT_EQ(per_token(V4Attention::kCompressedSparse, DType::kBF16), 1024 + 768 + 256 + 192 + 64);
  EXPECT_EQ(total(DType::kBF16), 80896);
}

// The same planes in their KV groups: the window group (window keys and compressor states of every
// layer) is released behind the 128-token window, so only the compressed groups grow with the
// context: 6,880 B/token with bf16 entries (13,760 B/token in f32), against 3,509 B/token for
// DeepSeek's FP8 / FP4 layout of the same entries (docs/architecture.md).
TEST(DeepseekV4Config, FlashKvBytesPerTokenByGroup) {
  auto c = ParseHfConfig(kFlashConfig, "config.json");
  ASSERT_TRUE(c.ok());
  const int64_t block = 16;
  const std::vector<KvGroup> groups = layers::DeepseekV4KvGroups(*c, block);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].name, "window");
  EXPECT_EQ(groups[0].sliding_window, 128);
  EXPECT_EQ(groups[1].name, "compressed/4");
  EXPECT_EQ(groups[1].block_size, 16);
  EXPECT_EQ(groups[2].name, "compressed/128");
  EXPECT_EQ(groups[2].block_size, 128);
  auto group_bytes = [&](DType kv_dtype) {
    KvLayout layout;
    for (V4Attention kind : c->deepseek_v4->layer_attention) {
      layout.push_back(layers::DeepseekV4LayerPlanes(*c, kind, block, kv_dtype));
    }
    return KvStorage::GroupBytesPerBlock(layout, 3);
  };
  const std::vector<int64_t> f32 = group_bytes(DType::kF32);
  EXPECT_EQ(f32[0] / groups[0].block_size, 117952);
  EXPECT_EQ(f32[1] / groups[1].block_size, 13440);
  EXPECT_EQ(f32[2] / groups[2].block_size, 320);
  // A sequence keeps at most 128 / 16 + 1 window blocks however long it grows.
  EXPECT_EQ(f32[0] * (128 / block + 1), 16985088);
  const std::vector<int64_t> bf16 = group_bytes(DType::kBF16);
  EXPECT_EQ(bf16[0] / groups[0].block_size, 72896);
  EXPECT_EQ(bf16[1] / groups[1].block_size, 6720);
  EXPECT_EQ(bf16[2] / groups[2].block_size, 160);
  EXPECT_EQ(bf16[0] * (128 / block + 1), 10497024);
  // --kv-cache-dtype fp8 (CPU): keys, entries and indexer keys as e4m3 rows with a scale byte per
  // 32 (512 dims: 576 B; 128: 144 B). What grows with the context: 21 sparse layers x (576 + 144)
  // / 4 + 20 heavy layers x 576 / 128 = 3,870 B/token, 1.1 x DeepSeek's FP8 / FP4 layout (3,509).
  KvLayout layout;
  for (V4Attention kind : c->deepseek_v4->layer_attention) {
    layout.push_back(layers::DeepseekV4LayerPlanes(*c, kind, block, DType::kBF16));
  }
  auto fp8_layout = ApplyKvCacheDType(layout, KvCacheDType::kFp8, "deepseek_v4");
  ASSERT_TRUE(fp8_layout.ok()) << fp8_layout.status().ToString();
  const std::vector<int64_t> fp8 = KvStorage::GroupBytesPerBlock(*fp8_layout, 3);
  EXPECT_EQ(fp8[1] / groups[1].block_size, 21 * (576 + 144) / 4);
  EXPECT_EQ(fp8[2] / groups[2].block_size, 20 * 576 / 128);
  EXPECT_EQ(fp8[1] / groups[1].block_size + fp8[2] / groups[2].block_size, 3870);
  EXPECT_EQ(fp8[0] / groups[0].block_size,
            bf16[0] / groups[0].block_size - static_cast<int64_t>(layout.size()) * (1024 - 576));
}

// The model's default layout is the bf16 one; kv_cache_dtype f32 widens every plane, bf16 is
// refused for a layout that has no bf16 plane (dense layers on the CPU).
TEST(DeepseekV4Config, KvCacheDType) {
  auto c = ParseHfConfig(kFlashConfig, "config.json");
  ASSERT_TRUE(c.ok());
  const KvLayout layout = {layers::DeepseekV4LayerPlanes(*c, V4Attention::kCompressedSparse, 16)};
  EXPECT_EQ(layout[0][0].dtype, DType::kBF16);
  EXPECT_EQ(layout[0][1].dtype, DType::kF32);  // compressor state
  auto f32 = ApplyKvCacheDType(layout, KvCacheDType::kF32, "deepseek_v4");
  ASSERT_TRUE(f32.ok());
  for (const KvPlane& p : (*f32)[0]) EXPECT_EQ(p.dtype, DType::kF32);
  auto bf16 = ApplyKvCacheDType(layout, KvCacheDType::kBF16, "deepseek_v4");
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ((*bf16)[0][0].dtype, DType::kBF16);
  EXPECT_FALSE(ApplyKvCacheDType(*f32, KvCacheDType::kBF16, "llama").ok());
  // fp8: the bf16 planes become e4m3 rows; the f32 states stay; dense models need CUDA for it.
  auto fp8 = ApplyKvCacheDType(layout, KvCacheDType::kFp8, "deepseek_v4");
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ((*fp8)[0][0].dtype, DType::kF8E4M3B32);
  EXPECT_EQ((*fp8)[0][1].dtype, DType::kF32);
  EXPECT_EQ((*fp8)[0][4].dtype, DType::kF8E4M3B32);  // indexer keys
  EXPECT_FALSE(ApplyKvCacheDType(layout, KvCacheDType::kFp8, "llama").ok());
  EXPECT_TRUE(ParseKvCacheDType("auto").ok());
  EXPECT_FALSE(ParseKvCacheDType("f16").ok());
}

}  // namespace
}  // namespace dinfer
