// Matrix products of activations with weights, y[m, n] = x[m, k] · w[n, k]ᵀ (the layout of
// kernels/cpu MatmulParams): cuBLASLt for most shapes, and a bf16 GEMV kernel of our own for a
// few rows (decode), which reads the weights once at close to memory bandwidth.
// GemmRunner owns a cuBLASLt handle, its workspace and the algorithms chosen per shape.
// Thread-safety: one thread uses a GemmRunner at a time (one per stream).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

struct GemmParams {
  const void* x = nullptr;  // [m, ldx] of in_dtype
  const void* w = nullptr;  // [n, ldw] of in_dtype
  void* y = nullptr;        // [m, ldy] of out_dtype
  int64_t ldx = 0, ldw = 0, ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  DType in_dtype = DType::kBF16;   // f32 (full f32 arithmetic, no TF32) or bf16
  DType out_dtype = DType::kBF16;  // f32 or bf16
};

enum class GemmImpl { kAuto, kCublasLt, kGemv };

// The GEMV kernel on its own: bf16 x and w, m <= kGemvMaxRows, k a multiple of 8.
inline constexpr int64_t kGemvMaxRows = 8;
// GemmImpl::kAuto takes the GEMV for up to this many rows; beyond, cuBLASLt reads the weights as
// fast and the activations' reuse favours its tiles (measured on H200, bench/gpu).
inline constexpr int64_t kGemvAutoMaxRows = 2;
bool GemvSupports(const GemmParams& p);
// Columns per group of warps, 16-byte loads in flight per lane and column, and warps splitting k.
// cols == 0 (the default): chosen by shape, {2, 4, 4} up to 8192 columns, else {2, 4, 1}. For
// m == 1 these and {2, 4, 2}, {1, 8, 4} can be asked for (bench/gpu measures them).
struct GemvTiling {
  int cols = 0, unroll = 4, split = 4;
};
int Gemv(const GemmParams& p, void* stream, GemvTiling tiling = {});

class GemmRunner {
 public:
  static StatusOr<std::unique_ptr<GemmRunner>> Create(size_t workspace_bytes = 32u << 20);
  ~GemmRunner();

  Status Run(const GemmParams& p, void* stream, GemmImpl impl = GemmImpl::kAuto);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;
  GemmRunner() = default;
  StatusOr<const Plan*> PlanFor(const GemmParams& p);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace dinfer::kernels::cuda
