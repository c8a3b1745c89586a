// CUDA kernels for DeepSeek-V4's per-token mixing ops: manifold-constrained hyper-connections
// (HcPre before a sublayer, HcPost after it, HcHead for the logits rows), MoE routing (top-k or
// hash routing) and the per-head RMSNorm + trailing interleaved rotary of the attention rows.
// Semantics are those of the CPU kernels (kernels/cpu/deepseek_v4.h HcPre/HcPost/HcHead/Route,
// kernels/cpu/ops.h RmsNorm and Rope with interleaved pairs and rotary_offset = head_dim -
// rotary_dim), with the hyper-connection mixes computed as model/layers/hyper_connection.cc does:
// mixes = (streams[t] / rms(streams[t])) · fnᵀ, the RMS over all hc * dim values of a token.
// All activations are f32 ([tokens, hc * dim] for the hc residual streams of a token, stream i
// at columns [i * dim, (i + 1) * dim)). Launchers take plain params and a stream (cudaStream_t
// as void*), do not synchronise and return a cudaError_t value as int (0 on success;
// cudaErrorInvalidValue for params outside the limits below). Grids depend only on the sizes.
//
// Limits: HcPre / HcHead: hc == 4, dim a multiple of 4 (16-byte accesses; streams, fn,
// collapsed and f32 normed 16-byte aligned, bf16 normed 8-byte aligned). The mixes of a token
// are dot products over all its hc * dim values: a cluster of 8 CTAs shares each group of
// tokens (1, 4 or 32 tokens per cluster by the token count), each CTA taking dim / 8 of every
// stream, so that decode spreads the fn read over many SMs and prefill reuses fn across the
// group; the partial sums meet in distributed shared memory. HcPost: dim a multiple of 4.
// Route: num_experts <= 1024, top_k <= 16 (and <= num_experts), one warp per token. NormRope:
// head_dim even, rotary_dim even and <= head_dim, strides even, x and out 8-byte aligned.
//
// Decode path (HcPre / HcHead given a workspace, at most kHcWorkspaceMaxTokens tokens or rows,
// dim <= 32768): two kernels. The first spreads the hc * dim dot products over
// ceil(hc * dim / 128) CTAs per group of up to 16 tokens (each CTA a 128-value slice of fn for
// every mix row) and writes each slice's partial mixes and sum of squares to the workspace; the
// second has no cluster: per token, one CTA sums the partials of pre (fixed order), collapses the
// whole row and RMSNorms it (a block reduction), and (HcPre) another CTA sums the partials of
// post and comb and runs Sinkhorn. The same inputs give the same bits on every run; both launches
// are graph-capturable. The first kernel's work can instead be done by the HcPost before (given
// the next op's fn and workspace: each of its CTAs writes a slice of the new streams and that
// slice's partials, the same bits), and the op then launches only the second kernel
// (partials_ready). Both kernels read weights (fn, base, scale, norm_weight) before waiting
// for the kernel before them in the stream (programmatic dependent launch): weights must not be
// written by the kernels just before (they never are).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

// Before a sublayer: mixes = (streams[t] / rms(streams[t])) · fnᵀ (rms over hc*dim values, eps
// norm_eps), then pre/post/comb exactly as kernels/cpu HcPre (sigmoid, softmax rows + eps,
// Sinkhorn `iters`), collapsed = Σ_i pre_i · streams_i, and (when normed is set) normed =
// RMSNorm(collapsed) * norm_weight (eps norm_eps) stored as normed_dtype (f32 or bf16): the
// sublayer's input.
//
// workspace (optional): HcWorkspaceFloats(num_tokens, hc, dim) floats of device memory, not
// aliasing any other buffer; nullptr, or more than kHcWorkspaceMaxTokens tokens, takes the
// single-kernel path. Launches on one stream may share a workspace; concurrent launches on
// different streams need their own. Its contents need no initialisation and are scratch.
struct HcPreParams {
  const float* streams = nullptr;  // [tokens, hc * dim]
  const float* fn = nullptr;       // [(2 + hc) * hc, hc * dim]
  const float* base = nullptr;     // [(2 + hc) * hc]
  const float* scale = nullptr;    // [3]   (device pointer)
  int64_t num_tokens = 0, hc = 0, dim = 0, iters = 0;
  float hc_eps = 0.0f, norm_eps = 1e-6f;
  float* post = nullptr;               // [tokens, hc]
  float* comb = nullptr;               // [tokens, hc, hc]
  float* collapsed = nullptr;          // [tokens, dim], optional
  const float* norm_weight = nullptr;  // [dim], with normed
  void* normed = nullptr;              // [tokens, dim] of normed_dtype, optional
  DType normed_dtype = DType::kBF16;
  float* workspace = nullptr;  // optional, see above
  // The workspace already holds this call's partial mixes and sums of squares, written by the
  // HcPost just before with next_fn = fn and next_workspace = workspace (over the streams it
  // wrote, which must be `streams`): only the finishing kernel runs, with the bits of the full
  // path. Honoured only where the workspace path applies (HcWorkspacePath(num_tokens, dim)),
  // which is exactly where that HcPost writes them; ignored elsewhere.
  bool partials_ready = false;
};
int HcPre(const HcPreParams& p, void* stream);

// Token counts up to which HcPre / HcHead use a workspace given to them, and the floats that
// workspace needs for num_tokens tokens (counts above the limit need only the limit's size, as the
// workspace is then unused): min(num_tokens, limit) * ((2 + hc) * hc + 1) * ceil(hc * dim / 128).
// HcWorkspacePath: whether `num_tokens` tokens (rows) of width dim take the workspace path given
// a workspace (and whether HcPost writes the next op's partials).
constexpr int64_t kHcWorkspaceMaxTokens = 64;
constexpr int64_t kHcWorkspaceMaxDim = 32768;
constexpr bool HcWorkspacePath(int64_t num_tokens, int64_t dim) {
  return num_tokens > 0 && num_tokens <= kHcWorkspaceMaxTokens && dim <= kHcWorkspaceMaxDim;
}
int64_t HcWorkspaceFloats(int64_t num_tokens, int64_t hc, int64_t dim);

// After the sublayer: out[t, k] = post[t, k] * y[t] + Σ_j comb[t, j, k] * streams[t, j]; out must
// not alias streams.
//
// Optionally, with next_fn and next_workspace (the next HcPre's fn and workspace, or with
// next_head HcHead's), where HcWorkspacePath(num_tokens, dim): one kernel, each CTA a 128-value
// slice of the hc * dim values of a group of tokens (the slicing of the op's partial kernel),
// writes its slice of `out` and that slice's partial mixes (out · next_fnᵀ) and sums of squares
// to next_workspace, laid out and summed exactly as the op's partial kernel does (by token of
// `out`), so that the op, called with partials_ready, gives the bits of HcPost then the op. next_fn
// is read before waiting for the kernel before (a weight). Elsewhere (more tokens, no next_fn)
// they are ignored and HcPost writes `out` only. next_workspace must not alias any other buffer.
struct HcPostParams {
  const float* streams = nullptr;  // [tokens, hc * dim]
  const float* y = nullptr;        // [tokens, dim]
  const float *post = nullptr, *comb = nullptr;
  int64_t num_tokens = 0, hc = 0, dim = 0;
  float* out = nullptr;             // [tokens, hc * dim]
  const float* next_fn = nullptr;   // [(2 + hc) * hc, hc * dim]; next_head: [hc, hc * dim]
  bool next_head = false;           // next_fn is HcHead's
  float* next_workspace = nullptr;  // HcWorkspaceFloats(num_tokens, hc, dim) floats
};
int HcPost(const HcPostParams& p, void* stream);

// The final collapse for the logits rows: row r reads streams row i = rows_index ? rows_index[r] :
// r; mixes = rms-normed streams · fnᵀ (fn [hc, hc*dim]), pre_i = sigmoid(mix_i * scale[0] +
// base_i) + hc_eps, x = Σ_i pre_i streams_i, then normed[r] = RMSNorm(x) * norm_weight (eps
// norm_eps) as normed_dtype. workspace: as HcPreParams' (rows for tokens; the same size serves
// both ops).
struct HcHeadParams {
  const float* streams = nullptr;
  const int32_t* rows_index = nullptr;                           // [rows], optional
  const float *fn = nullptr, *base = nullptr, *scale = nullptr;  // scale: device [1]
  int64_t rows = 0, hc = 0, dim = 0;
  float hc_eps = 0.0f, norm_eps = 1e-6f;
  const float* norm_weight = nullptr;
  void* normed = nullptr;  // [rows, dim]
  DType normed_dtype = DType::kBF16;
  float* workspace = nullptr;  // optional
  // The workspace holds the partials of every streams row that rows_index names (by streams
  // row), written by the HcPost just before with next_head, next_fn = fn and next_workspace =
  // workspace: only the finishing kernel runs. The caller sets it only when that HcPost took its
  // partials path (HcWorkspacePath of its num_tokens); honoured where HcWorkspacePath(rows, dim).
  bool partials_ready = false;
};
int HcHead(const HcHeadParams& p, void* stream);

// MoE routing, kernels/cpu Route semantics (top_k of scores + bias, ties to the lower expert id;
// weights = the chosen raw scores, / (sum + 1e-20) when normalize, * scaling). Hash routing:
// experts = tid2eid[token_ids[t]] ([vocab, top_k] i32); a token id outside [0, vocab) gets
// experts -1 and weights 0 (an entry of tid2eid outside [0, num_experts) weighs 0).
enum class RouterScoring { kSqrtSoftplus, kSoftmax, kSigmoid };
struct RouteParams {
  const float* logits = nullptr;                               // [tokens, ld]
  int64_t ld = 0, num_tokens = 0, num_experts = 0, top_k = 0;  // num_experts <= 1024, top_k <= 16
  RouterScoring scoring = RouterScoring::kSqrtSoftplus;
  const float* bias = nullptr;       // [num_experts], optional
  const int32_t* tid2eid = nullptr;  // optional (hash routing)
  const int32_t* token_ids = nullptr;
  int64_t vocab = 0;
  bool normalize = true;
  float scaling = 1.0f;
  int32_t* experts = nullptr;  // [tokens, top_k]
  float* weights = nullptr;    // [tokens, top_k]
};
int Route(const RouteParams& p, void* stream);

// Per-head RMSNorm and/or DeepSeek-V4 rotary on f32 rows: for each token and head, optionally
// x = x / rms(x) * (norm_weight or 1) over head_dim (eps), then rotate the interleaved pairs of
// the last rotary_dim dims by angle (positions[t] + position_offset) * inv_freq[i] (inverse: by
// -angle), computed as the CPU does (float32 angle, cos/sin), and store as out_dtype (f32 or
// bf16). out may equal x (f32, same stride). One warp per (token, head) row; rows of up to 1024
// dims are held in registers. norm_weight and inv_freq may be read before waiting for the kernel
// before in the stream (programmatic dependent launch): they must not be written by the kernels
// just before (weights never are).
struct NormRopeParams {
  const float* x = nullptr;
  int64_t x_stride = 0;  // elements between tokens
  void* out = nullptr;
  int64_t out_stride = 0;
  DType out_dtype = DType::kF32;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  bool norm = false;
  const float* norm_weight = nullptr;  // [head_dim], optional
  float eps = 1e-6f;
  int64_t rotary_dim = 0;           // 0: no rotary
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  const int32_t* positions = nullptr;
  int32_t position_offset = 0;
  bool inverse = false;
};
int NormRope(const NormRopeParams& p, void* stream);

// Up to kNormRopeMaxJobs independent NormRope jobs (any shapes, dtypes, options) in one launch:
// one grid covering all the jobs' rows, each job computed exactly as NormRope computes it (the
// same bits). The jobs are read on the host (passed to the kernel by value). A job may work in
// place; no job may write what another job reads or writes. Jobs with no rows are skipped;
// count 0 launches nothing.
constexpr int kNormRopeMaxJobs = 4;
int NormRopeBatch(const NormRopeParams* jobs, int count, void* stream);

}  // namespace dinfer::kernels::cuda
