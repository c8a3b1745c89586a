// Tiny safetensors checkpoints written by tests: one file of the given entries in a fresh
// directory, opened as a WeightSource.
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/safetensors.h"
#include "model/weights.h"

namespace dinfer::test_checkpoint {

namespace fs = std::filesystem;

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// One safetensors file holding the entries, in a fresh directory.
inline std::string WriteCheckpoint(const std::vector<Entry>& entries) {
  static int counter = 0;
  const fs::path dir =
      fs::temp_directory_path() /
      ("dinfer_checkpoint_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
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

inline std::unique_ptr<WeightSource> Open(const std::string& dir) {
  auto ckpt = SafetensorsCheckpoint::OpenDir(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  return WeightSource::FromSafetensors(std::move(ckpt).value(), dir);
}

inline std::string Bytes(size_t n, uint8_t first) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((first + 7 * i) % 0x7f);
  return s;
}

inline std::string F32(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace dinfer::test_checkpoint
