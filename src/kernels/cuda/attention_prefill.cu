// AttentionPrefill: FlashAttention-style tiles on the tensor cores. A CTA of 4 warps takes 64
// query tokens of one sequence and one query head; each warp owns 16 query rows. Key/value tiles
// of 64 rows are gathered from the paged cache into shared memory with cp.async, two stages deep.
// S = Q·Kᵀ and O += P·V use mma.sync m16n8k16 (bf16 in, f32 accumulate); the S accumulators are
// repacked in registers as the A operand of P·V, and V's B operand comes from ldmatrix.trans.
// An FP8 cache is staged as e4m3 bytes (two stages) and each tile widened to one bf16 K and one
// bf16 V tile; Q is then staged in the V tile.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kBM = kPrefillTileTokens;  // query rows per CTA
constexpr int kBN = 64;                  // keys per tile
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

template <int D, bool kFp8>
constexpr int SmemBytes() {
  return kFp8 ? 2 * kBN * (D + 8) * static_cast<int>(sizeof(bf16)) + 4 * kBN * D
              : 4 * kBN * (D + 8) * static_cast<int>(sizeof(bf16));
}

template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads, 3) PrefillKernel(AttentionParams p) {
  constexpr int kLd = D + 8;  // padded rows: fragment loads of 8 rows hit 8 different banks
  constexpr int kChunks = D / 8;
  constexpr int kTiles = kFp8 ? 1 : 2;  // bf16 stages of K (and of V)
  extern __shared__ uint4 smem_raw[];
  // K and V tiles, two stages; Q is staged in the second K stage (with an FP8 cache, in the V
  // tile) until its fragments are in registers, so three CTAs fit an SM.
  bf16* sk = reinterpret_cast<bf16*>(smem_raw);
  bf16* sv = sk + kTiles * kBN * kLd;
  bf16* sq = kFp8 ? sv : sk + kBN * kLd;
  uint8_t* rk = reinterpret_cast<uint8_t*>(sv + kTiles * kBN * kLd);  // FP8: two stages each
  uint8_t* rv = rk + 2 * kBN * D;
  static_assert(kBM == kBN, "Q is staged in a K or V tile");
  WaitForPrerequisites();
  AllowDependents();

  const int h = blockIdx.x;
  const int tile = blockIdx.y;
  const int seq = p.tile_seq[tile];
  const int tok0 = p.tile_token[tile];
  const int rows = min(kBM, p.seq_token_end[seq] - tok0);
  const int kvh = h / static_cast<int>(p.num_heads / p.num_kv_heads);
  const int qpos0 = p.positions[tok0];
  const int k_hi = qpos0 + rows;  // keys [k_lo, k_hi)
  const int window = static_cast<int>(p.sliding_window);
  const int k_lo = window > 0 ? max(0, qpos0 - window + 1) : 0;
  const int kt_begin = k_lo / kBN, kt_end = (k_hi + kBN - 1) / kBN;
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq,
                        static_cast<int>(p.block_size));
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  const bf16* k_cache = static_cast<const bf16*>(p.k_cache);
  const bf16* v_cache = static_cast<const bf16*>(p.v_cache);
  const bf16* q = static_cast<const bf16*>(p.q);

  for (int c = threadIdx.x; c < kBM * kChunks; c += kThreads) {
    const int r = c / kChunks, cc = c % kChunks;
    const bool fill = r < rows;
    const bf16* src = fill ? q + (tok0 + r) * p.q_stride + h * D + cc * 8 : q;
    CpAsync16(sq + r * kLd + cc * 8, src, fill);
  }
  auto load_kv = [&](int kt, int buf) {
    if constexpr (kFp8) {
      const uint8_t* k8 = static_cast<const uint8_t*>(p.k_cache);
      const uint8_t* v8 = static_cast<const uint8_t*>(p.v_cache);
      for (int c = threadIdx.x; c < kBN * (D / 16); c += kThreads) {
        const int r = c / (D / 16), cc = c % (D / 16);
        const int j = kt * kBN + r;
        const bool fill = j < k_hi;
        const int64_t off = fill ? paged.Slot(j) * kv_dim + kvh * D + cc * 16 : 0;
        CpAsync16(rk + (buf * kBN + r) * D + cc * 16, k8 + off, fill);
        CpAsync16(rv + (buf * kBN + r) * D + cc * 16, v8 + off, fill);
      }
    } else {
      for (int c = threadIdx.x; c < kBN * kChunks; c += kThreads) {
        const int r = c / kChunks, cc = c % kChunks;
        const int j = kt * kBN + r;
        const bool fill = j < k_hi;
        int64_t off = 0;
        if (fill) off = paged.Slot(j) * kv_dim + kvh * D + cc * 8;
        CpAsync16(sk + (buf * kBN + r) * kLd + cc * 8, k_cache + off, fill);
        CpAsync16(sv + (buf * kBN + r) * kLd + cc * 8, v_cache + off, fill);
      }
    }
  };
  load_kv(kt_begin, 0);
  CpAsyncCommit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int qp0 = qpos0 + warp * 16 + g, qp1 = qp0 + 8;  // positions of this thread's two rows
  const int warp_first = qpos0 + warp * 16, warp_last = warp_first + 15;
  const float qk_scale = kFp8 ? p.scale * p.k_scale : p.scale;
  const float scale_log2 = qk_scale * kLog2e;

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  // Q (and the first K/V tile) in; Q's fragments to registers before its stage is reused.
  CpAsyncWait<0>();
  __syncthreads();
  {
    const bf16* wq = sq + warp * 16 * kLd;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][0] = *reinterpret_cast<const uint32_t*>(wq + g * kLd + kk * 16 + c2);
      qf[kk][1] = *reinterpret_cast<const uint32_t*>(wq + (g + 8) * kLd + kk * 16 + c2);
      qf[kk][2] = *reinterpret_cast<const uint32_t*>(wq + g * kLd + kk * 16 + c2 + 8);
      qf[kk][3] = *reinterpret_cast<const uint32_t*>(wq + (g + 8) * kLd + kk * 16 + c2 + 8);
    }
  }
  __syncthreads();

  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int buf = (kt - kt_begin) & 1;
    if (kt + 1 < kt_end) {
      load_kv(kt + 1, buf ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    int tb = buf;
    if constexpr (kFp8) {
      WidenFp8Tile<D>(rk + buf * kBN * D, rv + buf * kBN * D, sk, sv);
      __syncthreads();
      tb = 0;
    }
    const int key0 = kt * kBN;
    // Tiles wholly in this warp's causal future, or wholly before its window, contribute nothing.
    const bool skip = key0 > warp_last || (window > 0 && key0 + kBN - 1 <= warp_first - window);
    if (!skip) {
      const bf16* tk = sk + tb * kBN * kLd;
      const bf16* tv = sv + tb * kBN * kLd;
      float s[kBN / 8][4];
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      // One ldmatrix gives the K fragments of two k-steps: matrices (keys of n-tile nt) x
      // (dims 0-7, 8-15 of step 2*kk2, then of step 2*kk2+1).
      const int mat = lane >> 3;
      const bf16* krow = tk + (lane & 7) * kLd + (mat >> 1) * 16 + (mat & 1) * 8;
#pragma unroll
      for (int kk2 = 0; kk2 < D / 32; ++kk2) {
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
          uint32_t b[4];
          LdMatrixX4(b, krow + nt * 8 * kLd + kk2 * 32);
          Mma(s[nt], qf[2 * kk2], b[0], b[1]);
          Mma(s[nt], qf[2 * kk2 + 1], b[2], b[3]);
        }
      }
      // Masks only where a key of the tile can be out of reach of a row of this warp: the
      // causal diagonal, the window's edge. Elsewhere, just the scale (in log2 units).
      const bool need_mask =
          key0 + kBN - 1 > warp_first || (window > 0 && key0 <= warp_last - window);
      const bool capped = p.softcap > 0.0f;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float x = s[nt][i];
          if (capped) {
            x = p.softcap * tanhf(x * qk_scale / p.softcap) * kLog2e;
          } else {
            x *= scale_log2;
          }
          if (need_mask) {
            const int j = key0 + nt * 8 + c2 + (i & 1);
            const int qp = i < 2 ? qp0 : qp1;
            if (j > qp || (window > 0 && j <= qp - window)) x = -INFINITY;
          }
          s[nt][i] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
      }
      OnlineSoftmaxStep(s, o, mx0, mx1, m0, m1, l0, l1);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        const uint32_t a[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]),
                               PackBf16(s[2 * kk][2], s[2 * kk][3]),
                               PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const bf16* vrow = tv + (kk * 16 + (mat & 1) * 8 + (lane & 7)) * kLd + (mat >> 1) * 8;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, vrow + dp * 16);
          Mma(o[2 * dp], a, b[0], b[1]);
          Mma(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float v_scale = kFp8 ? p.v_scale : 1.0f;
  const float inv0 = l0 > 0.0f ? v_scale / l0 : 0.0f, inv1 = l1 > 0.0f ? v_scale / l1 : 0.0f;
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  bf16* out = static_cast<bf16*>(p.out);
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    const int col = h * D + i * 8 + c2;
    if (r0 < rows) {
      *reinterpret_cast<__nv_bfloat162*>(out + (tok0 + r0) * p.out_stride + col) =
          __floats2bfloat162_rn(o[i][0] * inv0, o[i][1] * inv0);
    }
    if (r1 < rows) {
      *reinterpret_cast<__nv_bfloat162*>(out + (tok0 + r1) * p.out_stride + col) =
          __floats2bfloat162_rn(o[i][2] * inv1, o[i][3] * inv1);
    }
  }
}

template <int D, bool kFp8>
cudaError_t Launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kSmem = SmemBytes<D, kFp8>();
  static const cudaError_t attr = cudaFuncSetAttribute(
      PrefillKernel<D, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_tiles));
  return LaunchDependent(PrefillKernel<D, kFp8>, grid, kThreads, kSmem, stream, p);
}

}  // namespace

bool PrefillSupports(DType dtype, int64_t head_dim) {
  return dtype == DType::kBF16 && (head_dim == 64 || head_dim == 128);
}

int AttentionPrefill(const AttentionParams& p, void* stream) {
  if (p.num_tiles == 0) return 0;
  if (!PrefillSupports(p.dtype, p.head_dim) || p.num_heads % p.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.kv_fp8) return p.head_dim == 64 ? Launch<64, true>(p, s) : Launch<128, true>(p, s);
  return p.head_dim == 64 ? Launch<64, false>(p, s) : Launch<128, false>(p, s);
}

}  // namespace dinfer::kernels::cuda
