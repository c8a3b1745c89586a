// Calibrated FP8 KV-cache scales read from a checkpoint (layers::ReadKvCacheScales): the names
// vLLM and llm-compressor write, one value or one per KV head, and clear errors for bad values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "model/layers/attention.h"
#include "unit/model/test_checkpoint.h"

namespace dinfer {
namespace {

using test_checkpoint::F32;
using test_checkpoint::Open;
using test_checkpoint::WriteCheckpoint;

std::string Bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint16_t b = static_cast<uint16_t>(bits >> 16);  // exact for the values used here
  return std::string(reinterpret_cast<const char*>(&b), 2);
}

TEST(KvCacheScales, ReadsEveryNamingAndPerHeadScales) {
  const std::string dir = WriteCheckpoint({
      // Layer 0: vLLM's k_scale / v_scale, 0-d and [1].
      {"model.layers.0.self_attn.k_scale", "F32", {}, F32({0.5f})},
      {"model.layers.0.self_attn.v_scale", "F32", {1}, F32({0.25f})},
      // Layer 1: one kv_scale for both, bf16.
      {"model.layers.1.self_attn.kv_scale", "BF16", {}, Bf16(2.0f)},
      // Layer 2: llm-compressor's output scales, one per KV head: the largest is kept.
      {"model.layers.2.self_attn.k_proj.output_scale", "F32", {2}, F32({0.125f, 0.375f})},
      {"model.layers.2.self_attn.v_proj.output_scale", "F32", {2}, F32({1.5f, 0.75f})},
  });
  auto src = Open(dir);
  const float want[4][2] = {{0.5f, 0.25f}, {2.0f, 2.0f}, {0.375f, 1.5f}, {0.0f, 0.0f}};
  for (int layer = 0; layer < 4; ++layer) {
    SCOPED_TRACE(layer);
    layers::AttentionWeights w;
    ASSERT_TRUE(layers::ReadKvCacheScales(
                    *src, "model.layers." + std::to_string(layer) + ".self_attn.", 2, w)
                    .ok());
    if (layer == 3) {  // no scales in the checkpoint
      EXPECT_FALSE(w.k_scale.has_value());
      EXPECT_FALSE(w.v_scale.has_value());
      continue;
    }
    ASSERT_TRUE(w.k_scale.has_value());
    ASSERT_TRUE(w.v_scale.has_value());
    EXPECT_EQ(*w.k_scale, want[layer][0]);
    EXPECT_EQ(*w.v_scale, want[layer][1]);
  }
  std::filesystem::remove_all(dir);
}

TEST(KvCacheScales, BadScalesAreErrorsThatNameTheTensor) {
  const std::string dir = WriteCheckpoint({
      {"model.layers.0.self_attn.k_scale", "F32", {}, F32({0.0f})},
      {"model.layers.1.self_attn.v_scale", "F32", {}, F32({-1.0f})},
      {"model.layers.2.self_attn.k_scale",
       "F32",
       {},
       F32({std::numeric_limits<float>::infinity()})},
      {"model.layers.3.self_attn.k_scale", "F32", {3}, F32({1.0f, 1.0f, 1.0f})},
  });
  auto src = Open(dir);
  const char* names[] = {"layers.0.self_attn.k_scale", "layers.1.self_attn.v_scale",
                         "layers.2.self_attn.k_scale", "layers.3.self_attn.k_scale"};
  for (int layer = 0; layer < 4; ++layer) {
    SCOPED_TRACE(layer);
    layers::AttentionWeights w;
    const Status st = layers::ReadKvCacheScales(
        *src, "model.layers." + std::to_string(layer) + ".self_attn.", 2, w);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(names[layer]), std::string::npos) << st.message();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dinfer
