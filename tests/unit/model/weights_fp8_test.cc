// WeightSource::GetLinear on DeepSeek-style FP8 / FP4 weights: repacked value for value, and clear
// errors for missing or malformed scales.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/quant.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dinfer {
namespace {

namespace fs = std::filesystem;

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// One safetensors file holding the entries, in a fresh directory.
std::string WriteCheckpoint(const std::vector<Entry>& entries) {
  static int counter = 0;
  const fs::path dir =
      fs::temp_directory_path() /
      ("dinfer_fp8_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  std::string header = "{", data;
  for (const Entry& e : entries) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + e.bytes.size()) + "]}";
    data += e.bytes;
  }
  header += "}";
  std::string file(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(file.data(), &len, 8);
  std::ofstream((dir / "model.safetensors").string(), std::ios::binary) << file << header << data;
  return dir.string();
}

std::unique_ptr<WeightSource> Open(const std::string& dir) {
  auto ckpt = SafetensorsCheckpoint::OpenDir(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  return WeightSource::FromSafetensors(std::move(ckpt).value(), dir);
}

std::string Bytes(size_t n, uint8_t first) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((first + 7 * i) % 0x7f);
  return s;
}

std::string F32(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

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
