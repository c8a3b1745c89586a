#include "tensor/dtype.h"

namespace dinfer {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  int64_t block_size;
  int64_t block_bytes;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kF32, "f32", 1, 4},        {DType::kF16, "f16", 1, 2},
    {DType::kBF16, "bf16", 1, 2},      {DType::kI32, "i32", 1, 4},
    {DType::kI64, "i64", 1, 8},        {DType::kQ8_0, "q8_0", 32, 34},
    {DType::kQ4_0, "q4_0", 32, 18},    {DType::kQ4_1, "q4_1", 32, 20},
    {DType::kQ4_K, "q4_k", 256, 144},  {DType::kQ6_K, "q6_k", 256, 210},
    {DType::kI8, "i8", 1, 1},          {DType::kF8E4M3, "f8_e4m3", 1, 1},
    {DType::kF8E8M0, "f8_e8m0", 1, 1}, {DType::kF8E4M3B32, "f8_e4m3_b32", 32, 36},
    {DType::kMxfp4, "mxfp4", 32, 17},
};

const DTypeInfo& Info(DType t) { return kInfo[static_cast<int>(t)]; }

}  // namespace

std::string_view DTypeName(DType t) { return Info(t).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kInfo) {
    if (info.name == name) return info.type;
  }
  return std::nullopt;
}

int64_t BlockSize(DType t) { return Info(t).block_size; }
int64_t BlockBytes(DType t) { return Info(t).block_bytes; }
bool IsQuantized(DType t) { return Info(t).block_size > 1; }

}  // namespace dinfer
