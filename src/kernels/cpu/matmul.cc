#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>
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

// One tile of work: the kernel to run on it, or, for quantized weights with f32 activations, the
// weight type to dequantize before running the f32 kernel.
struct TileTask {
  Tile tile;
  internal::TileFn fn = nullptr;
  DType dequantize = DType::kF32;
};

// Cuts the m x n outputs of `whole` into tiles; consecutive tiles share weight rows (row tiles
// vary fastest).
void PlanTiles(const Tile& whole, int threads, bool parallel, internal::TileFn fn, DType dequantize,
               std::vector<TileTask>* out) {
  const int64_t m = whole.rows, n = whole.cols;
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
  for (int64_t task = 0; task < row_tasks * col_tasks; ++task) {
    const int64_t r0 = task % row_tasks * row_block, c0 = task / row_tasks * col_block;
    TileTask tt{whole, fn, dequantize};
    Tile& t = tt.tile;
    t.x = whole.x + r0 * whole.x_stride;
    t.w = whole.w + c0 * whole.w_stride;
    t.y = whole.y + r0 * whole.y_stride + c0;
    t.rows = std::min(row_block, m - r0);
    t.cols = std::min(col_block, n - c0);
    out->push_back(tt);
  }
}

// f32 activations with quantized weights: dequantizes the tile's weight rows a few at a time, so
// they stay in L1/L2, and runs the f32 kernel over them.
void RunDequantizedTile(const TileTask& task) {
  constexpr int64_t kRowsPerChunk = 16;
  const Tile& t = task.tile;
  static thread_local Scratch scratch;
  auto* w = reinterpret_cast<float*>(scratch.Get(kRowsPerChunk * t.k * 4));
  for (int64_t c0 = 0; c0 < t.cols; c0 += kRowsPerChunk) {
    const int64_t nc = std::min(kRowsPerChunk, t.cols - c0);
    for (int64_t j = 0; j < nc; ++j) {
      DequantizeRow(task.dequantize, t.w + (c0 + j) * t.w_stride, w + j * t.k, t.k);
    }
    Tile sub = t;
    sub.w = reinterpret_cast<const uint8_t*>(w);
    sub.w_stride = t.k * 4;
    sub.y = t.y + c0;
    sub.cols = nc;
    task.fn(sub);
  }
}

void RunTasks(const std::vector<TileTask>& tasks, ThreadPool* pool, bool parallel) {
  const auto run = [&](int64_t i) {
    const TileTask& t = tasks[i];
    if (IsQuantized(t.dequantize)) {
      RunDequantizedTile(t);
    } else {
      t.fn(t.tile);
    }
  };
  const int64_t n = static_cast<int64_t>(tasks.size());
  if (!parallel || n == 1) {
    for (int64_t i = 0; i < n; ++i) run(i);
    return;
  }
  pool->ParallelFor(n, [&](int, int64_t i) { run(i); });
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

// Whether the product runs on 8-bit activations; otherwise quantized weights are dequantized.
bool QuantizedActivations(const MatmulParams& p) {
  return IsQuantized(p.w_dtype) && !p.f32_activations && HasActFormat(p.w_dtype);
}

void ZeroOutputs(const MatmulParams& p, const Resolved& s) {
  if (p.accumulate) return;
  for (int64_t r = 0; r < p.m; ++r) std::fill_n(p.y + r * s.y_stride, p.n, 0.0f);
}

void Store(const MatmulParams& p, const Resolved& s, int64_t r, int64_t j, double v) {
  float& out = p.y[r * s.y_stride + j];
  out = static_cast<float>(p.accumulate ? out + v : v);
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
    case DType::kF8E4M3B32:
    case DType::kMxfp4:
      return true;
    default:
      return false;
  }
}

void Matmul(const MatmulParams& p) { MatmulShared(std::span(&p, 1)); }

void MatmulShared(std::span<const MatmulParams> ps) {
  if (ps.empty()) return;
  const MatmulParams& p0 = ps[0];
  bool shared = true;
  for (const MatmulParams& p : ps) {
    const bool q0 = QuantizedActivations(p0);
    const bool q = QuantizedActivations(p);
    shared = shared && ValidShape(p) && p.x == p0.x && p.m == p0.m && p.k == p0.k &&
             Resolve(p).x_stride == Resolve(p0).x_stride && p.pool == p0.pool && q == q0 &&
             (!q || ActFormatFor(p.w_dtype) == ActFormatFor(p0.w_dtype));
  }
  if (!shared && ps.size() > 1) {
    for (const MatmulParams& p : ps) Matmul(p);
    return;
  }
  if (!ValidShape(p0)) return;
  const KernelSet& kernels = ActiveKernels();
  const Resolved s0 = Resolve(p0);
  Tile base;
  base.rows = p0.m;
  base.k = p0.k;
  if (p0.k == 0) {
    for (const MatmulParams& p : ps) ZeroOutputs(p, Resolve(p));
    return;
  }
  if (!QuantizedActivations(p0)) {
    base.x = reinterpret_cast<const uint8_t*>(p0.x);
    base.x_stride = s0.x_stride * static_cast<int64_t>(sizeof(float));
  } else {
    // The activations are quantized once for every product.
    const ActFormat format = ActFormatFor(p0.w_dtype);
    const int64_t row_bytes = ActRowBytes(format, p0.k);
    static thread_local Scratch scratch;
    uint8_t* acts = scratch.Get(p0.m * row_bytes);
    const auto quantize = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        kernels.quantize_acts(format, p0.x + r * s0.x_stride, acts + r * row_bytes, p0.k);
      }
    };
    if (p0.pool != nullptr && p0.m >= 16) {
      p0.pool->ParallelRanges(p0.m, [&](int, int64_t r0, int64_t r1) { quantize(r0, r1); });
    } else {
      quantize(0, p0.m);
    }
    base.x = acts;
    base.x_stride = row_bytes;
  }
  const int threads = p0.pool != nullptr ? p0.pool->num_threads() : 1;
  int64_t work = 0;
  for (const MatmulParams& p : ps) work += p.m * p.n * p.k;
  const bool parallel = threads > 1 && work >= kMinParallelWork;
  thread_local std::vector<TileTask> tasks;
  tasks.clear();
  for (const MatmulParams& p : ps) {
    const Resolved s = Resolve(p);
    Tile t = base;
    t.w = s.w;
    t.w_stride = s.w_stride;
    t.y = p.y;
    t.y_stride = s.y_stride;
    t.cols = p.n;
    t.accumulate = p.accumulate;
    const bool dequantize = IsQuantized(p.w_dtype) && !QuantizedActivations(p);
    const DType kernel_type = dequantize ? DType::kF32 : p.w_dtype;
    PlanTiles(t, threads, parallel, kernels.tile[static_cast<int>(kernel_type)],
              dequantize ? p.w_dtype : DType::kF32, &tasks);
  }
  RunTasks(tasks, p0.pool, parallel);
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
  if (!IsQuantized(p.w_dtype) || !HasActFormat(p.w_dtype)) return MatmulReference(p);
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
