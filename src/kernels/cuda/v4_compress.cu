// DeepSeek-V4's compressors and the lightning indexer's top-k (v4_compress.h).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/v4_compress.h"

namespace dinfer::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Compressor

constexpr int kMaxCompressThreads = 128;  // 4 dims a thread: dim <= 512
constexpr int kCompressMinCtas = 3;       // CTAs an SM keeps (registers: at most 170 a thread)

// Online softmax pooling of one dimension: running max m, sum s, weighted sum a (the CPU's
// Accumulator::Add, step for step).
__device__ __forceinline__ void AddSlot(float& m, float& s, float& a, float kv, float logit) {
  if (logit > m) {
    const float shrink = expf(m - logit);
    a = a * shrink + kv;
    s = s * shrink + 1.0f;
    m = logit;
  } else {
    const float e = expf(logit - m);
    a += e * kv;
    s += e;
  }
}

// The accumulator of 4 consecutive dims.
struct Acc4 {
  float4 m, s, a;

  __device__ void Clear() {
    m = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    a = s;
  }
  __device__ void Add(const float4 kv, const float4 g, const float4 b) {
    AddSlot(m.x, s.x, a.x, kv.x, g.x + b.x);
    AddSlot(m.y, s.y, a.y, kv.y, g.y + b.y);
    AddSlot(m.z, s.z, a.z, kv.z, g.z + b.z);
    AddSlot(m.w, s.w, a.w, kv.w, g.w + b.w);
  }
  // Series `which` of a state row (m, s, a planes of dim floats each).
  __device__ void Load(const float* row, int64_t dim, int which, int d) {
    const float* base = row + static_cast<int64_t>(which) * 3 * dim + d;
    m = *reinterpret_cast<const float4*>(base);
    s = *reinterpret_cast<const float4*>(base + dim);
    a = *reinterpret_cast<const float4*>(base + 2 * dim);
  }
  __device__ void Store(float* row, int64_t dim, int which, int d) const {
    float* base = row + static_cast<int64_t>(which) * 3 * dim + d;
    *reinterpret_cast<float4*>(base) = m;
    *reinterpret_cast<float4*>(base + dim) = s;
    *reinterpret_cast<float4*>(base + 2 * dim) = a;
  }
};

__device__ __forceinline__ float4 Load4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}

// Sum over the CTA (blockDim.x a multiple of 32); every thread gets it. Safe to call repeatedly.
__device__ float CtaSum(float v, float* partial, float* total) {
  v = WarpSum(v);
  const int warps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = static_cast<int>(threadIdx.x) < warps ? partial[threadIdx.x] : 0.0f;
    s = WarpSum(s);
    if (threadIdx.x == 0) *total = s;
  }
  __syncthreads();
  return *total;
}

// Normalises, rotates and stores the entry completed at position `pos` (the window's last token).
template <typename T>
__device__ void EmitEntry(const V4CompressParams& p, const Acc4& acc, int64_t pos, int seq, int d,
                          bool active, float* partial, float* total) {
  float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
    x[0] = acc.a.x / acc.s.x;
    x[1] = acc.a.y / acc.s.y;
    x[2] = acc.a.z / acc.s.z;
    x[3] = acc.a.w / acc.s.w;
  }
  const float ss = CtaSum(x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3], partial, total);
  if (!active) return;
  const int64_t rate = p.rate;
  if (p.replay_end != nullptr && pos < p.replay_end[seq]) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.dim) + p.eps);
  const float4 w = Load4(p.norm_weight + d);
  float y[4] = {(x[0] * inv) * w.x, (x[1] * inv) * w.y, (x[2] * inv) * w.z, (x[3] * inv) * w.w};
  const int64_t rot0 = p.dim - p.rotary_dim;
  const float angle_pos = static_cast<float>(pos + 1 - rate);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t dd = d + 2 * j;
    if (dd < rot0) continue;
    float sn, cs;
    sincosf(angle_pos * p.inv_freq[(dd - rot0) / 2], &sn, &cs);
    const float x0 = y[2 * j], x1 = y[2 * j + 1];
    y[2 * j] = x0 * cs - x1 * sn;
    y[2 * j + 1] = x1 * cs + x0 * sn;
  }
  const int64_t w_id = pos / rate;
  const int32_t* table = p.entry_tables + static_cast<int64_t>(seq) * p.entry_max_blocks_per_seq;
  const int64_t last = (w_id + 1) * rate - 1;
  const int64_t row = static_cast<int64_t>(table[last / p.entry_block_size]) * p.rows_per_block +
                      (last % p.entry_block_size) / rate;
  T* out = static_cast<T*>(p.entries) + row * p.dim + d;
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = FromFloat<T>(y[i]);
}

// One CTA pools the positions [ustart, uend] of one sequence. CTA s < num_seqs: the first unit of
// sequence s, from its first token in the batch up to the end of every window that reads or
// rewrites the state row of the block before it (and at least r tokens). CTA num_seqs + j: the
// window starting in batch tokens [j r, j r + r) after the first unit, if any: only the sequence
// of token j r can have one there (its first unit spans r tokens), and at most one.
template <typename T, bool kOverlap>
__global__ void __launch_bounds__(kMaxCompressThreads, kCompressMinCtas)
    CompressKernel(const V4CompressParams p) {
  constexpr int kBatch = kOverlap ? 4 : 8;  // tokens whose rows are loaded ahead of pooling
  __shared__ float partial[32];
  __shared__ float total;
  WaitForPrerequisites();
  AllowDependents();
  const int64_t r = p.rate, bs = p.block_size;
  const bool first_unit = blockIdx.x < p.num_seqs;
  int seq;
  int64_t b, e, first, p0 = 0;
  if (first_unit) {
    seq = static_cast<int>(blockIdx.x);
    b = seq > 0 ? p.seq_token_end[seq - 1] : 0;
    e = p.seq_token_end[seq];
    if (e <= b) return;
    first = p.positions[b];
  } else {
    const int64_t ts = (static_cast<int64_t>(blockIdx.x) - p.num_seqs) * r;
    seq = p.token_seq[ts];
    const int64_t ps = p.positions[ts];
    b = seq > 0 ? p.seq_token_end[seq - 1] : 0;
    e = p.seq_token_end[seq];
    first = ps - (ts - b);  // positions are consecutive
    const int64_t ahead = (r - ps % r) % r;
    if (ts + ahead >= e) return;
    p0 = ps + ahead;
  }
  const int64_t last = first + (e - b) - 1;
  const auto window_end = [&](int64_t pos) { return pos / r * r + r - 1; };
  // The first unit reads the state saved at first - 1 (both series). It also covers the window
  // after a window started before `first` (its predecessor's first halves are in the state; and
  // the first unit spans r tokens) and the write of that state row again (first inside a block).
  int64_t first_end = window_end(first);
  if (first % r != 0) first_end += r;
  if (first > 0 && first % bs != 0) {
    first_end = max(first_end, window_end(min(last, first / bs * bs + bs - 1)));
  }
  first_end = min(first_end, last);
  int64_t ustart, uend;
  if (first_unit) {
    ustart = first;
    uend = first_end;
  } else if (p0 > first_end) {
    ustart = p0;
    uend = min(last, p0 + r - 1);
  } else {
    return;
  }

  const int64_t dim = p.dim, state_width = (kOverlap ? 6 : 3) * dim;
  const int64_t half = kOverlap ? dim : 0;  // column of the current window's half
  const int d = static_cast<int>(threadIdx.x) * 4;
  const bool active = d < dim;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int64_t width = kOverlap ? 2 * dim : dim;
  Acc4 cur, next;
  cur.Clear();
  next.Clear();
  if (ustart == first) {
    if (first > 0 && active) {
      const float* row = p.state + static_cast<int64_t>(table[(first - 1) / bs]) * state_width;
      cur.Load(row, dim, 0, d);
      if constexpr (kOverlap) next.Load(row, dim, 1, d);
    }
  } else if (kOverlap && active) {
    // The previous window's tokens are all in the batch: their first halves start this entry.
    for (int64_t c = ustart - r; c < ustart; c += kBatch) {
      float4 kv[kBatch], g[kBatch], bias[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t pos = c + u;
        if (pos >= ustart) break;
        const int64_t t = b + pos - first;
        kv[u] = Load4(p.kv + t * p.kv_stride + d);
        g[u] = Load4(p.gate + t * p.gate_stride + d);
        bias[u] = Load4(p.bias + pos % r * width + d);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (c + u >= ustart) break;
        cur.Add(kv[u], g[u], bias[u]);
      }
    }
  }

  for (int64_t c = ustart; c <= uend; c += kBatch) {
    float4 kv[kBatch], g[kBatch], bias[kBatch], kv1[kBatch], g1[kBatch], bias1[kBatch];
    if (active) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t pos = c + u;
        if (pos > uend) break;
        const float* kv_row = p.kv + (b + pos - first) * p.kv_stride + d;
        const float* g_row = p.gate + (b + pos - first) * p.gate_stride + d;
        const float* bias_row = p.bias + pos % r * width + d;
        kv[u] = Load4(kv_row + half);
        g[u] = Load4(g_row + half);
        bias[u] = Load4(bias_row + half);
        if constexpr (kOverlap) {
          kv1[u] = Load4(kv_row);
          g1[u] = Load4(g_row);
          bias1[u] = Load4(bias_row);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t pos = c + u;
      if (pos > uend) break;
      if (active) {
        cur.Add(kv[u], g[u], bias[u]);
        if constexpr (kOverlap) next.Add(kv1[u], g1[u], bias1[u]);
      }
      if (pos % r == r - 1) {
        EmitEntry<T>(p, cur, pos, seq, d, active, partial, &total);
        if constexpr (kOverlap) {
          cur = next;
        } else {
          cur.Clear();
        }
        next.Clear();
      }
      if (active && ((pos + 1) % bs == 0 || pos == last)) {
        float* row = p.state + static_cast<int64_t>(table[pos / bs]) * state_width;
        cur.Store(row, dim, 0, d);
        if constexpr (kOverlap) next.Store(row, dim, 1, d);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Indexer scores

constexpr int kScoreThreads = 256;
constexpr int kTileEntries = 64;  // entries of a tile: 16 thread columns x 4
constexpr int kTileHeads = 64;    // heads of a pass: 16 thread rows x 4
constexpr int kChunkK = 32;       // head_dim slice of a key tile in shared memory
constexpr int kMaxQFloats = 8192;
constexpr int kKeyPitch = kTileEntries + 4;

// Row of entry w in the keys plane (32-bit arithmetic: positions fit in int32).
__device__ __forceinline__ int64_t EntryRow(const int32_t* table, int64_t block_size, int64_t rate,
                                            int64_t rows_per_block, int64_t w) {
  const int32_t bs = static_cast<int32_t>(block_size), r = static_cast<int32_t>(rate);
  const int32_t last = (static_cast<int32_t>(w) + 1) * r - 1;
  return static_cast<int64_t>(table[last / bs]) * rows_per_block + (last % bs) / r;
}

// Loads 4 (f32) or 8 (bf16) key elements as floats.
template <typename T>
__device__ __forceinline__ void LoadKeys(const T* src, float* dst);
template <>
__device__ __forceinline__ void LoadKeys<float>(const float* src, float* dst) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(src));
  dst[0] = v.x;
  dst[1] = v.y;
  dst[2] = v.z;
  dst[3] = v.w;
}
template <>
__device__ __forceinline__ void LoadKeys<bf16>(const bf16* src, float* dst) {
  float v[8];
  LoadVec<bf16>(src, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = v[i];
}

// CTA (token t, chunk of tiles_per_cta tiles of 64 entries): for each tile, S[h, w] = q_h · k_w
// as a 64 x 64 x head_dim f32 GEMM per pass of 64 heads (q of the token resident in shared
// memory, keys in slices of 32 dims), then score[w] = Σ_h relu(S[h, w]) * coef[h].
template <typename T>
__global__ void __launch_bounds__(kScoreThreads)
    ScoreKernel(const V4IndexerParams p, int64_t tiles_per_cta, int64_t heads_padded) {
  extern __shared__ __align__(16) float q_s[];  // [head_dim][heads_padded + 4]
  __shared__ __align__(16) float k_s[kChunkK][kKeyPitch];
  __shared__ float red[kScoreThreads / 16][kTileEntries];
  __shared__ float coef[kMaxQFloats / kChunkK];
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x;
  const int64_t valid = min(static_cast<int64_t>(p.positions[t] + 1) / p.rate, p.max_entries);
  const int64_t e_begin = static_cast<int64_t>(blockIdx.y) * tiles_per_cta * kTileEntries;
  if (e_begin >= valid) return;
  const int64_t e_end = min(valid, e_begin + tiles_per_cta * kTileEntries);
  const int tid = threadIdx.x, hg = tid / 16, eg = tid % 16;
  // Dims past head_dim (up to a whole slice) are zeros in q_s and in the key tiles.
  const int64_t D = p.head_dim, Dp = (D + kChunkK - 1) / kChunkK * kChunkK, H = p.num_heads,
                qp = heads_padded + 4;
  const float c = p.scale * p.weights_scale;
  for (int64_t h = tid; h < heads_padded; h += kScoreThreads) {
    coef[h] = h < H ? p.weights[t * p.weights_stride + h] * c : 0.0f;
  }
  const float* q = p.q + t * p.q_stride;
  for (int64_t i = tid; i < heads_padded * Dp; i += kScoreThreads) {
    const int64_t h = i / Dp, k = i % Dp;
    q_s[k * qp + h] = h < H && k < D ? q[h * D + k] : 0.0f;
  }
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const T* keys = static_cast<const T*>(p.keys);
  constexpr int kVecK = 16 / sizeof(T);                                // elements a load
  constexpr int kLoadsPerRow = kChunkK / kVecK;                        // loads per entry slice
  constexpr int kLoads = kTileEntries * kLoadsPerRow / kScoreThreads;  // per thread per slice

  for (int64_t e0 = e_begin; e0 < e_end; e0 += kTileEntries) {
    // The key rows this thread loads (fixed for the tile).
    const T* rows[kLoads];
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int v = tid + l * kScoreThreads, e = v / kLoadsPerRow;
      rows[l] = e0 + e < e_end
                    ? keys + EntryRow(table, p.block_size, p.rate, p.rows_per_block, e0 + e) * D +
                          (v % kLoadsPerRow) * kVecK
                    : nullptr;
    }
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t hb = 0; hb < heads_padded; hb += kTileHeads) {
      float acc[4][4] = {};
      for (int64_t k0 = 0; k0 < Dp; k0 += kChunkK) {
        __syncthreads();  // the previous slice is consumed (and q_s / coef are written)
#pragma unroll
        for (int l = 0; l < kLoads; ++l) {
          const int v = tid + l * kScoreThreads, e = v / kLoadsPerRow;
          const int kk = (v % kLoadsPerRow) * kVecK;
          float x[kVecK];
          if (rows[l] != nullptr && k0 + kk < D) {
            LoadKeys<T>(rows[l] + k0, x);
          } else {
#pragma unroll
            for (int i = 0; i < kVecK; ++i) x[i] = 0.0f;
          }
#pragma unroll
          for (int i = 0; i < kVecK; ++i) k_s[kk + i][e] = x[i];
        }
        __syncthreads();
        const float* qk = q_s + k0 * qp + hb + hg * 4;
#pragma unroll 8
        for (int k = 0; k < kChunkK; ++k) {
          const float4 a = *reinterpret_cast<const float4*>(qk + k * qp);
          const float4 w = *reinterpret_cast<const float4*>(&k_s[k][eg * 4]);
          const float av[4] = {a.x, a.y, a.z, a.w}, wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float ch = coef[hb + hg * 4 + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) part[j] += fmaxf(acc[i][j], 0.0f) * ch;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) red[hg][eg * 4 + j] = part[j];
    __syncthreads();
    if (tid < kTileEntries && e0 + tid < e_end) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kScoreThreads / 16; ++i) s += red[i][tid];
      p.workspace[t * p.max_entries + e0 + tid] = s;
    }
  }
}

// Tensor-core scores for bf16 keys of 128 dims: S[h, w] = q_h · k_w by mma.sync m16n8k16 with f32
// accumulators, q split exactly into three bf16 parts (hi + mid + lo == q), so the products are
// those of f32 q and the sums f32 ones. A CTA of 4 warps takes 64 heads (16 a warp) against tiles
// of 64 entries, double-buffered in shared memory by cp.async (key rows read whole, 256 bytes).
constexpr int kTcThreads = 128;
constexpr int kTcDim = 128;
constexpr int kTcPitch = kTcDim + 8;  // bf16 elements a shared row: conflict-free ldmatrix
constexpr int kTcMaxHeads = 1024;

// The A fragments (m16n8k16, row-major) of 16 heads from h0, all 8 k-steps, in three bf16 parts.
__device__ __forceinline__ void QFragments(const float* q, int64_t h0, int64_t heads, int lane,
                                           uint32_t (&qa)[kTcDim / 16][3][4]) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kTcDim / 16; ++ks) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t h = h0 + g + (r & 1) * 8;
      const int k = ks * 16 + 2 * c + (r >> 1) * 8;
      float2 x = make_float2(0.0f, 0.0f);
      if (h < heads) x = *reinterpret_cast<const float2*>(q + h * kTcDim + k);
      const float hx = __bfloat162float(__float2bfloat16_rn(x.x));
      const float hy = __bfloat162float(__float2bfloat16_rn(x.y));
      const float rx = x.x - hx, ry = x.y - hy;
      const float mx = __bfloat162float(__float2bfloat16_rn(rx));
      const float my = __bfloat162float(__float2bfloat16_rn(ry));
      qa[ks][0][r] = PackBf16(hx, hy);
      qa[ks][1][r] = PackBf16(mx, my);
      qa[ks][2][r] = PackBf16(rx - mx, ry - my);
    }
  }
}

__global__ void __launch_bounds__(kTcThreads)
    ScoreKernelTc(const V4IndexerParams p, int64_t tiles_per_cta, int64_t heads_padded) {
  __shared__ __align__(16) bf16 k_s[2][kTileEntries][kTcPitch];
  __shared__ float red[kTcThreads / 32][kTileEntries];
  __shared__ float coef[kTcMaxHeads];
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x;
  const int64_t valid = min(static_cast<int64_t>(p.positions[t] + 1) / p.rate, p.max_entries);
  const int64_t e_begin = static_cast<int64_t>(blockIdx.y) * tiles_per_cta * kTileEntries;
  if (e_begin >= valid) return;
  const int64_t e_end = min(valid, e_begin + tiles_per_cta * kTileEntries);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const float cs = p.scale * p.weights_scale;
  for (int64_t h = tid; h < heads_padded; h += kTcThreads) {
    coef[h] = h < p.num_heads ? p.weights[t * p.weights_stride + h] * cs : 0.0f;
  }
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const bf16* keys = static_cast<const bf16*>(p.keys);
  const float* q = p.q + t * p.q_stride;
  // Each thread copies 16-byte piece tid % 16 of rows tid / 16 + 8 i.
  auto load_tile = [&](int buf, int64_t e0) {
#pragma unroll
    for (int i = 0; i < kTileEntries / 8; ++i) {
      const int r = tid / 16 + 8 * i, piece = tid % 16;
      const bool ok = e0 + r < e_end;
      const bf16* src =
          ok ? keys + EntryRow(table, p.block_size, p.rate, p.rows_per_block, e0 + r) * kTcDim +
                   piece * 8
             : keys;
      CpAsync16(&k_s[buf][r][piece * 8], src, ok);
    }
    CpAsyncCommit();
  };
  const bool one_pass = heads_padded == 64;
  uint32_t qa[kTcDim / 16][3][4];
  if (one_pass) QFragments(q, warp * 16, p.num_heads, lane, qa);
  const int64_t tiles = (e_end - e_begin + kTileEntries - 1) / kTileEntries;
  load_tile(0, e_begin);
  for (int64_t i = 0; i < tiles; ++i) {
    const int buf = static_cast<int>(i & 1);
    if (i + 1 < tiles) {
      load_tile(buf ^ 1, e_begin + (i + 1) * kTileEntries);
    } else {
      CpAsyncCommit();
    }
    CpAsyncWait<1>();
    __syncthreads();  // the tile is in shared memory (and coef written)
    float sc[8][2] = {};
    for (int64_t hb = 0; hb < heads_padded; hb += 64) {
      if (!one_pass) QFragments(q, hb + warp * 16, p.num_heads, lane, qa);
      float acc[8][4] = {};
#pragma unroll
      for (int ks = 0; ks < kTcDim / 16; ++ks) {
#pragma unroll
        for (int j2 = 0; j2 < 4; ++j2) {
          // Matrices: n-tile 2 j2 (k 0-7, 8-15), n-tile 2 j2 + 1 (k 0-7, 8-15).
          const int m = lane >> 3, row = lane & 7;
          uint32_t b[4];
          LdMatrixX4(b, &k_s[buf][(2 * j2 + (m >> 1)) * 8 + row][ks * 16 + (m & 1) * 8]);
#pragma unroll
          for (int part = 0; part < 3; ++part) {
            Mma(acc[2 * j2], qa[ks][part], b[0], b[1]);
            Mma(acc[2 * j2 + 1], qa[ks][part], b[2], b[3]);
          }
        }
      }
      const float c0 = coef[hb + warp * 16 + g], c1 = coef[hb + warp * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sc[j][0] += fmaxf(acc[j][0], 0.0f) * c0 + fmaxf(acc[j][2], 0.0f) * c1;
        sc[j][1] += fmaxf(acc[j][1], 0.0f) * c0 + fmaxf(acc[j][3], 0.0f) * c1;
      }
    }
    // Sum over the warp's heads (lanes of equal c), then over the warps.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = sc[j][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (g == 0) red[warp][j * 8 + 2 * c + e] = v;
      }
    }
    __syncthreads();  // red written; every warp is done with this tile's buffer
    const int64_t e0 = e_begin + i * kTileEntries;
    if (tid < kTileEntries && e0 + tid < e_end) {
      p.workspace[t * p.max_entries + e0 + tid] =
          red[0][tid] + red[1][tid] + red[2][tid] + red[3][tid];
    }
  }
  CpAsyncWait<0>();
}

// ---------------------------------------------------------------------------------------------
// Top-k by radix select

constexpr int kSelectThreads = 512;

// Unsigned keys ordered as the floats.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kSelectThreads) SelectKernel(const V4IndexerParams p) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_remaining;
  __shared__ int count_gt, count_eq;
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x, k = p.topk;
  const int64_t valid = min(static_cast<int64_t>(p.positions[t] + 1) / p.rate, p.max_entries);
  int32_t* out = p.selected + t * k;
  const int tid = threadIdx.x;
  if (valid <= k) {
    for (int64_t i = tid; i < k; i += kSelectThreads)
      out[i] = i < valid ? static_cast<int32_t>(i) : -1;
    return;
  }
  const float* scores = p.workspace + t * p.max_entries;
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kSelectThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = tid; i < valid; i += kSelectThreads) {
      const uint32_t key = OrderedKey(scores[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid < 32) {
      // Lane l holds bins 255 - 8l down to 248 - 8l: the bins in decreasing order over the warp.
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[255 - 8 * tid - j];
        sum += c[j];
      }
      uint32_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (tid >= o) incl += v;
      }
      uint32_t above = incl - sum;  // elements in higher bins
      if (above < remaining && incl >= remaining) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (above + c[j] >= remaining) {
            s_prefix = prefix | (static_cast<uint32_t>(255 - 8 * tid - j) << shift);
            s_remaining = remaining - above;
            break;
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  // prefix is the key of the k-th best; `remaining` of the elements equal to it are taken.
  if (tid == 0) {
    count_gt = 0;
    count_eq = 0;
  }
  __syncthreads();
  const int64_t above = k - remaining;
  for (int64_t i = tid; i < valid; i += kSelectThreads) {
    const uint32_t key = OrderedKey(scores[i]);
    if (key > prefix) {
      out[atomicAdd(&count_gt, 1)] = static_cast<int32_t>(i);
    } else if (key == prefix) {
      const int slot = atomicAdd(&count_eq, 1);
      if (slot < static_cast<int>(remaining)) out[above + slot] = static_cast<int32_t>(i);
    }
  }
}

}  // namespace

int V4Compress(const V4CompressParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  const int64_t dim = p.dim, bs = p.block_size, r = p.rate;
  if (p.num_seqs <= 0 || dim <= 0 || dim % 4 != 0 || dim > 4 * kMaxCompressThreads || r <= 0 ||
      bs <= 0 || (bs % r != 0 && r % bs != 0) || p.rotary_dim < 0 || p.rotary_dim > dim ||
      p.rotary_dim % 2 != 0 || (dim - p.rotary_dim) % 2 != 0 || p.kv_stride % 4 != 0 ||
      p.gate_stride % 4 != 0 || !Aligned16(p.kv) || !Aligned16(p.gate) || !Aligned16(p.bias) ||
      !Aligned16(p.state) || !Aligned16(p.norm_weight) || p.kv == nullptr || p.gate == nullptr ||
      p.bias == nullptr || p.token_seq == nullptr || p.positions == nullptr ||
      p.seq_token_end == nullptr || p.block_tables == nullptr || p.state == nullptr ||
      p.norm_weight == nullptr || (p.rotary_dim > 0 && p.inv_freq == nullptr) ||
      p.entries == nullptr || p.entry_tables == nullptr || p.entry_block_size <= 0 ||
      p.rows_per_block <= 0) {
    return cudaErrorInvalidValue;
  }
  const int threads = static_cast<int>((dim / 4 + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(p.num_seqs + (p.num_tokens + r - 1) / r));
  return DispatchFloat(p.entries_dtype, [&](auto tag) {
    using T = decltype(tag);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return p.overlap ? LaunchDependent(CompressKernel<T, true>, grid, dim3(threads), 0, s, p)
                     : LaunchDependent(CompressKernel<T, false>, grid, dim3(threads), 0, s, p);
  });
}

int64_t V4IndexerWorkspaceFloats(int64_t num_tokens, int64_t max_entries) {
  return num_tokens * max_entries;
}

int V4IndexerTopK(const V4IndexerParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  const int64_t heads_padded = (p.num_heads + kTileHeads - 1) / kTileHeads * kTileHeads;
  if (p.num_heads <= 0 || p.head_dim <= 0 || p.head_dim % 8 != 0 || p.rate <= 0 || p.topk <= 0 ||
      p.max_entries <= 0 || p.block_size <= 0 || p.rows_per_block <= 0 || p.q == nullptr ||
      p.weights == nullptr || p.keys == nullptr || !Aligned16(p.keys) || p.token_seq == nullptr ||
      p.positions == nullptr || p.block_tables == nullptr || p.workspace == nullptr ||
      p.selected == nullptr) {
    return cudaErrorInvalidValue;
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t tiles = (p.max_entries + kTileEntries - 1) / kTileEntries;
  // Enough CTAs to fill the GPU, each over as many tiles as keeps the q loads amortised.
  const int64_t tiles_per_cta = std::clamp<int64_t>(p.num_tokens * tiles / 1024, 1, 16);
  const int64_t chunks = (tiles + tiles_per_cta - 1) / tiles_per_cta;
  if (chunks > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(chunks));
  const int64_t dim_padded = (p.head_dim + kChunkK - 1) / kChunkK * kChunkK;
  const size_t smem = static_cast<size_t>(dim_padded * (heads_padded + 4)) * sizeof(float);
  const bool tensor_cores = p.keys_dtype == DType::kBF16 && p.head_dim == kTcDim &&
                            heads_padded <= kTcMaxHeads && p.q_stride % 2 == 0 &&
                            reinterpret_cast<uintptr_t>(p.q) % 8 == 0;
  if (tensor_cores) {
    const cudaError_t err = LaunchDependent(ScoreKernelTc, grid, dim3(kTcThreads), 0, s, p,
                                            tiles_per_cta, heads_padded);
    if (err != cudaSuccess) return err;
    return LaunchDependent(SelectKernel, dim3(static_cast<unsigned>(p.num_tokens)),
                           dim3(kSelectThreads), 0, s, p);
  }
  if (heads_padded * dim_padded > kMaxQFloats) return cudaErrorInvalidValue;
  const cudaError_t err = DispatchFloat(p.keys_dtype, [&](auto tag) {
    using T = decltype(tag);
    return LaunchDependent(ScoreKernel<T>, grid, dim3(kScoreThreads), smem, s, p, tiles_per_cta,
                           heads_padded);
  });
  if (err != cudaSuccess) return err;
  return LaunchDependent(SelectKernel, dim3(static_cast<unsigned>(p.num_tokens)),
                         dim3(kSelectThreads), 0, s, p);
}

}  // namespace dinfer::kernels::cuda
