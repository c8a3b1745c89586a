#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu {
namespace {

using internal::KernelSet;
using internal::Tile;

const KernelSet& ActiveKernels() {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return internal::Avx512Kernels(UseAvx512Vnni());
    case Isa::kAvx2:
      return internal::Avx2Kernels();
    case Isa::kScalar:
      break;
  }
  return internal::ScalarKernels();
}

// Per-thread scratch for quantized activations, grown on demand, 64-byte aligned.
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  uint8_t* Get(int64_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 4095) / 4096 * 4096;
      data_ = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(size_)));
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Below this many multiply-adds a call runs on the calling thread only.
constexpr int64_t kMinParallelWork = 1 << 16;
// Up to this many activation rows (decode) the weights are streamed once, split by rows only.
constexpr int64_t kDecodeRows = 8;
// Larger calls (prefill) are cut into tiles of up to kTileRows activation rows x about
// kTileWeightBytes of weight rows: the tile's weights stay in L2 while its activation rows pass
// over them four at a time.
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileWeightBytes = 256 << 10;

// Runs the tile function over the m x n outputs, split into tiles, on the pool if it has more
// than one thread. Consecutive tiles share weight rows (row tiles vary fastest).
template <typename Fn>
void RunTiles(const Fn& fn, const Tile& whole, ThreadPool* pool) {
  const int64_t m = whole.rows, n = whole.cols;
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const bool parallel = threads > 1 && m * n * whole.k >= kMinParallelWork;
  const int64_t row_block = m <= kDecodeRows ? m : std::min(m, kTileRows);
  const int64_t row_tasks = CeilDiv(m, row_block);
  int64_t col_block = n;
  if (m > kDecodeRows) {
    col_block =
        std::max<int64_t>(16, kTileWeightBytes / std::max<int64_t>(1, whole.w_stride) / 16 * 16);
  }
  if (parallel) {
    // About 4 tasks per thread, in multiples of 16 weight rows: handed out dynamically, so a
    // thread that gets descheduled delays the call by one small task only.
    const int64_t want_col_tasks = CeilDiv(4 * threads, row_tasks);
    col_block = std::min(
        col_block, std::clamp<int64_t>(CeilDiv(CeilDiv(n, want_col_tasks), 16) * 16, 16, 512));
  }
  col_block = std::min(col_block, n);
  const int64_t col_tasks = CeilDiv(n, col_block);
  const auto run = [&](int64_t task) {
    const int64_t r0 = task % row_tasks * row_block, c0 = task / row_tasks * col_block;
    Tile t = whole;
    t.x = whole.x + r0 * whole.x_stride;
    t.w = whole.w + c0 * whole.w_stride;
    t.y = whole.y + r0 * whole.y_stride + c0;
    t.rows = std::min(row_block, m - r0);
    t.cols = std::min(col_block, n - c0);
    fn(t);
  };
  const int64_t tasks = row_tasks * col_tasks;
  if (!parallel || tasks == 1) {
    for (int64_t task = 0; task < tasks; ++task) run(task);
    return;
  }
  pool->ParallelFor(tasks, [&](int, int64_t task) { run(task); });
}

bool ValidShape(const MatmulParams& p) {
  return MatmulSupports(p.w_dtype) && p.k >= 0 && p.k % BlockSize(p.w_dtype) == 0 && p.m > 0 &&
         p.n > 0;
}

double F16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Exact integer block dots on quantized activations, combined in double.
double QuantizedDot(DType type, const uint8_t* w, const ActRow& a, int64_t k) {
  double acc = 0.0;
  switch (type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const ActFormat format = ActFormatFor(type);
      const int64_t bytes = BlockBytes(type);
      for (int64_t b = 0; b < k / kQK; ++b) {
        const uint8_t* blk = w + b * bytes;
        int64_t sum = 0;
        for (int l = 0; l < kQK; ++l) {
          int wq;
          if (type == DType::kQ8_0) {
            wq = reinterpret_cast<const int8_t*>(blk + 2)[l];
          } else {
            const uint8_t* qs = blk + (type == DType::kQ4_1 ? 4 : 2);
            wq = l < 16 ? qs[l] & 0xf : qs[l - 16] >> 4;
            if (type == DType::kQ4_0) wq -= 8;
          }
          sum += wq * a.qs[ActQsOffset(format, b * kQK + l)];
        }
        acc += F16(blk) * a.d[b] * static_cast<double>(sum);
        if (type == DType::kQ4_1) acc += F16(blk + 2) * a.s[b];
      }
      return acc;
    }
    case DType::kQ4_K:
      for (int64_t i = 0; i < k / kQKK; ++i) {
        const auto& blk = reinterpret_cast<const BlockQ4_K*>(w)[i];
        uint8_t sc[8], mn[8];
        UnpackQ4KScales(blk.scales, sc, mn);
        int64_t sum = 0, msum = 0;
        for (int j = 0; j < 8; ++j) {
          int64_t s = 0;
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = blk.qs[32 * (j / 2) + l];
            s += ((j % 2 == 0) ? byte & 0xf : byte >> 4) * a.qs[i * kQKK + 32 * j + l];
          }
          sum += sc[j] * s;
          msum += mn[j] * (a.bsums[i * 16 + 2 * j] + a.bsums[i * 16 + 2 * j + 1]);
        }
        acc +=
            a.d[i] * (F16(reinterpret_cast<const uint8_t*>(&blk.d)) * static_cast<double>(sum) -
                      F16(reinterpret_cast<const uint8_t*>(&blk.dmin)) * static_cast<double>(msum));
      }
      return acc;
    case DType::kQ6_K:
      for (int64_t i = 0; i < k / kQKK; ++i) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(w)[i];
        int64_t sum = 0;
        for (int e = 0; e < kQKK; ++e) {
          const int h = e / 128, g = (e % 128) / 32, l = e % 32;
          const int lo = (blk.ql[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf;
          const int hi = (blk.qh[32 * h + l] >> (2 * g)) & 3;
          sum += blk.scales[e / 16] * ((lo | (hi << 4)) - 32) * a.qs[i * kQKK + e];
        }
        acc += a.d[i] * F16(reinterpret_cast<const uint8_t*>(&blk.d)) * static_cast<double>(sum);
      }
      return acc;
    default:
      return 0.0;
  }
}

struct Resolved {
  const uint8_t* w;
  int64_t w_stride, x_stride, y_stride;
};

// Zero strides mean packed rows.
Resolved Resolve(const MatmulParams& p) {
  return {static_cast<const uint8_t*>(p.w),
          p.w_row_bytes > 0 ? p.w_row_bytes : RowBytes(p.w_dtype, p.k),
          p.x_stride > 0 ? p.x_stride : p.k, p.y_stride > 0 ? p.y_stride : p.n};
}

void ZeroOutputs(const MatmulParams& p, const Resolved& s) {
  if (p.accumulate) return;
  for (int64_t r = 0; r < p.m; ++r) std::fill_n(p.y + r * s.y_stride, p.n, 0.0f);
}

void Store(const MatmulParams& p, const Resolved& s, int64_t r, int64_t j, double v) {
  float& out = p.y[r * s.y_stride + j];
  out = static_cast<float>(p.accumulate ? out + v : v);
}

// f32 activations with quantized weights: each tile dequantizes its weight rows, a few at a
// time so they stay in L1/L2, and runs the f32 kernel over them.
void RunDequantizedTiles(const MatmulParams& p, const Tile& whole, const KernelSet& kernels) {
  constexpr int64_t kRowsPerChunk = 16;
  const internal::TileFn f32_tile = kernels.tile[static_cast<int>(DType::kF32)];
  const DType type = p.w_dtype;
  const auto fn = [&](const Tile& t) {
    static thread_local Scratch scratch;
    auto* w = reinterpret_cast<float*>(scratch.Get(kRowsPerChunk * t.k * 4));
    for (int64_t c0 = 0; c0 < t.cols; c0 += kRowsPerChunk) {
      const int64_t nc = std::min(kRowsPerChunk, t.cols - c0);
      for (int64_t j = 0; j < nc; ++j)
        DequantizeRow(type, t.w + (c0 + j) * t.w_stride, w + j * t.k, t.k);
      Tile sub = t;
      sub.w = reinterpret_cast<const uint8_t*>(w);
      sub.w_stride = t.k * 4;
      sub.y = t.y + c0;
      sub.cols = nc;
      f32_tile(sub);
    }
  };
  RunTiles(fn, whole, p.pool);
}

}  // namespace

bool MatmulSupports(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void Matmul(const MatmulParams& p) {
  if (!ValidShape(p)) return;
  const Resolved s = Resolve(p);
  if (p.k == 0) {
    ZeroOutputs(p, s);
    return;
  }
  const KernelSet& kernels = ActiveKernels();
  Tile t;
  t.w = s.w;
  t.w_stride = s.w_stride;
  t.y = p.y;
  t.y_stride = s.y_stride;
  t.rows = p.m;
  t.cols = p.n;
  t.k = p.k;
  t.accumulate = p.accumulate;
  if (!IsQuantized(p.w_dtype) || p.f32_activations) {
    t.x = reinterpret_cast<const uint8_t*>(p.x);
    t.x_stride = s.x_stride * static_cast<int64_t>(sizeof(float));
  } else {
    const ActFormat format = ActFormatFor(p.w_dtype);
    const int64_t row_bytes = ActRowBytes(format, p.k);
    static thread_local Scratch scratch;
    uint8_t* acts = scratch.Get(p.m * row_bytes);
    const auto quantize = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        kernels.quantize_acts(format, p.x + r * s.x_stride, acts + r * row_bytes, p.k);
      }
    };
    if (p.pool != nullptr && p.m >= 16) {
      p.pool->ParallelRanges(p.m, [&](int, int64_t r0, int64_t r1) { quantize(r0, r1); });
    } else {
      quantize(0, p.m);
    }
    t.x = acts;
    t.x_stride = row_bytes;
  }
  if (IsQuantized(p.w_dtype) && p.f32_activations) {
    RunDequantizedTiles(p, t, kernels);
    return;
  }
  RunTiles(kernels.tile[static_cast<int>(p.w_dtype)], t, p.pool);
}

void MatmulReference(const MatmulParams& p) {
  if (!ValidShape(p)) return;
  const Resolved s = Resolve(p);
  std::vector<float> w(static_cast<size_t>(p.k));
  for (int64_t j = 0; j < p.n; ++j) {
    DequantizeRow(p.w_dtype, s.w + j * s.w_stride, w.data(), p.k);
    for (int64_t r = 0; r < p.m; ++r) {
      const float* x = p.x + r * s.x_stride;
      double acc = 0.0;
      for (int64_t i = 0; i < p.k; ++i) acc += static_cast<double>(x[i]) * w[i];
      Store(p, s, r, j, acc);
    }
  }
}

void MatmulQuantizedActivationsReference(const MatmulParams& p) {
  if (!ValidShape(p)) return;
  if (!IsQuantized(p.w_dtype)) return MatmulReference(p);
  const Resolved s = Resolve(p);
  const ActFormat format = ActFormatFor(p.w_dtype);
  const int64_t row_bytes = ActRowBytes(format, p.k);
  std::vector<uint8_t> acts(static_cast<size_t>(p.m * row_bytes));
  for (int64_t r = 0; r < p.m; ++r) {
    QuantizeActRowReference(format, p.x + r * s.x_stride, acts.data() + r * row_bytes, p.k);
  }
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t r = 0; r < p.m; ++r) {
      const ActRow a = ViewActRow(format, acts.data() + r * row_bytes, p.k);
      Store(p, s, r, j, QuantizedDot(p.w_dtype, s.w + j * s.w_stride, a, p.k));
    }
  }
}

}  // namespace dinfer::kernels::cpu
