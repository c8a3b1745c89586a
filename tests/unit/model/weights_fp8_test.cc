// WeightSource::GetLinear on DeepSeek-style FP8 / FP4 weights: repacked value for value, and clear
// errors for missing or malformed scales.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cpu/quant.h"
#include "model/weights.h"
#include "unit/model/test_checkpoint.h"

namespace dinfer {
namespace {

namespace fs = std::filesystem;
using test_checkpoint::Bytes;
using test_checkpoint::F32;
using test_checkpoint::Open;
using test_checkpoint::WriteCheckpoint;

TEST(WeightsFp8, RepacksFp8WithItsBlockScales) {
  // [4, 64] with blocks of 2 x 32: a 2 x 2 grid of UE8M0 scales 2^-1, 2^0, 2^1, 2^2.
  const std::string w = Bytes(4 * 64, 3);
  const std::string dir = WriteCheckpoint(
      {{"a.weight", "F8_E4M3", {4, 64}, w}, {"a.scale", "F8_E8M0", {2, 2}, "\x7e\x7f\x80\x81"}});
  auto src = Open(dir);
  auto v = src->GetLinear("a.weight", 4, 64, 2, 32);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->dtype, DType::kF8E4M3B32);
  std::vector<float> row(64);
  for (int64_t r = 0; r < 4; ++r) {
    kernels::cpu::DequantizeRow(v->dtype, v->row_ptr(r), row.data(), 64);
    for (int64_t i = 0; i < 64; ++i) {
      const float scale = std::ldexp(1.0f, static_cast<int>((r / 2) * 2 + i / 32) - 1);
      ASSERT_EQ(row[i], kernels::cpu::E4M3ToF32(static_cast<uint8_t>(w[r * 64 + i])) * scale);
    }
  }
  fs::remove_all(dir);
}

TEST(WeightsFp8, ErrorsNameTheProblem) {
  const std::string dir = WriteCheckpoint({
      {"noscale.weight", "F8_E4M3", {2, 32}, Bytes(64, 1)},
      {"grid.weight", "F8_E4M3", {2, 32}, Bytes(64, 1)},
      {"grid.scale", "F8_E8M0", {2, 2}, "\x7f\x7f\x7f\x7f"},
      {"fp4.weight", "I8", {2, 16}, Bytes(32, 5)},
      {"fp4.scale", "F32", {2, 1}, F32({0.3f, 1.0f})},
  });
  auto src = Open(dir);
  auto missing = src->GetLinear("noscale.weight", 2, 32);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("noscale.scale"), std::string::npos);
  auto grid = src->GetLinear("grid.weight", 2, 32);  // 128-blocks: a 1 x 1 grid expected
  ASSERT_FALSE(grid.ok());
  EXPECT_NE(grid.status().message().find("grid.scale"), std::string::npos);
  auto fp4 = src->GetLinear("fp4.weight", 2, 32);
  ASSERT_FALSE(fp4.ok());
  EXPECT_NE(fp4.status().message().find("powers of two"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dinfer
