// Matrix products of activations with weights, y[m, n] = x[m, k] · w[n, k]ᵀ (the layout of
// kernels/cpu MatmulParams): cuBLASLt for most shapes, and a bf16 GEMV kernel of our own for a
// few rows (decode), which reads the weights once at close to memory bandwidth. FP8 products
// (e4m3 weights and activations with f32 scales, f32 accumulation) run through cuBLASLt too,
// except those with 128 x 128 block scales: a kernel of our own (Fp8BlockGemm).
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
  // Grouped (block-diagonal) products: y[:, g*group_n:(g+1)*group_n] = x[:, g*k:(g+1)*k] ·
  // w[g*group_n:(g+1)*group_n, :]ᵀ for the n / group_n groups (DeepSeek-V4's grouped output
  // projection); 0: one product. n must be a multiple of group_n. GemmRunner::Run runs the groups
  // in one staged-GEMV launch where it applies, else one product per group.
  int64_t group_n = 0;
};

// kAuto: for up to kGemvAutoMaxRows rows the staged GEMV (GemvFused, kPlain) where it applies,
// else the GEMV; cuBLASLt beyond. kGemv: the GEMV kernel below, whatever the shape.
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

// The decode GEMV with its input staged in shared memory (gemv_fused.cu), optionally made by the
// op before it in the same kernel: y = f(x) · wᵀ for m <= kGemvFusedMaxRows rows, bf16 weights,
// k a multiple of 2,048, contiguous weight rows (ldw == k), f32 or bf16 output.
// e4m3 weights (w_dtype kF8E4M3, gemm.w [n, k] e4m3fn bytes, 16-byte aligned) with one f32 scale
// per output row (w_scale [n]): y[m, j] = w_scale[j] * sum_k f(x)[m, k] * w[j, k], the same
// inputs, limits and outputs (gemm.in_dtype, the activations' dtype, stays bf16); with the q/k/v
// epilogue the scale multiplies the row's sum before the bias and the rotation.
//   kPlain:   f(x) = x, as Gemv. With gemm.group_n, output rows of group g read x's columns
//             [g * k, (g + 1) * k).
//   kRmsNorm: f(x)[r] = RmsNorm (elementwise.h) of residual[i] + add[i] (+ add_bias), with
//             i = rows_index ? rows_index[r] : r, rounded to bf16; gemm.x is unused. When
//             residual_out is set (with add; it must not alias residual), it receives the sums.
// (SiLU·mul of a gate/up product is the gate/up GEMV's epilogue, silu_pairs below, so that the
// down GEMV's input is a plain copy.)
enum class GemvInput { kPlain, kRmsNorm };
inline constexpr int64_t kGemvFusedMaxRows = 2;
// Optional q/k/v epilogue of the staged GEMV: the work of QkvRopeKvWrite (qkv.h) done on the
// GEMV's f32 sums, without the per-head q/k RMSNorm. The n = (num_heads + 2 * num_kv_heads) *
// head_dim output rows of token row m are q | k | v (num_kv_heads * head_dim each, as QkvParams's
// qkv row); every field means what the QkvParams field of that name means. bias (f32, optional)
// is added to the sums, the first rotary_dim dims of each q and k head are rotated by
// positions[m] * inv_freq[j] (times attention_scaling); q goes to y (bf16, columns [0, q_dim) of
// row m; the k and v columns of y are not written), k and v go only to the paged caches at
// slot_mapping[m] (bf16, or e4m3 of value / scale with kv_fp8). Needs bf16 output, group_n == 0,
// even head_dim and rotary_dim <= head_dim, rotary_dim even. The sums are not rounded before the
// rotation (the unfused path rounds them to bf16 first: results may differ by one bf16 ulp).
struct GemvQkvEpilogue {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* bias = nullptr;         // [q_dim + 2 * kv_dim], optional
  const int32_t* positions = nullptr;  // [m]
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int64_t rotary_dim = 0;
  bool interleaved = false;
  float attention_scaling = 1.0f;
  void* k_cache = nullptr;  // [num_blocks, block_size, kv_dim] bf16 or e4m3
  void* v_cache = nullptr;
  bool kv_fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  const int64_t* slot_mapping = nullptr;  // [m]
};
struct GemvFusedParams {
  GemmParams gemm;
  GemvInput input = GemvInput::kPlain;
  const float* residual = nullptr;      // [*, k] f32
  const void* add = nullptr;            // [*, k] bf16, optional
  const float* add_bias = nullptr;      // [k], optional (with add)
  const int32_t* rows_index = nullptr;  // [m], optional
  float* residual_out = nullptr;        // [*, k] f32, optional
  const float* norm_weight = nullptr;   // [k]
  float eps = 1e-6f, weight_offset = 0.0f;
  // CTAs per multiprocessor; 0: the default (bf16 weights 2, e4m3 3; fewer where they do not fit).
  int blocks_per_sm = 0;
  // Host memory, read when GemvFused launches; nullptr: y = f(x) · wᵀ as above.
  const GemvQkvEpilogue* qkv = nullptr;
  DType w_dtype = DType::kBF16;    // gemm.w's elements: kBF16 or kF8E4M3
  const float* w_scale = nullptr;  // kF8E4M3: [n], one per output row (device memory)
  // The SiLU·mul epilogue: w is a [gate; up] matrix (n = 2 · inter rows), and row m of y gets
  // the inter values SiLU(gate) · up (bf16, y[m · ldy + i]), each of gate and up rounded to bf16
  // first and the result rounded as SiluMul (elementwise.h) does: the same bits as this GEMV's
  // plain output followed by SiluMul. Needs bf16 output, no groups, no q/k/v epilogue.
  bool silu_pairs = false;
};
bool GemvFusedSupports(const GemvFusedParams& p);
int GemvFused(const GemvFusedParams& p, void* stream);

// FP8 (e4m3fn) products y = (x ⊙ sx) · (w ⊙ sw)ᵀ on the tensor cores (cuBLASLt, sm_90), both
// operands e4m3, rows of x and w contiguous in k (ldx, ldw multiples of 16), f32 accumulation,
// bf16 or f32 output. The scales multiply:
//   kTensor:   one f32 for all of x (x_scale[0]) and one for all of w (w_scale[0]);
//   kChannel:  one per row of x (x_scale[m], per token) and one per row of w (w_scale[n], per
//              output channel). cuBLASLt 13.0 on an H200 offers no algorithm for its
//              OUTER_VEC scale mode (heuristic: invalid value, measured), so the product runs
//              with unit scales and ScaleOuter multiplies y by x_scale[i] * w_scale[j] after;
//   kBlock128: w in 128 x 128 blocks, w_scale [ceil(n / 128), ceil(k / 128)] row-major (as
//              DeepSeek checkpoints store weight_scale_inv), x in 1 x 128 groups, x_scale
//              [ceil(k / 128), m] (m contiguous: cuBLASLt's layout); k a multiple of 128.
//              cuBLASLt 13.0 on the H200 has no algorithm for its BLK128x128 / VEC128 modes
//              (measured), so RunFp8 runs Fp8BlockGemm below, our kernel, for these.
// Scales are device pointers, read when the product runs.
enum class Fp8Scaling { kTensor, kChannel, kBlock128 };
struct Fp8GemmParams {
  const void* x = nullptr;  // [m, ldx] e4m3
  const void* w = nullptr;  // [n, ldw] e4m3
  void* y = nullptr;        // [m, ldy] of out_dtype
  int64_t ldx = 0, ldw = 0, ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  DType out_dtype = DType::kBF16;  // bf16 or f32
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
};

// The block-scaled FP8 product (Fp8Scaling::kBlock128) of our own (gemm_fp8_block.cu): each
// 128-wide k block is summed apart on the tensor cores and added to f32 accumulators times its
// two scales, so the tensor cores' short FP8 sums never span more than one block. Needs k a
// multiple of 128, ldx and ldw multiples of 16, x and w 16-byte aligned; any m and n.
//   kSkinny:   a few rows (decode): warps split k and read the weights once per 16 rows straight
//              into mma.sync fragments (memory-bound);
//   kWgmma64, kWgmma128: 64 or 128 x 128 tiles of y on wgmma (sm_90a) through a 4-deep cp.async
//              ring, the next k block on the tensor cores while the last is promoted;
//   kTiled64, kTiled128: 64 or 128 x 128 tiles on mma.sync m16n8k32, the same ring. Hopper runs
//              e4m3 mma.sync as f16 HMMA after unpacking (SASS), far below wgmma: kept to compare.
// kAuto: kSkinny up to kFp8BlockSkinnyMaxRows rows, kWgmma64 up to kFp8BlockWgmma64MaxRows (more
// tiles to fill the multiprocessors), else kWgmma128.
enum class Fp8BlockPath { kAuto, kSkinny, kTiled64, kTiled128, kWgmma64, kWgmma128 };
inline constexpr int64_t kFp8BlockSkinnyMaxRows = 16;
inline constexpr int64_t kFp8BlockWgmma64MaxRows = 256;
bool Fp8BlockGemmSupports(const Fp8GemmParams& p);
int Fp8BlockGemm(const Fp8GemmParams& p, void* stream, Fp8BlockPath path = Fp8BlockPath::kAuto);

// Activations to e4m3 for an FP8 product: x [m, ldx] (bf16 or f32) → out [m, k] e4m3 and the
// scales Fp8GemmParams reads for `scaling`. kTensor divides by the given *scale (static, e.g.
// calibrated); kChannel and kBlock128 compute each row's (each 128-column group's) scale as
// amax / 448 (1 for all-zero groups) and write it to `scale`. Values saturate to ±448.
struct Fp8QuantizeParams {
  const void* x = nullptr;
  int64_t ldx = 0, m = 0, k = 0;
  DType dtype = DType::kBF16;
  void* out = nullptr;
  Fp8Scaling scaling = Fp8Scaling::kChannel;
  float* scale = nullptr;  // kTensor: read; else written, laid out as Fp8GemmParams::x_scale
};
int QuantizeFp8(const Fp8QuantizeParams& p, void* stream);
// y[i, j] *= row_scale[i] * col_scale[j] for y [m, ldy] of dtype (f32 or bf16), in place.
int ScaleOuter(void* y, int64_t ldy, int64_t m, int64_t n, DType dtype, const float* row_scale,
               const float* col_scale, void* stream);

class GemmRunner {
 public:
  static StatusOr<std::unique_ptr<GemmRunner>> Create(size_t workspace_bytes = 32u << 20);
  ~GemmRunner();

  Status Run(const GemmParams& p, void* stream, GemmImpl impl = GemmImpl::kAuto);
  Status RunFp8(const Fp8GemmParams& p, void* stream);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;
  GemmRunner() = default;
  // p.in_dtype kF8E4M3: an FP8 plan with one f32 scale per operand.
  StatusOr<const Plan*> PlanFor(const GemmParams& p);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  float* unit_scale_ = nullptr;  // device 1.0f: the scales of FP8 products scaled after
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace dinfer::kernels::cuda
