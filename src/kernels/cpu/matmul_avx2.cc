// AVX2 + FMA + F16C kernels. Same structure and activation formats as the AVX-512 kernels
// (see matmul_avx512.cc) with 256-bit registers and maddubs/madd integer dot products.
// The arithmetic for one output does not depend on how many rows are computed together.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace dinfer::kernels::cpu::internal {
namespace {

constexpr int kMaxRows = 4;
// Weights are streamed once per call (decode): prefetch this far ahead of the loads.
constexpr int64_t kPrefetchBytes = 2048;

inline void PrefetchLines(const uint8_t* p, int lines) {
  for (int i = 0; i < lines; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64 * i), _MM_HINT_T0);
  }
}

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline void Store(const Tile& t, int64_t r, int64_t j, float v) {
  float& out = t.y[r * t.y_stride + j];
  out = t.accumulate ? out + v : v;
}

// Sum of 8 floats in a fixed order.
inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int HSumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// u8 x s8 products, pairs summed to i16 (caller keeps them below 32768), then to i32 lanes.
inline __m256i MulSum(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// ---------------------------------------------------------------------------------------------
// Activation quantization (same arithmetic as QuantizeActRowReference).

inline float BlockAmax(const float* x, int n8) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n8; ++i)
    m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * i), abs_mask));
  const float amax = HMax(m);
  return amax >= kActTinyAmax ? amax : 0.0f;
}

// Quantizes 32 floats into 32 bytes in natural order; returns the four i32 vectors' sum lanes
// for 16-element halves in *sum_lo and *sum_hi.
inline __m256i Quantize32(const float* x, __m256 id, int* sum_lo, int* sum_hi) {
  const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
  const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
  const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
  const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
  *sum_lo = HSumI32(_mm256_add_epi32(q0, q1));
  *sum_hi = HSumI32(_mm256_add_epi32(q2, q3));
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
  return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void QuantizeActs(ActFormat format, const float* x, void* dst, int64_t k) {
  auto* base = static_cast<uint8_t*>(dst);
  if (format == ActFormat::kQ8x256) {
    const int64_t nsb = k / kQKK;
    auto* qs = reinterpret_cast<int8_t*>(base);
    uint8_t* d_section = base + RoundUp(k, 64);
    uint8_t* b_section = d_section + RoundUp(nsb * 4, 64);
    auto* d = reinterpret_cast<float*>(d_section);
    auto* bsums = reinterpret_cast<int16_t*>(b_section);
    std::memset(d_section + nsb * 4, 0, RoundUp(nsb * 4, 64) - nsb * 4);
    std::memset(b_section + k / 8, 0, RoundUp(k / 8, 64) - k / 8);
    for (int64_t i = 0; i < nsb; ++i) {
      const float* xb = x + i * kQKK;
      const float amax = BlockAmax(xb, 32);
      const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      d[i] = amax / 127.0f;
      for (int c = 0; c < 8; ++c) {
        int lo, hi;
        const __m256i q = Quantize32(xb + 32 * c, id, &lo, &hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + i * kQKK + 32 * c), q);
        bsums[i * 16 + 2 * c] = static_cast<int16_t>(lo);
        bsums[i * 16 + 2 * c + 1] = static_cast<int16_t>(hi);
      }
    }
    return;
  }
  const bool grouped = format == ActFormat::kQ8x32Grouped;
  const int64_t nb = k / kQK, nbp = RoundUp(nb, 16);
  auto* qs = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + nbp * kQK);
  float* s = d + nbp;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    const float amax = BlockAmax(xb, 4);
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    int lo_sum, hi_sum;
    const __m256i q = Quantize32(xb, id, &lo_sum, &hi_sum);
    if (grouped) {
      int8_t* lo = qs + (b / 4) * 128 + (b % 4) * 16;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo), _mm256_castsi256_si128(q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 64), _mm256_extracti128_si256(q, 1));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQK), q);
    }
    d[b] = amax / 127.0f;
    s[b] = d[b] * static_cast<float>(lo_sum + hi_sum);
  }
  if (nbp > nb) {
    if (grouped) {
      for (int64_t b = nb; b < nbp; ++b) {
        std::memset(qs + (b / 4) * 128 + (b % 4) * 16, 0, 16);
        std::memset(qs + (b / 4) * 128 + (b % 4) * 16 + 64, 0, 16);
      }
    } else {
      std::memset(qs + nb * kQK, 0, (nbp - nb) * kQK);
    }
    std::memset(d + nb, 0, (nbp - nb) * sizeof(float));
    std::memset(s + nb, 0, (nbp - nb) * sizeof(float));
  }
}

struct Acts32 {
  const int8_t* qs[kMaxRows];
  const float* d[kMaxRows];
  const float* s[kMaxRows];
};
template <int R>
Acts32 ViewActs32(const Tile& t, int64_t r0) {
  const int64_t nbp = RoundUp(t.k / kQK, 16);
  Acts32 a{};
  for (int r = 0; r < R; ++r) {
    const uint8_t* base = t.x + (r0 + r) * t.x_stride;
    a.qs[r] = reinterpret_cast<const int8_t*>(base);
    a.d[r] = reinterpret_cast<const float*>(base + nbp * kQK);
    a.s[r] = a.d[r] + nbp;
  }
  return a;
}
struct Acts256 {
  const int8_t* qs[kMaxRows];
  const float* d[kMaxRows];
  const int16_t* bsums[kMaxRows];
};
template <int R>
Acts256 ViewActs256(const Tile& t, int64_t r0) {
  const int64_t d_off = RoundUp(t.k, 64), b_off = d_off + RoundUp(t.k / kQKK * 4, 64);
  Acts256 a{};
  for (int r = 0; r < R; ++r) {
    const uint8_t* base = t.x + (r0 + r) * t.x_stride;
    a.qs[r] = reinterpret_cast<const int8_t*>(base);
    a.d[r] = reinterpret_cast<const float*>(base + d_off);
    a.bsums[r] = reinterpret_cast<const int16_t*>(base + b_off);
  }
  return a;
}

template <typename Kernel>
void RowGroups(const Tile& t) {
  for (int64_t r0 = 0; r0 < t.rows; r0 += kMaxRows) {
    switch (Min(kMaxRows, t.rows - r0)) {
      case 4:
        Kernel::template Run<4>(t, r0);
        break;
      case 3:
        Kernel::template Run<3>(t, r0);
        break;
      case 2:
        Kernel::template Run<2>(t, r0);
        break;
      default:
        Kernel::template Run<1>(t, r0);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// f32 / f16 / bf16 weights.

template <DType T>
inline __m256 LoadW8(const uint8_t* w) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    if constexpr (T == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType T, int R, int C>
void FloatKernel(const Tile& t, int64_t r0, int64_t c0) {
  constexpr int64_t kElem = T == DType::kF32 ? 4 : 2;
  const float* x[R];
  const uint8_t* w[C];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const float*>(t.x + (r0 + r) * t.x_stride);
  for (int c = 0; c < C; ++c) w[c] = t.w + (c0 + c) * t.w_stride;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= t.k; i += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x[r] + i);
    for (int c = 0; c < C; ++c) {
      if (i % 16 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(w[c] + i * kElem + kPrefetchBytes), _MM_HINT_T0);
      }
      const __m256 wv = LoadW8<T>(w[c] + i * kElem);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  if (i < t.k) {
    const int64_t rest = t.k - i;
    alignas(32) float xt[8];
    alignas(32) uint8_t wt[32];
    __m256 xv[R];
    for (int r = 0; r < R; ++r) {
      std::memset(xt, 0, sizeof(xt));
      std::memcpy(xt, x[r] + i, rest * sizeof(float));
      xv[r] = _mm256_load_ps(xt);
    }
    for (int c = 0; c < C; ++c) {
      std::memset(wt, 0, sizeof(wt));
      std::memcpy(wt, w[c] + i * kElem, rest * kElem);
      const __m256 wv = LoadW8<T>(wt);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) Store(t, r0 + r, c0 + c, HSum(acc[r][c]));
  }
}

template <DType T>
struct FloatRows {
  template <int R>
  static void Run(const Tile& t, int64_t r0) {
    constexpr int C = R <= 2 ? 4 : 2;
    int64_t c0 = 0;
    for (; c0 + C <= t.cols; c0 += C) FloatKernel<T, R, C>(t, r0, c0);
    for (; c0 < t.cols; ++c0) FloatKernel<T, R, 1>(t, r0, c0);
  }
};

// ---------------------------------------------------------------------------------------------
// Q4_0 / Q4_1 against kQ8x32Grouped activations, 8 blocks per step, 2 blocks per register.

// Permute indices into an 8-block scale vector: pair p takes blocks 2p (lanes 0..3) and 2p + 1
// (lanes 4..7); block b fills all lanes.
struct alignas(32) LaneTables {
  int32_t pair[4][8];
  int32_t block[8][8];
  constexpr LaneTables() : pair(), block() {
    for (int l = 0; l < 8; ++l) {
      for (int p = 0; p < 4; ++p) pair[p][l] = 2 * p + l / 4;
      for (int b = 0; b < 8; ++b) block[b][l] = b;
    }
  }
};
constexpr LaneTables kLanes;
inline __m256i PairLanes(int p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(kLanes.pair[p]));
}
inline __m256i BlockLanes(int b) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(kLanes.block[b]));
}

inline __m128i LoadDword(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtsi32_si128(v);
}

// f16 scales of 8 blocks: the dword at byte offset b * stride (low half d; high half m for
// Q4_1), zero for b >= nblk. Plain loads and unpacks: gathers are slow on several AVX2 CPUs.
inline void LoadScales(const uint8_t* p, int stride, int64_t nblk, __m256* d, __m256* m) {
  __m256i bits;
  if (nblk == 8) {
    const __m128i a01 = _mm_unpacklo_epi32(LoadDword(p), LoadDword(p + stride));
    const __m128i a23 = _mm_unpacklo_epi32(LoadDword(p + 2 * stride), LoadDword(p + 3 * stride));
    const __m128i a45 = _mm_unpacklo_epi32(LoadDword(p + 4 * stride), LoadDword(p + 5 * stride));
    const __m128i a67 = _mm_unpacklo_epi32(LoadDword(p + 6 * stride), LoadDword(p + 7 * stride));
    bits = _mm256_setr_m128i(_mm_unpacklo_epi64(a01, a23), _mm_unpacklo_epi64(a45, a67));
  } else {
    alignas(32) int32_t v[8] = {};
    for (int64_t b = 0; b < nblk; ++b) std::memcpy(&v[b], p + b * stride, 4);
    bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  }
  // [d0..d3 m0..m3 | d4..d7 m4..m7] -> [d0..d7 | m0..m7]
  const __m256i packed = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0xffff)),
                          _mm256_srli_epi32(bits, 16)),
      0xd8);
  *d = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
  *m = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
}

template <bool kQ4_1>
struct Q4Kernel {
  template <int R>
  static void Run(const Tile& t, int64_t r0) {
    constexpr int kBytes = kQ4_1 ? 20 : 18;
    constexpr int kQsOffset = kQ4_1 ? 4 : 2;
    const Acts32 a = ViewActs32<R>(t, r0);
    const int64_t nb = t.k / kQK;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t j = 0; j < t.cols; ++j) {
      const uint8_t* w = t.w + j * t.w_stride;
      // Two accumulator chains per row (even / odd pairs; the offset or min term joins the odd
      // one) so that the FMA latency does not bound the loop.
      __m256 facc[2][R];
      for (int r = 0; r < R; ++r) facc[0][r] = facc[1][r] = _mm256_setzero_ps();
      for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* p = w + b0 * kBytes;
        const int64_t nblk = Min(8, nb - b0);
        PrefetchLines(p, kBytes * 8 / 64 + 1);
        __m256 dw, mw;
        LoadScales(p, kBytes, nblk, &dw, &mw);
        __m256 scale[R];
        for (int r = 0; r < R; ++r) {
          scale[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(a.d[r] + b0));
          const __m256 m = kQ4_1 ? mw : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
          facc[1][r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(a.s[r] + b0), facc[1][r]);
        }
#pragma GCC unroll 4
        for (int pair = 0; pair < 4; ++pair) {
          if (2 * pair >= nblk) break;
          const uint8_t* pb = p + 2 * pair * kBytes + kQsOffset;
          const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb));
          const __m128i q1 = 2 * pair + 1 < nblk
                                 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + kBytes))
                                 : _mm_setzero_si128();
          const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
          const __m256i lo = _mm256_and_si256(q, m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          const __m256i pidx = PairLanes(pair);
          // Blocks b0 + 2 * pair, +1 sit in group (b0 + 2 * pair) / 4 at slot pair % 2.
          const int64_t off = (b0 + 2 * pair) / 4 * 128 + (pair % 2) * 32;
          for (int r = 0; r < R; ++r) {
            const int8_t* act = a.qs[r] + off;
            const __m256i p16 = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act))),
                _mm256_maddubs_epi16(
                    hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act + 64))));
            const __m256i acc = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
            facc[pair % 2][r] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_permutevar8x32_ps(scale[r], pidx),
                                facc[pair % 2][r]);
          }
        }
      }
      for (int r = 0; r < R; ++r) Store(t, r0 + r, j, HSum(_mm256_add_ps(facc[0][r], facc[1][r])));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q8_0 against kQ8x32 activations: |w| * (a with the sign of w), one block per register.

struct Q8_0Kernel {
  template <int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts32 a = ViewActs32<R>(t, r0);
    const int64_t nb = t.k / kQK;
    for (int64_t j = 0; j < t.cols; ++j) {
      const uint8_t* w = t.w + j * t.w_stride;
      __m256 facc[2][R];
      for (int r = 0; r < R; ++r) facc[0][r] = facc[1][r] = _mm256_setzero_ps();
      for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const uint8_t* p = w + b0 * 34;
        const int64_t nblk = Min(8, nb - b0);
        PrefetchLines(p, 5);
        __m256 dw, unused;
        LoadScales(p, 34, nblk, &dw, &unused);
        __m256 scale[R];
        for (int r = 0; r < R; ++r) scale[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(a.d[r] + b0));
#pragma GCC unroll 8
        for (int b = 0; b < 8; ++b) {
          if (b >= nblk) break;
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 34 * b + 2));
          const __m256i u = _mm256_sign_epi8(q, q);
          const __m256i bidx = BlockLanes(b);
          for (int r = 0; r < R; ++r) {
            const __m256i act =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs[r] + (b0 + b) * kQK));
            const __m256i acc = MulSum(u, _mm256_sign_epi8(act, q));
            facc[b % 2][r] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(acc), _mm256_permutevar8x32_ps(scale[r], bidx), facc[b % 2][r]);
          }
        }
      }
      for (int r = 0; r < R; ++r) Store(t, r0 + r, j, HSum(_mm256_add_ps(facc[0][r], facc[1][r])));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// K-quants against kQ8x256 activations.

// i16 lanes all equal to byte `i` of each 64-bit lane (zero high bytes).
inline __m256i ByteToI16Shuffle(int i) {
  return _mm256_set1_epi16(static_cast<int16_t>(0x8000 | i));
}

struct Q4_KKernel {
  template <int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts256 a = ViewActs256<R>(t, r0);
    const int64_t nsb = t.k / kQKK;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i mn_shuffle =
        _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5,
                         -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    for (int64_t j = 0; j < t.cols; ++j) {
      const auto* w = reinterpret_cast<const BlockQ4_K*>(t.w + j * t.w_stride);
      __m256 facc[R], macc[R];
      for (int r = 0; r < R; ++r) facc[r] = macc[r] = _mm256_setzero_ps();
      for (int64_t i = 0; i < nsb; ++i) {
        const BlockQ4_K& blk = w[i];
        PrefetchLines(reinterpret_cast<const uint8_t*>(&blk), 3);
        uint32_t u[3];
        std::memcpy(u, blk.scales, 12);
        const uint32_t sc_lo = u[0] & 0x3f3f3f3f;
        const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 2) & 0x30303030);
        const uint32_t mn_lo = u[1] & 0x3f3f3f3f;
        const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 2) & 0x30303030);
        const __m256i sc8 = _mm256_set1_epi64x(static_cast<int64_t>(sc_lo | uint64_t{sc_hi} << 32));
        const __m256i mn = _mm256_shuffle_epi8(
            _mm256_set1_epi64x(static_cast<int64_t>(mn_lo | uint64_t{mn_hi} << 32)), mn_shuffle);
        __m256i wq[8], sc[8];
        for (int c = 0; c < 4; ++c) {
          const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * c));
          wq[2 * c] = _mm256_and_si256(z, m4);
          wq[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
        }
        for (int s = 0; s < 8; ++s) sc[s] = _mm256_shuffle_epi8(sc8, ByteToI16Shuffle(s));
        const float d = HalfToFloat(blk.d), dmin = HalfToFloat(blk.dmin);
        for (int r = 0; r < R; ++r) {
          const int8_t* act = a.qs[r] + i * kQKK;
          __m256i acc = _mm256_setzero_si256();
          for (int s = 0; s < 8; ++s) {
            const __m256i prod = _mm256_maddubs_epi16(
                wq[s], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act + 32 * s)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, sc[s]));
          }
          const float da = a.d[r][i];
          facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d * da), facc[r]);
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums[r] + 16 * i));
          macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mn)),
                                    _mm256_set1_ps(dmin * da), macc[r]);
        }
      }
      for (int r = 0; r < R; ++r) Store(t, r0 + r, j, HSum(_mm256_sub_ps(facc[r], macc[r])));
    }
  }
};

struct Q6_KKernel {
  template <int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts256 a = ViewActs256<R>(t, r0);
    const int64_t nsb = t.k / kQKK;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int64_t j = 0; j < t.cols; ++j) {
      const auto* w = reinterpret_cast<const BlockQ6_K*>(t.w + j * t.w_stride);
      __m256 facc[R];
      for (int r = 0; r < R; ++r) facc[r] = _mm256_setzero_ps();
      for (int64_t i = 0; i < nsb; ++i) {
        const BlockQ6_K& blk = w[i];
        PrefetchLines(reinterpret_cast<const uint8_t*>(&blk), 4);
        __m256i wq[8];
        for (int h = 0; h < 2; ++h) {
          const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h));
          const __m256i ql1 =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h + 32));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h));
          wq[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
          wq[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
          wq[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                          _mm256_and_si256(qh, m30));
          wq[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        }
        // Scale vector of 32 elements (2 groups of 16): i16 lanes 0..7 scale 2s, 8..15 scale 2s+1,
        // sign-extended from a byte duplicated into both halves of each i16.
        const __m128i sc_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
        const __m256i sc_both = _mm256_broadcastsi128_si256(sc_bytes);
        __m256i sc[8];
        for (int s = 0; s < 8; ++s) {
          const __m256i sel = _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(2 * s)),
                                                _mm_set1_epi8(static_cast<char>(2 * s + 1)));
          sc[s] = _mm256_srai_epi16(_mm256_shuffle_epi8(sc_both, sel), 8);
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc_bytes);
        const float d = HalfToFloat(blk.d);
        for (int r = 0; r < R; ++r) {
          const int8_t* act = a.qs[r] + i * kQKK;
          __m256i acc = _mm256_setzero_si256();
          for (int s = 0; s < 8; ++s) {
            const __m256i prod = _mm256_maddubs_epi16(
                wq[s], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act + 32 * s)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, sc[s]));
          }
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums[r] + 16 * i));
          acc = _mm256_sub_epi32(acc, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
          facc[r] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d * a.d[r][i]), facc[r]);
        }
      }
      for (int r = 0; r < R; ++r) Store(t, r0 + r, j, HSum(facc[r]));
    }
  }
};

KernelSet MakeKernels() {
  KernelSet s;
  s.tile[static_cast<int>(DType::kF32)] = RowGroups<FloatRows<DType::kF32>>;
  s.tile[static_cast<int>(DType::kF16)] = RowGroups<FloatRows<DType::kF16>>;
  s.tile[static_cast<int>(DType::kBF16)] = RowGroups<FloatRows<DType::kBF16>>;
  s.tile[static_cast<int>(DType::kQ8_0)] = RowGroups<Q8_0Kernel>;
  s.tile[static_cast<int>(DType::kQ4_0)] = RowGroups<Q4Kernel<false>>;
  s.tile[static_cast<int>(DType::kQ4_1)] = RowGroups<Q4Kernel<true>>;
  s.tile[static_cast<int>(DType::kQ4_K)] = RowGroups<Q4_KKernel>;
  s.tile[static_cast<int>(DType::kQ6_K)] = RowGroups<Q6_KKernel>;
  s.quantize_acts = QuantizeActs;
  return s;
}

}  // namespace

const KernelSet& Avx2Kernels() {
  static const KernelSet kernels = MakeKernels();
  return kernels;
}

}  // namespace dinfer::kernels::cpu::internal
