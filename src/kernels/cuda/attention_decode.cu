// AttentionRows for bf16 with head_dim 64 or 128, on the tensor cores: the query heads that share
// a KV head (up to 16) are the 16 rows of one mma tile, so one pass over the keys serves them
// all. Key tiles of 64 rows are gathered from the paged cache with cp.async, three stages deep,
// which keeps enough bytes in flight to read the cache at close to memory bandwidth; each of the
// 4 warps takes 16 keys of a tile with its own online-softmax state, merged at the end through
// shared memory. Splits of the keys are merged by the rows kernel's merge (natural-log stats).
// An FP8 cache streams its e4m3 bytes through the same pipeline (half the bytes) into stages of
// their own, and each tile is widened into one bf16 K and one bf16 V tile before the mma steps.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/mma.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kRows = 16;  // query heads per CTA
constexpr int kKeys = 64;  // keys per tile, 16 per warp
constexpr int kStages = 3;
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory: Q, then bf16 K and V tiles (kStages of each, or with an FP8 cache one of each
// followed by kStages e4m3 K and V tiles of D bytes a row).
template <int D, bool kFp8>
constexpr int SmemBytes() {
  constexpr int tiles = kFp8 ? 1 : kStages;
  return (kRows + 2 * tiles * kKeys) * (D + 8) * static_cast<int>(sizeof(bf16)) +
         (kFp8 ? 2 * kStages * kKeys * D : 0);
}

template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads) DecodeKernel(AttentionParams p) {
  constexpr int kLd = D + 8;
  constexpr int kChunks = D / 8;
  constexpr int kTiles = kFp8 ? 1 : kStages;  // bf16 tiles of K (and of V)
  extern __shared__ uint4 smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + kRows * kLd;
  bf16* sv = sk + kTiles * kKeys * kLd;
  uint8_t* rk = reinterpret_cast<uint8_t*>(sv + kTiles * kKeys * kLd);  // FP8 stages
  uint8_t* rv = rk + kStages * kKeys * D;
  WaitForPrerequisites();
  AllowDependents();  // the output projection's GEMV streams its weights in meanwhile

  const int64_t row = blockIdx.x;
  const int64_t t = p.row_tokens != nullptr ? p.row_tokens[row] : row;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int chunks = (group + kRows - 1) / kRows;
  const int kvh = blockIdx.y / chunks;
  const int h0 = kvh * group + (blockIdx.y % chunks) * kRows;
  const int nh = min(kRows, kvh * group + group - h0);
  const int split = blockIdx.z;
  const int pos = p.positions[t];
  const PagedRows paged(
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq,
      static_cast<int>(p.block_size));
  const int window = static_cast<int>(p.sliding_window);
  const int lo = window > 0 ? max(0, pos - window + 1) : 0, hi = pos + 1;
  const int splits = static_cast<int>(p.num_splits);
  const int chunk = (hi - lo + splits - 1) / splits;
  const int s_lo = lo + split * chunk, s_hi = min(hi, s_lo + chunk);
  const int num_tiles = s_hi > s_lo ? (s_hi - s_lo + kKeys - 1) / kKeys : 0;
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k_cache = static_cast<const bf16*>(p.k_cache);
  const bf16* v_cache = static_cast<const bf16*>(p.v_cache);

  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, cc = c % kChunks;
    const bool fill = r < nh;
    CpAsync16(sq + r * kLd + cc * 8, fill ? q + t * p.q_stride + (h0 + r) * D + cc * 8 : q, fill);
  }
  auto load_tile = [&](int i, int buf) {
    if constexpr (kFp8) {
      const uint8_t* k8 = static_cast<const uint8_t*>(p.k_cache);
      const uint8_t* v8 = static_cast<const uint8_t*>(p.v_cache);
      for (int c = threadIdx.x; c < kKeys * (D / 16); c += kThreads) {
        const int r = c / (D / 16), cc = c % (D / 16);
        const int j = s_lo + i * kKeys + r;
        const bool fill = j < s_hi;
        const int64_t off = fill ? paged.Slot(j) * kv_dim + kvh * D + cc * 16 : 0;
        CpAsync16(rk + (buf * kKeys + r) * D + cc * 16, k8 + off, fill);
        CpAsync16(rv + (buf * kKeys + r) * D + cc * 16, v8 + off, fill);
      }
    } else {
      for (int c = threadIdx.x; c < kKeys * kChunks; c += kThreads) {
        const int r = c / kChunks, cc = c % kChunks;
        const int j = s_lo + i * kKeys + r;
        const bool fill = j < s_hi;
        const int64_t off = fill ? paged.Slot(j) * kv_dim + kvh * D + cc * 8 : 0;
        CpAsync16(sk + (buf * kKeys + r) * kLd + cc * 8, k_cache + off, fill);
        CpAsync16(sv + (buf * kKeys + r) * kLd + cc * 8, v_cache + off, fill);
      }
    }
  };
  // Commit a group per stage even when empty, so that wait counts stay uniform.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, s);
    CpAsyncCommit();
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c2 = (lane & 3) * 2, mat = lane >> 3;
  uint32_t qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float qk_scale = kFp8 ? p.scale * p.k_scale : p.scale;

  for (int i = 0; i < num_tiles; ++i) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (i + kStages - 1 < num_tiles) load_tile(i + kStages - 1, (i + kStages - 1) % kStages);
    CpAsyncCommit();
    if (i == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        qf[kk][0] = *reinterpret_cast<const uint32_t*>(sq + g * kLd + kk * 16 + c2);
        qf[kk][1] = *reinterpret_cast<const uint32_t*>(sq + (g + 8) * kLd + kk * 16 + c2);
        qf[kk][2] = *reinterpret_cast<const uint32_t*>(sq + g * kLd + kk * 16 + c2 + 8);
        qf[kk][3] = *reinterpret_cast<const uint32_t*>(sq + (g + 8) * kLd + kk * 16 + c2 + 8);
      }
    }
    int buf = i % kStages;
    if constexpr (kFp8) {
      WidenFp8Tile<D>(rk + buf * kKeys * D, rv + buf * kKeys * D, sk, sv);
      __syncthreads();
      buf = 0;
    }
    const bf16* tk = sk + (buf * kKeys + warp * 16) * kLd;
    const bf16* tv = sv + (buf * kKeys + warp * 16) * kLd;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    const bf16* krow = tk + (lane & 7) * kLd + (mat >> 1) * 16 + (mat & 1) * 8;
#pragma unroll
    for (int kk2 = 0; kk2 < D / 32; ++kk2) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t b[4];
        LdMatrixX4(b, krow + nt * 8 * kLd + kk2 * 32);
        Mma(s[nt], qf[2 * kk2], b[0], b[1]);
        Mma(s[nt], qf[2 * kk2 + 1], b[2], b[3]);
      }
    }
    const int key0 = s_lo + i * kKeys + warp * 16;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * qk_scale;
        if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
        s[nt][e] = key0 + nt * 8 + c2 + (e & 1) < s_hi ? x * kLog2e : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;
    const float corr0 = exp2f(m0 - b0), corr1 = exp2f(m1 - b1);
    m0 = n0;
    m1 = n1;
    l0 *= corr0;
    l1 *= corr1;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      o[d][0] *= corr0;
      o[d][1] *= corr0;
      o[d][2] *= corr1;
      o[d][3] *= corr1;
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - b0);
      s[nt][1] = exp2f(s[nt][1] - b0);
      s[nt][2] = exp2f(s[nt][2] - b1);
      s[nt][3] = exp2f(s[nt][3] - b1);
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
    }
    const uint32_t a[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]),
                           PackBf16(s[1][0], s[1][1]), PackBf16(s[1][2], s[1][3])};
    const bf16* vrow = tv + ((mat & 1) * 8 + (lane & 7)) * kLd + (mat >> 1) * 8;
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      LdMatrixX4Trans(b, vrow + dp * 16);
      Mma(o[2 * dp], a, b[0], b[1]);
      Mma(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Merge the 4 warps' states through the (now free) tile memory.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  float* sm_o = reinterpret_cast<float*>(sk);  // [4][kRows][D]
  float* sm_m = sm_o + 4 * kRows * D;          // [4][kRows]
  float* sm_l = sm_m + 4 * kRows;
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    float* r0 = sm_o + (warp * kRows + g) * D + d * 8 + c2;
    float* r1 = r0 + 8 * D;
    r0[0] = o[d][0];
    r0[1] = o[d][1];
    r1[0] = o[d][2];
    r1[1] = o[d][3];
  }
  if ((lane & 3) == 0) {
    sm_m[warp * kRows + g] = m0;
    sm_m[warp * kRows + g + 8] = m1;
    sm_l[warp * kRows + g] = l0;
    sm_l[warp * kRows + g + 8] = l1;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kRows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    if (r >= nh) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) mx = fmaxf(mx, sm_m[w * kRows + r]);
    float sum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float wt = exp2f(sm_m[w * kRows + r] - mx);
        sum += sm_l[w * kRows + r] * wt;
        acc += sm_o[(w * kRows + r) * D + d] * wt;
      }
    }
    const float val = sum > 0.0f ? acc / sum * (kFp8 ? p.v_scale : 1.0f) : 0.0f;
    const int64_t head = h0 + r;
    if (p.num_splits == 1) {
      static_cast<bf16*>(p.out)[t * p.out_stride + head * D + d] = __float2bfloat16_rn(val);
    } else {
      const int64_t cell = (row * p.num_heads + head) * p.num_splits + split;
      p.split_out[cell * D + d] = val;
      if (d == 0) {
        p.split_stats[cell * 2] = mx == -INFINITY ? -INFINITY : mx * kLn2;
        p.split_stats[cell * 2 + 1] = sum;
      }
    }
  }
}

template <int D, bool kFp8>
cudaError_t Launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kSmem = SmemBytes<D, kFp8>();
  static_assert(4 * kRows * D * 4 + 8 * kRows * 4 <= kSmem - kRows * (D + 8) * 2,
                "the merge area must fit in the tile memory");
  static const cudaError_t attr = cudaFuncSetAttribute(
      DecodeKernel<D, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(p.num_rows),
                  static_cast<unsigned>(p.num_kv_heads * ((group + kRows - 1) / kRows)),
                  static_cast<unsigned>(p.num_splits));
  return LaunchDependent(DecodeKernel<D, kFp8>, grid, kThreads, kSmem, stream, p);
}

}  // namespace

cudaError_t AttentionDecodeMma(const AttentionParams& p, cudaStream_t stream) {
  if (p.kv_fp8)
    return p.head_dim == 64 ? Launch<64, true>(p, stream) : Launch<128, true>(p, stream);
  return p.head_dim == 64 ? Launch<64, false>(p, stream) : Launch<128, false>(p, stream);
}

}  // namespace dinfer::kernels::cuda
