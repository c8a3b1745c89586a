// CUDA kernels of the mixture-of-experts layer after routing (model/layers/moe.cc Forward): the
// permutation of the (token, expert) pairs by expert, the grouped expert product on the permuted
// rows, the clamped SwiGLU between the two products, and the weighted combine back into token
// order. Routing gives experts [tokens, top_k] i32 and weights [tokens, top_k] f32; an expert id
// outside [0, num_experts) (-1: "no expert") is skipped. One layer is
//   MoePlan -> GroupedGemm(x, w13, gather by row_token) -> SiluMulClamp -> GroupedGemm(act, w2)
//   -> MoeCombine.
// A shared expert (one more expert every token goes to, weight 1) of the routed experts' widths
// rides along: its rows follow the routed ones at the fixed row max_rows (= tokens * top_k) of
// the products' outputs, computed by extra CTAs of the same GroupedGemm launches, activated by the
// same SiluMulClamp launch (fixed_rows) and added by MoeCombine (shared_row0). At decode (the
// list path) the SwiGLU can be w13's epilogue (GroupedGemmParams::swiglu): plan, w13 + shared +
// SwiGLU, w2 + shared, combine — four launches.
// Launchers take plain params and a stream (cudaStream_t as void*), do not synchronise, allocate
// nothing and return a cudaError_t value as int (0 on success, cudaErrorInvalidValue for invalid
// params). Grids depend only on the params' sizes; the row counts of the experts stay on the device
// (expert_offsets), so a layer can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

// Permutation on the device: pairs sorted by expert, stable in (token, j) order. One CTA of 1,024
// threads (a few microseconds at 8,192 x 6 pairs; the pairs are counted by one warp per 32 of
// them, up to 32 warps, so a decode step's few pairs touch a single row of counters). Limits:
// num_experts <= kMoeMaxExperts, tokens * top_k < 2^31. Rows past expert_offsets[num_experts] of
// row_token are not written. active_experts (optional, for GroupedGemm's decode path):
// [num_experts + 1]; entries [0, count) are the experts with rows in increasing order, entries
// [count, num_experts) are -1, entry num_experts is count.
inline constexpr int64_t kMoeMaxExperts = 1024;
struct MoePlanParams {
  const int32_t* experts = nullptr;  // [tokens, top_k]
  int64_t num_tokens = 0, top_k = 0, num_experts = 0;
  int32_t* expert_offsets = nullptr;  // [num_experts + 1]: rows of expert e are [off[e], off[e+1])
  int32_t* row_token = nullptr;       // [tokens * top_k]: the token of each permuted row
  int32_t* pair_row =
      nullptr;  // [tokens * top_k]: the permuted row of pair (t, j), -1 when skipped
  int32_t* active_experts = nullptr;  // [num_experts + 1], optional (see above)
  int32_t* workspace = nullptr;       // MoePlanWorkspaceInts(num_tokens, top_k, num_experts) ints
};
// The plan keeps its counters in shared memory: this is 0 (workspace may be null).
int64_t MoePlanWorkspaceInts(int64_t num_tokens, int64_t top_k, int64_t num_experts);
int MoePlan(const MoePlanParams& p, void* stream);

// Grouped product on the permuted rows: y[r] = x[row_token ? row_token[r] : r] · W_eᵀ for the rows
// r of expert e; W = [num_experts, n, k] bf16 contiguous (expert e at w + e * n * k); x bf16
// [*, ldx]; y [rows, ldy] of out_dtype (f32 or bf16), f32 accumulation. The number of rows is
// expert_offsets[num_experts] (on the device): the grid is sized for max_rows (= tokens * top_k)
// and idle CTAs exit; rows past it are not written.
// Requirements: n and k multiples of 8, ldx a multiple of 8, x and w 16-byte aligned.
// Paths (chosen from max_rows and num_experts on the host):
//   Skinny (max_rows <= kGroupedGemmSkinnyMaxRows(num_experts), decode): a CTA of 4 warps owns 8
//     weight rows of one expert and up to 16 of its rows; the warps split k and read the weights
//     straight into mma.sync m16n8k16 fragments with 16-byte streaming loads (4 in flight a
//     lane), so each active expert's weights are read once per 16 rows at close to memory
//     bandwidth; experts without rows launch nothing but an exiting CTA.
//     With active_experts (MoePlan's list) instead: CTA (x, y) = 32 weight rows of expert
//     active_experts[y] (grid min(num_experts, max_rows) x n / 32; y past the count exits at once)
//     and all of that expert's rows, 32 at a time (the weights are read once per 32 rows); each
//     of its 4 warps owns 8 weight rows and the whole of k (no reduction) and keeps 4 to 8
//     16-byte weight loads in flight a lane, 7 CTAs an SM. Same results as without the list up to
//     the order of the f32 sums. Limits: min(num_experts, max_rows) <= 65535. An expert with many
//     rows is done in passes by one row of n / 32 CTAs, so with skewed routing (one expert holding
//     hundreds of rows) this path is slower than the one without the list; decode routing
//     (a few rows an expert) is what it is for.
//   Shared expert (optional, all paths): y rows [max_rows, max_rows + shared_rows) =
//     x rows [shared_x_row0, shared_x_row0 + shared_rows) (no gather) · shared_wᵀ, shared_w [n, k]
//     bf16, done by extra CTAs of the same launch (one more tile slot per 16 / 32 / 128 of its
//     rows on the skinny / list / tiled path). y then has max_rows + shared_rows rows.
//   Tiled (prefill): 128 x 128 tiles of one expert's rows on mma.sync m16n8k16, 8 warps, k blocks
//     of 64 staged through a 4-deep cp.async ring (128-byte swizzled rows, ldmatrix), the gather
//     folded into the copies. Tiles are (expert, 128-row block) x 128-column block, derived in
//     each CTA from expert_offsets.
inline int64_t GroupedGemmSkinnyMaxRows(int64_t num_experts) {
  return num_experts * 8 > 128 ? num_experts * 8 : 128;
}
struct GroupedGemmParams {
  const void* x = nullptr;
  int64_t ldx = 0;
  const int32_t* row_token = nullptr;  // optional gather
  const void* w = nullptr;
  const int32_t* expert_offsets = nullptr;
  // Optional (skinny path only; the tiled path ignores it): MoePlan's active_experts for the same
  // expert_offsets. Null: the tile of each CTA is found from expert_offsets.
  const int32_t* active_experts = nullptr;
  int64_t num_experts = 0, n = 0, k = 0, max_rows = 0;
  void* y = nullptr;
  int64_t ldy = 0;
  DType out_dtype = DType::kBF16;
  // Optional clamped SwiGLU epilogue (the w13 product at decode; list path only, n a multiple of
  // 32, out_dtype kBF16): y is then act bf16 [rows, ldy >= n / 2] with act[r, i] =
  // SiluMulClamp of g = (x · Wᵀ)[r, i] and u = (x · Wᵀ)[r, n / 2 + i] — the same f32 sums and
  // the same arithmetic as GroupedGemm (f32 out) then SiluMulClamp, one launch and no gate/up
  // round trip. CTA x of the list path then owns gate rows [16 x, 16 x + 16) and their up rows.
  bool swiglu = false;
  float swiglu_limit = 0.0f;  // SiluMulClamp's limit (0: silu(g) * u)
  // Optional shared expert (see above): [n, k] bf16, 16-byte aligned; shared_rows > 0 with it.
  const void* shared_w = nullptr;
  int64_t shared_rows = 0, shared_x_row0 = 0;
};
int GroupedGemm(const GroupedGemmParams& p, void* stream);
// Whether GroupedGemm takes the list path for these params (the only one with the SwiGLU
// epilogue): max_rows <= GroupedGemmSkinnyMaxRows(num_experts), active_experts given, and
// x's rows addressable in 32-bit 16-byte units.
bool GroupedGemmTakesListPath(const GroupedGemmParams& p);

// out[r, i] = silu(min(g, limit)) * clamp(u, -limit, limit) with g = in[r, i], u = in[r, inter + i]
// (limit 0: silu(g) * u); in f32|bf16 [rows, ld_in], out bf16 [rows, ld_out]. rows_on_device:
// optional pointer to the row count (expert_offsets + num_experts); rows = bound. fixed_rows: the
// last fixed_rows of the rows, [rows - fixed_rows, rows), are always done (the shared expert's
// rows after max_rows); the device count then bounds the rows before them only.
// Requirements: inter, ld_in and ld_out multiples of 8, in and out 16-byte aligned.
struct SiluMulClampParams {
  const void* in = nullptr;
  DType in_dtype = DType::kF32;
  int64_t ld_in = 0;
  void* out = nullptr;
  int64_t ld_out = 0;
  int64_t rows = 0, inter = 0;
  float limit = 0.0f;
  const int32_t* rows_on_device = nullptr;
  int64_t fixed_rows = 0;
};
int SiluMulClamp(const SiluMulClampParams& p, void* stream);

// out[t] = Σ_j weights[t, j] * y[pair_row[t, j]] (pairs with pair_row -1 skipped) +
// (shared ? shared[t] : 0) + (shared_row0 >= 0 ? y[shared_row0 + t] : 0), summed in j order,
// shared last; y f32|bf16 [rows, ldy], out f32 [tokens, hidden]. CTA (x, y) = 512 columns of
// token y (64 threads of 8 columns; grid-stride over tokens past 65535). Requirements: hidden and
// ldy multiples of 8, y, shared and out 16-byte aligned.
struct MoeCombineParams {
  const void* y = nullptr;
  DType y_dtype = DType::kF32;
  int64_t ldy = 0;
  const int32_t* pair_row = nullptr;
  const float* weights = nullptr;
  int64_t num_tokens = 0, top_k = 0, hidden = 0;
  const float* shared = nullptr;  // [tokens, hidden], optional
  int64_t shared_row0 = -1;       // >= 0: the shared expert's rows in y (GroupedGemm's max_rows)
  float* out = nullptr;
};
int MoeCombine(const MoeCombineParams& p, void* stream);

}  // namespace dinfer::kernels::cuda
