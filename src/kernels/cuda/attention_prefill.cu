// AttentionPrefill: FlashAttention-style tiles on the tensor cores. A CTA of 4 warps takes 128
// query rows: the (token, head) pairs of one KV head's group of G = num_heads / num_kv_heads
// query heads over a host tile of kPrefillTileTokens tokens, token-major (row r: token r / G,
// head r % G of the group), cut into G CTAs of 128 rows (128 / G tokens each when G divides
// 128). Each key/value tile gathered into shared memory thus serves every query head that reads
// it, and a CTA's rows span few positions (little causal waste at the diagonal). Each warp owns
// 32 rows, two m16 tiles that share every K and V fragment it loads from shared memory (half the
// shared-memory reads per mma of one m16 tile a warp); Q stays in shared memory and its
// fragments are reloaded for each key tile, which leaves registers for the 32-row outputs. Key
// and value tiles of 64 rows are gathered from the paged cache with cp.async, two stages deep.
// S = Q·Kᵀ and O += P·V use mma.sync m16n8k16 (bf16 in, f32 accumulate); the S accumulators are
// repacked in registers as the A operand of P·V, and V's B operand comes from ldmatrix.trans.
// The softmax scale is applied inside the exponent (scale > 0). An FP8 cache is staged as e4m3
// bytes (two stages) and each tile widened (exactly, one instruction a pair) to one f16 K and one
// f16 V tile; Q is converted to f16 in place once, and both products run on f16 operands (the
// softmax weights, in [0, 1], lose less to f16 than to bf16).
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kBM = 128;       // query rows ((token, head) pairs) per CTA
constexpr int kWarpRows = 32;  // rows per warp: two m16 tiles
constexpr int kBN = 64;        // keys per tile
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kBM == kWarpRows * kThreads / 32, "the warps cover the CTA's rows");

// 2^x by the special function unit alone (exp2f adds a denormal fix-up to each): relative error
// about 2^-22, results below 2^-126 flushed to zero, 2^-inf = 0.
__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// m16n8k16 with f32 accumulators on bf16 operands, or on f16 ones (kHalf: the FP8 cache's tiles).
template <bool kHalf>
__device__ __forceinline__ void MmaOf(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                      uint32_t b1) {
  if constexpr (kHalf) {
    MmaF16(d, a, b0, b1);
  } else {
    Mma(d, a, b0, b1);
  }
}

// Widens a tile of kBN rows of e4m3 K and V (D bytes a row) to f16 tiles with rows of D + 8
// elements (exact), all threads of the CTA taking 16 values at a time. The caller synchronizes
// before and after.
template <int D>
__device__ __forceinline__ void WidenFp8TileToHalf(const uint8_t* rk, const uint8_t* rv, bf16* sk,
                                                   bf16* sv) {
  constexpr int kLd = D + 8;
  for (int c = threadIdx.x; c < kBN * (D / 16); c += kThreads) {
    const int r = c / (D / 16), cc = c % (D / 16);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint4 in = *reinterpret_cast<const uint4*>((t ? rv : rk) + r * D + cc * 16);
      const uint4 lo = {E4M3x2ToHalf2(in.x), E4M3x2ToHalf2<true>(in.x), E4M3x2ToHalf2(in.y),
                        E4M3x2ToHalf2<true>(in.y)};
      const uint4 hi = {E4M3x2ToHalf2(in.z), E4M3x2ToHalf2<true>(in.z), E4M3x2ToHalf2(in.w),
                        E4M3x2ToHalf2<true>(in.w)};
      uint4* dst = reinterpret_cast<uint4*>((t ? sv : sk) + r * kLd + cc * 16);
      dst[0] = lo;
      dst[1] = hi;
    }
  }
}

template <int D, bool kFp8>
constexpr int SmemBytes() {
  constexpr int kTile = kBN * (D + 8) * static_cast<int>(sizeof(bf16));
  return kBM * (D + 8) * static_cast<int>(sizeof(bf16)) +
         (kFp8 ? 2 * kTile + 4 * kBN * D : 4 * kTile);
}

template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads, 2) PrefillKernel(AttentionParams p) {
  constexpr int kLd = D + 8;  // padded rows: fragment loads of 8 rows hit 8 different banks
  constexpr int kChunks = D / 8;
  constexpr int kStages = kFp8 ? 1 : 2;  // bf16 stages of K (and of V)
  extern __shared__ uint4 smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + kBM * kLd;
  bf16* sv = sk + kStages * kBN * kLd;
  uint8_t* rk = reinterpret_cast<uint8_t*>(sv + kStages * kBN * kLd);  // FP8: two stages each
  uint8_t* rv = rk + 2 * kBN * D;
  WaitForPrerequisites();
  AllowDependents();

  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kvh = blockIdx.x / group;
  const int row0 = (blockIdx.x % group) * kBM;  // first row of this CTA in its tile's group
  const int tile = blockIdx.y;
  const int seq = p.tile_seq[tile];
  const int tok0 = p.tile_token[tile];
  const int tokens = min(kPrefillTileTokens, p.seq_token_end[seq] - tok0);
  const int valid = min(kBM, tokens * group - row0);  // rows of this CTA that exist
  if (valid <= 0) return;
  const int qpos0 = p.positions[tok0];
  const int window = static_cast<int>(p.sliding_window);
  const int k_hi = qpos0 + (row0 + valid - 1) / group + 1;  // keys [k_lo, k_hi)
  const int k_lo = window > 0 ? max(0, qpos0 + row0 / group - window + 1) : 0;
  const int kt_begin = k_lo / kBN, kt_end = (k_hi + kBN - 1) / kBN;
  const PagedRows paged(p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq,
                        static_cast<int>(p.block_size));
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  const bf16* k_cache = static_cast<const bf16*>(p.k_cache);
  const bf16* v_cache = static_cast<const bf16*>(p.v_cache);
  const bf16* q = static_cast<const bf16*>(p.q);

  for (int c = threadIdx.x; c < kBM * kChunks; c += kThreads) {
    const int r = c / kChunks, cc = c % kChunks;
    const bool fill = r < valid;
    const int t = (row0 + r) / group, hh = kvh * group + (row0 + r) % group;
    const bf16* src = fill ? q + (tok0 + t) * p.q_stride + hh * D + cc * 8 : q;
    CpAsync16(sq + r * kLd + cc * 8, src, fill);
  }
  // Each thread copies kCopies 16-byte chunks of K and of V a tile: chunk column cc of rows
  // rr + i * kRowStep. The rows' cache slots are looked up first, all together, so that the
  // block-table reads' latencies overlap.
  constexpr int kRowChunks = D * (kFp8 ? 1 : 2) / 16;  // 16-byte chunks a cache row
  constexpr int kRowStep = kThreads / kRowChunks;
  constexpr int kCopies = kBN / kRowStep;
  static_assert(kThreads % kRowChunks == 0 && kBN % kRowStep == 0, "copies tile the K/V tile");
  const int rr = threadIdx.x / kRowChunks, cc = threadIdx.x % kRowChunks;
  auto load_kv = [&](int kt, int buf) {
    int64_t off[kCopies];
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int j = kt * kBN + rr + i * kRowStep;
      off[i] = j < k_hi ? paged.Slot(j) * kv_dim + kvh * D + cc * (kFp8 ? 16 : 8) : -1;
    }
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int r = rr + i * kRowStep;
      const bool fill = off[i] >= 0;
      const int64_t o = fill ? off[i] : 0;
      if constexpr (kFp8) {
        const uint8_t* k8 = static_cast<const uint8_t*>(p.k_cache);
        const uint8_t* v8 = static_cast<const uint8_t*>(p.v_cache);
        CpAsync16(rk + (buf * kBN + r) * D + cc * 16, k8 + o, fill);
        CpAsync16(rv + (buf * kBN + r) * D + cc * 16, v8 + o, fill);
      } else {
        CpAsync16(sk + (buf * kBN + r) * kLd + cc * 8, k_cache + o, fill);
        CpAsync16(sv + (buf * kBN + r) * kLd + cc * 8, v_cache + o, fill);
      }
    }
  };
  load_kv(kt_begin, 0);
  CpAsyncCommit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int mat = lane >> 3;  // the 8x8 matrix whose row address this lane gives ldmatrix
  const int wrow0 = warp * kWarpRows;
  const bool warp_active = wrow0 < valid;
  // Positions of the warp's first and last existing rows, and of this thread's four rows
  // (m tile mt, row g or g + 8).
  const int warp_first = qpos0 + (row0 + wrow0) / group;
  const int warp_last = qpos0 + (row0 + min(wrow0 + kWarpRows, valid) - 1) / group;
  int qp[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    qp[mt][0] = qpos0 + (row0 + wrow0 + mt * 16 + g) / group;
    qp[mt][1] = qpos0 + (row0 + wrow0 + mt * 16 + g + 8) / group;
  }
  const bool capped = p.softcap > 0.0f;
  const float qk_scale = kFp8 ? p.scale * p.k_scale : p.scale;
  // Scores are kept unscaled (or, with softcap, capped and in log2 units); exponents are
  // s * sl - (running max) in log2 units.
  const float sl = capped ? 1.0f : qk_scale * kLog2e;
  const float cap_in = capped ? qk_scale / p.softcap : 0.0f;
  const float cap_out = capped ? p.softcap * kLog2e : 0.0f;

  float o[2][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  }
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
  float l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};

  // The softmax weights as the A operand of P·V, in the tiles' element type.
  auto Pack = [](float lo, float hi) { return kFp8 ? PackHalf(lo, hi) : PackBf16(lo, hi); };
  // Q's rows for ldmatrix: lanes 0-15 rows 0-15 at dims 0-7 of a k step, lanes 16-31 at 8-15.
  const bf16* qrow = sq + (wrow0 + (lane & 15)) * kLd + (lane >> 4) * 8;

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
      WidenFp8TileToHalf<D>(rk + buf * kBN * D, rv + buf * kBN * D, sk, sv);
      if (kt == kt_begin) {  // Q to f16 too, in place
        for (int c = threadIdx.x; c < kBM * kChunks; c += kThreads) {
          uint4* w = reinterpret_cast<uint4*>(sq + (c / kChunks) * kLd + (c % kChunks) * 8);
          uint4 v = *w;
          v.x = Bf16x2ToHalf2(v.x);
          v.y = Bf16x2ToHalf2(v.y);
          v.z = Bf16x2ToHalf2(v.z);
          v.w = Bf16x2ToHalf2(v.w);
          *w = v;
        }
      }
      __syncthreads();
      tb = 0;
    }
    const int key0 = kt * kBN;
    // Tiles wholly in this warp's causal future, or wholly before its window, contribute nothing.
    const bool skip =
        !warp_active || key0 > warp_last || (window > 0 && key0 + kBN - 1 <= warp_first - window);
    if (!skip) {
      const bf16* tk = sk + tb * kBN * kLd;
      const bf16* tv = sv + tb * kBN * kLd;
      float s[2][kBN / 8][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
          s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
        }
      }
      // One ldmatrix gives the K fragments of two n tiles for one k step: matrices (keys 0-7,
      // dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15).
      const bf16* krow = tk + ((mat >> 1) * 8 + (lane & 7)) * kLd + (mat & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[2][4];
        LdMatrixX4(a[0], qrow + kk * 16);
        LdMatrixX4(a[1], qrow + 16 * kLd + kk * 16);
#pragma unroll
        for (int np = 0; np < kBN / 16; ++np) {
          uint32_t b[4];
          LdMatrixX4(b, krow + np * 16 * kLd + kk * 16);
          MmaOf<kFp8>(s[0][2 * np], a[0], b[0], b[1]);
          MmaOf<kFp8>(s[1][2 * np], a[1], b[0], b[1]);
          MmaOf<kFp8>(s[0][2 * np + 1], a[0], b[2], b[3]);
          MmaOf<kFp8>(s[1][2 * np + 1], a[1], b[2], b[3]);
        }
      }
      // Masks only where a key of the tile can be out of reach of a row of this warp: the
      // causal diagonal, the window's edge.
      const bool need_mask =
          key0 + kBN - 1 > warp_first || (window > 0 && key0 <= warp_last - window);
      if (capped) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[mt][nt][i] = cap_out * tanhf(s[mt][nt][i] * cap_in);
          }
        }
      }
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int j = key0 + nt * 8 + c2 + (i & 1);
              const int qpr = qp[mt][i >> 1];
              if (j > qpr || (window > 0 && j <= qpr - window)) s[mt][nt][i] = -INFINITY;
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
          mx0 = fmaxf(mx0, fmaxf(s[mt][nt][0], s[mt][nt][1]));
          mx1 = fmaxf(mx1, fmaxf(s[mt][nt][2], s[mt][nt][3]));
        }
        const RowPairStep st =
            OnlineMaxStep(mx0 * sl, mx1 * sl, m[mt][0], m[mt][1], l[mt][0], l[mt][1]);
        // Outputs are rescaled only where a row's maximum grew (rare once a row has seen many
        // keys); the test is warp-uniform.
        if (__any_sync(0xffffffffu, st.corr0 != 1.0f || st.corr1 != 1.0f)) {
#pragma unroll
          for (int d = 0; d < D / 8; ++d) {
            o[mt][d][0] *= st.corr0;
            o[mt][d][1] *= st.corr0;
            o[mt][d][2] *= st.corr1;
            o[mt][d][3] *= st.corr1;
          }
        }
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
          s[mt][nt][0] = Exp2Approx(fmaf(s[mt][nt][0], sl, -st.b0));
          s[mt][nt][1] = Exp2Approx(fmaf(s[mt][nt][1], sl, -st.b0));
          s[mt][nt][2] = Exp2Approx(fmaf(s[mt][nt][2], sl, -st.b1));
          s[mt][nt][3] = Exp2Approx(fmaf(s[mt][nt][3], sl, -st.b1));
          l[mt][0] += s[mt][nt][0] + s[mt][nt][1];
          l[mt][1] += s[mt][nt][2] + s[mt][nt][3];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          a[mt][0] = Pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = Pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = Pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = Pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
        const bf16* vrow = tv + (kk * 16 + (mat & 1) * 8 + (lane & 7)) * kLd + (mat >> 1) * 8;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, vrow + dp * 16);
          MmaOf<kFp8>(o[0][2 * dp], a[0], b[0], b[1]);
          MmaOf<kFp8>(o[1][2 * dp], a[1], b[0], b[1]);
          MmaOf<kFp8>(o[0][2 * dp + 1], a[0], b[2], b[3]);
          MmaOf<kFp8>(o[1][2 * dp + 1], a[1], b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }

  const float v_scale = kFp8 ? p.v_scale : 1.0f;
  bf16* out = static_cast<bf16*>(p.out);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float sum = QuadSum(l[mt][hf]);
      const float inv = sum > 0.0f ? v_scale / sum : 0.0f;
      const int r = wrow0 + mt * 16 + hf * 8 + g;
      if (r >= valid) continue;
      const int t = (row0 + r) / group, hh = kvh * group + (row0 + r) % group;
      bf16* dst = out + (tok0 + t) * p.out_stride + hh * D + c2;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        *reinterpret_cast<__nv_bfloat162*>(dst + i * 8) =
            __floats2bfloat162_rn(o[mt][i][2 * hf] * inv, o[mt][i][2 * hf + 1] * inv);
      }
    }
  }
}

template <int D, bool kFp8>
cudaError_t Launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kSmem = SmemBytes<D, kFp8>();
  // Two CTAs an SM: all of the register file, and most of the unified L1 as shared memory.
  static const cudaError_t attr = [] {
    const cudaError_t e = cudaFuncSetAttribute(PrefillKernel<D, kFp8>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(PrefillKernel<D, kFp8>,
                                cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  }();
  if (attr != cudaSuccess) return attr;
  // x: the kv head and the part of its group's rows (num_heads CTAs in all); y: the tile, so
  // the host's longest-first tile order is the launch order.
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_tiles));
  return LaunchDependent(PrefillKernel<D, kFp8>, grid, kThreads, kSmem, stream, p);
}

}  // namespace

bool PrefillSupports(DType dtype, int64_t head_dim) {
  return dtype == DType::kBF16 && (head_dim == 64 || head_dim == 128);
}

int AttentionPrefill(const AttentionParams& p, void* stream) {
  if (p.num_tiles == 0) return 0;
  if (!PrefillSupports(p.dtype, p.head_dim) || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.kv_fp8) return p.head_dim == 64 ? Launch<64, true>(p, s) : Launch<128, true>(p, s);
  return p.head_dim == 64 ? Launch<64, false>(p, s) : Launch<128, false>(p, s);
}

}  // namespace dinfer::kernels::cuda
