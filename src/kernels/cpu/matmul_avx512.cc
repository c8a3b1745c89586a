// AVX-512 kernels (F, BW, VL, DQ; VNNI dot products where the CPU has them, else BW).
// Each kernel computes up to 4 activation rows against a range of weight rows; the arithmetic
// for one output does not depend on how many rows are computed together (batch invariance).

// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves, which
// -Wuninitialized reports at every use after inlining.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace dinfer::kernels::cpu::internal {
namespace {

constexpr int kMaxRows = 4;
// Weights are streamed once per call (decode): prefetching this far ahead of the loads lifts
// the bandwidth from L3 / DRAM by 10-25% over the hardware prefetchers alone.
constexpr int64_t kPrefetchBytes = 2048;

inline void PrefetchLines(const uint8_t* p, int lines) {
  for (int i = 0; i < lines; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64 * i), _MM_HINT_T0);
  }
}

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline __mmask64 ByteMask(int64_t bytes) {
  if (bytes <= 0) return 0;
  return bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1;
}
inline void Store(const Tile& t, int64_t r, int64_t j, float v) {
  float& out = t.y[r * t.y_stride + j];
  out = t.accumulate ? out + v : v;
}

// u8 x s8 dot products of 4-byte groups added to i32 lanes. Without VNNI the pair sums go through
// i16 (maddubs), so callers keep |u * s| * 2 below 32768.
template <bool kVnni>
inline __m512i Dpbusd(__m512i acc, __m512i u, __m512i s) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(acc, u, s);
  } else {
    return _mm512_add_epi32(acc,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
}
// i16 x i16 pair products added to i32 lanes.
template <bool kVnni>
inline __m512i Dpwssd(__m512i acc, __m512i a, __m512i b) {
  if constexpr (kVnni) {
    return _mm512_dpwssd_epi32(acc, a, b);
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
  }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization: the same arithmetic as QuantizeActRowReference (max of |x|,
// id = 127 / amax, x * id rounded to nearest even by cvtps2dq).

inline float BlockAmax(const float* x, int n16) {
  __m512 m = _mm512_setzero_ps();
  for (int i = 0; i < n16; ++i) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * i)));
  const float amax = _mm512_reduce_max_ps(m);
  return amax >= kActTinyAmax ? amax : 0.0f;
}

inline __m512i Quantize16(const float* x, __m512 id, int8_t* out) {
  const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), id));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(q));
  return q;
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
      const float amax = BlockAmax(xb, 16);
      const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      d[i] = amax / 127.0f;
      for (int g = 0; g < 16; ++g) {
        const __m512i q = Quantize16(xb + 16 * g, id, qs + i * kQKK + 16 * g);
        bsums[i * 16 + g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
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
    const float amax = BlockAmax(xb, 2);
    const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    int8_t* lo = qs + (grouped ? (b / 4) * 128 + (b % 4) * 16 : b * kQK);
    int8_t* hi = lo + (grouped ? 64 : 16);
    const __m512i q0 = Quantize16(xb, id, lo);
    const __m512i q1 = Quantize16(xb + 16, id, hi);
    d[b] = amax / 127.0f;
    s[b] = d[b] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
  if (nbp > nb) {
    if (grouped) {
      // Zero the unused slots of the last partial group and every group after it.
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

// Pointers into quantized activation rows (layouts in quant.h).
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

// Runs Kernel::Run<kVnni, R>(t, r0, j0, j1) over groups of up to 4 activation rows.
template <typename Kernel, bool kVnni>
void RowGroups(const Tile& t) {
  for (int64_t r0 = 0; r0 < t.rows; r0 += kMaxRows) {
    switch (Min(kMaxRows, t.rows - r0)) {
      case 4:
        Kernel::template Run<kVnni, 4>(t, r0);
        break;
      case 3:
        Kernel::template Run<kVnni, 3>(t, r0);
        break;
      case 2:
        Kernel::template Run<kVnni, 2>(t, r0);
        break;
      default:
        Kernel::template Run<kVnni, 1>(t, r0);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// f32 / f16 / bf16 weights: 16 elements per step, R x C accumulators, one horizontal sum each.

template <DType T>
inline __m512 LoadW16(const uint8_t* w, int64_t i, __mmask16 mask) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const uint16_t*>(w) + i);
    if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}
template <DType T>
inline __m512 LoadW16(const uint8_t* w, int64_t i) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(w) + i));
    if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType T, int R, int C>
void FloatKernel(const Tile& t, int64_t r0, int64_t c0) {
  const float* x[R];
  const uint8_t* w[C];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const float*>(t.x + (r0 + r) * t.x_stride);
  for (int c = 0; c < C; ++c) w[c] = t.w + (c0 + c) * t.w_stride;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= t.k; i += 16) {
    __m512 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x[r] + i);
    for (int c = 0; c < C; ++c) {
      constexpr int64_t kElem = T == DType::kF32 ? 4 : 2;
      _mm_prefetch(reinterpret_cast<const char*>(w[c] + i * kElem + kPrefetchBytes), _MM_HINT_T0);
      const __m512 wv = LoadW16<T>(w[c], i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  if (i < t.k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (t.k - i)) - 1);
    __m512 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x[r] + i);
    for (int c = 0; c < C; ++c) {
      const __m512 wv = LoadW16<T>(w[c], i, mask);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) Store(t, r0 + r, c0 + c, _mm512_reduce_add_ps(acc[r][c]));
  }
}

template <DType T>
struct FloatRows {
  template <bool, int R>
  static void Run(const Tile& t, int64_t r0) {
    constexpr int C = R == 1 ? 8 : 4;
    int64_t c0 = 0;
    for (; c0 + C <= t.cols; c0 += C) FloatKernel<T, R, C>(t, r0, c0);
    for (; c0 < t.cols; ++c0) FloatKernel<T, R, 1>(t, r0, c0);
  }
};

// ---------------------------------------------------------------------------------------------
// Q4_1 / Q4_0 weights against kQ8x32Grouped activations, 16 blocks (512 elements) per step.
// A register holds the nibbles of 4 blocks (lanes 4c..4c+3 = block c); its low and high nibbles
// meet the grouped activation bytes directly, so each i32 lane collects 8 elements of one block.
// Per-block scales are applied in f32 (lanes permuted from a 16-block scale vector).

// Permute indices: lane l of 4-block group g takes block 4g + l / 4 of a 16-block vector; lane l
// of pair p takes block 2p + l / 8.
struct alignas(64) LaneTables {
  int32_t group[4][16];
  int32_t pair[8][16];
  constexpr LaneTables() : group(), pair() {
    for (int l = 0; l < 16; ++l) {
      for (int g = 0; g < 4; ++g) group[g][l] = 4 * g + l / 4;
      for (int p = 0; p < 8; ++p) pair[p][l] = 2 * p + l / 8;
    }
  }
};
constexpr LaneTables kLanes;
inline __m512i GroupLanes(int g) { return _mm512_load_si512(kLanes.group[g]); }
inline __m512i PairLanes(int p) { return _mm512_load_si512(kLanes.pair[p]); }

// Q4_1 blocks are 20 bytes (5 dwords): a 16-block step is 5 registers z[0..4], and dword
// permutes extract both the nibbles (group g from z[g], z[g+1]) and the d|m pairs.
struct alignas(64) Q4_1Tables {
  int32_t nib[4][16];
  int32_t dm01[16], dm23[16], dm4[16];
  constexpr Q4_1Tables() : nib(), dm01(), dm23(), dm4() {
    for (int l = 0; l < 16; ++l) {
      for (int g = 0; g < 4; ++g) nib[g][l] = 5 * (4 * g + l / 4) + 1 + l % 4 - 16 * g;
      dm01[l] = l <= 6 ? 5 * l : 0;
      dm23[l] = l >= 7 && l <= 12 ? 5 * l - 32 : 0;
      dm4[l] = l >= 13 ? 5 * l - 64 : 0;
    }
  }
};
constexpr Q4_1Tables kQ4_1;

struct Q4_1Kernel {
  // One step of up to 16 blocks at p (nblk < 16 only for the last step of a row).
  template <bool kVnni, int R, bool kFull>
  static inline __attribute__((always_inline)) void Step(const uint8_t* p, int64_t nblk,
                                                         const Acts32& a, int64_t b0,
                                                         __m512 (&facc)[2][R], __m512 (&macc)[R]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if constexpr (kFull) PrefetchLines(p, 5);
    __m512i z[5];
#pragma GCC unroll 5
    for (int i = 0; i < 5; ++i) {
      if constexpr (kFull) {
        z[i] = _mm512_loadu_si512(p + 64 * i);
      } else {
        z[i] = _mm512_maskz_loadu_epi8(ByteMask(nblk * 20 - 64 * i), p + 64 * i);
      }
    }
    __m512i dm = _mm512_permutex2var_epi32(z[0], _mm512_load_si512(kQ4_1.dm01), z[1]);
    if (kFull || nblk > 7) {
      dm = _mm512_mask_mov_epi32(
          dm, 0x1f80, _mm512_permutex2var_epi32(z[2], _mm512_load_si512(kQ4_1.dm23), z[3]));
    }
    if (kFull || nblk > 13) {
      dm = _mm512_mask_permutexvar_epi32(dm, 0xe000, _mm512_load_si512(kQ4_1.dm4), z[4]);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
    __m512 scale[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      scale[r] = _mm512_mul_ps(dw, _mm512_loadu_ps(a.d[r] + b0));
      macc[r] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a.s[r] + b0), macc[r]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      if (!kFull && 4 * g >= nblk) break;
      const __m512i q = _mm512_permutex2var_epi32(z[g], _mm512_load_si512(kQ4_1.nib[g]), z[g + 1]);
      const __m512i lo = _mm512_and_si512(q, m4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* act = a.qs[r] + (b0 + 4 * g) * kQK;
        __m512i acc = Dpbusd<kVnni>(_mm512_setzero_si512(), lo, _mm512_loadu_si512(act));
        acc = Dpbusd<kVnni>(acc, hi, _mm512_loadu_si512(act + 64));
        facc[g % 2][r] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(GroupLanes(g), scale[r]),
                            facc[g % 2][r]);
      }
    }
  }

  template <bool kVnni, int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts32 a = ViewActs32<R>(t, r0);
    const int64_t nb = t.k / kQK;
    const int64_t full = nb / 16 * 16;
    for (int64_t j = 0; j < t.cols; ++j) {
      const uint8_t* w = t.w + j * t.w_stride;
      __m512 facc[2][R], macc[R];
      for (int r = 0; r < R; ++r) facc[0][r] = facc[1][r] = macc[r] = _mm512_setzero_ps();
      for (int64_t b0 = 0; b0 < full; b0 += 16) {
        Step<kVnni, R, true>(w + b0 * 20, 16, a, b0, facc, macc);
      }
      if (full < nb) Step<kVnni, R, false>(w + full * 20, nb - full, a, full, facc, macc);
      for (int r = 0; r < R; ++r) {
        const __m512 total = _mm512_add_ps(_mm512_add_ps(facc[0][r], facc[1][r]), macc[r]);
        Store(t, r0 + r, j, _mm512_reduce_add_ps(total));
      }
    }
  }
};

// Q4_0 blocks are 18 bytes, so the nibbles of a group are loaded block by block and the f16
// scales gathered. value = (nibble - 8) * d: the -8 is applied through the activation sums.
struct Q4_0Kernel {
  template <bool kVnni, int R, bool kFull>
  static inline __attribute__((always_inline)) void Step(const uint8_t* p, int64_t nblk,
                                                         const Acts32& a, int64_t b0,
                                                         __m512 (&facc)[2][R], __m512 (&macc)[R]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i d_offsets =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(18));
    if constexpr (kFull) PrefetchLines(p, 5);
    const __mmask16 valid = kFull ? 0xffff : static_cast<__mmask16>((1u << nblk) - 1);
    const __m512i dbits =
        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, d_offsets, p, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dbits));
    __m512 scale[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      scale[r] = _mm512_mul_ps(dw, _mm512_loadu_ps(a.d[r] + b0));
      macc[r] = _mm512_fmadd_ps(dw, _mm512_loadu_ps(a.s[r] + b0), macc[r]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      if (!kFull && 4 * g >= nblk) break;
      const uint8_t* pg = p + 4 * g * 18 + 2;
      __m512i q = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        if (!kFull && 4 * g + c >= nblk) break;
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pg + 18 * c));
        q = c == 0 ? _mm512_castsi128_si512(v) : _mm512_inserti32x4(q, v, c);
      }
      const __m512i lo = _mm512_and_si512(q, m4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* act = a.qs[r] + (b0 + 4 * g) * kQK;
        __m512i acc = Dpbusd<kVnni>(_mm512_setzero_si512(), lo, _mm512_loadu_si512(act));
        acc = Dpbusd<kVnni>(acc, hi, _mm512_loadu_si512(act + 64));
        facc[g % 2][r] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(GroupLanes(g), scale[r]),
                            facc[g % 2][r]);
      }
    }
  }

  template <bool kVnni, int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts32 a = ViewActs32<R>(t, r0);
    const int64_t nb = t.k / kQK;
    const int64_t full = nb / 16 * 16;
    for (int64_t j = 0; j < t.cols; ++j) {
      const uint8_t* w = t.w + j * t.w_stride;
      __m512 facc[2][R], macc[R];
      for (int r = 0; r < R; ++r) facc[0][r] = facc[1][r] = macc[r] = _mm512_setzero_ps();
      for (int64_t b0 = 0; b0 < full; b0 += 16) {
        Step<kVnni, R, true>(w + b0 * 18, 16, a, b0, facc, macc);
      }
      if (full < nb) Step<kVnni, R, false>(w + full * 18, nb - full, a, full, facc, macc);
      for (int r = 0; r < R; ++r) {
        __m512 total = _mm512_add_ps(facc[0][r], facc[1][r]);
        total = _mm512_fmadd_ps(macc[r], _mm512_set1_ps(-8.0f), total);
        Store(t, r0 + r, j, _mm512_reduce_add_ps(total));
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q8_0 weights against kQ8x32 activations: two blocks per register. With VNNI the signed weights
// are offset by 128 (xor 0x80) to feed vpdpbusd and the offset is removed through the
// activation sums; without VNNI the sign moves onto the activations (|w| * ±a).

struct Q8_0Kernel {
  template <bool kVnni, int R, bool kFull>
  static inline __attribute__((always_inline)) void Step(const uint8_t* p, int64_t nblk,
                                                         const Acts32& a, int64_t b0,
                                                         __m512 (&facc)[2][R], __m512 (&macc)[R]) {
    const __m512i d_offsets =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(34));
    if constexpr (kFull) PrefetchLines(p, 9);
    const __mmask16 valid = kFull ? 0xffff : static_cast<__mmask16>((1u << nblk) - 1);
    const __m512i dbits =
        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, d_offsets, p, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dbits));
    __m512 scale[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      scale[r] = _mm512_mul_ps(dw, _mm512_loadu_ps(a.d[r] + b0));
      if constexpr (kVnni) macc[r] = _mm512_fmadd_ps(dw, _mm512_loadu_ps(a.s[r] + b0), macc[r]);
    }
#pragma GCC unroll 8
    for (int pair = 0; pair < 8; ++pair) {
      if (!kFull && 2 * pair >= nblk) break;
      const uint8_t* pb = p + 2 * pair * 34 + 2;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb));
      const __m256i w1 = kFull || 2 * pair + 1 < nblk
                             ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 34))
                             : _mm256_setzero_si256();
      const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
      const __m512i pidx = PairLanes(pair);
      if constexpr (kVnni) {
        const __m512i u = _mm512_xor_si512(q, _mm512_set1_epi8(static_cast<char>(0x80)));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512i act = _mm512_loadu_si512(a.qs[r] + (b0 + 2 * pair) * kQK);
          const __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, act);
          facc[pair % 2][r] = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(pidx, scale[r]), facc[pair % 2][r]);
        }
      } else {
        const __m512i u = _mm512_abs_epi8(q);
        const __mmask64 neg = _mm512_movepi8_mask(q);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512i act = _mm512_loadu_si512(a.qs[r] + (b0 + 2 * pair) * kQK);
          const __m512i sa = _mm512_mask_sub_epi8(act, neg, _mm512_setzero_si512(), act);
          const __m512i acc = Dpbusd<false>(_mm512_setzero_si512(), u, sa);
          facc[pair % 2][r] = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(pidx, scale[r]), facc[pair % 2][r]);
        }
      }
    }
  }

  template <bool kVnni, int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts32 a = ViewActs32<R>(t, r0);
    const int64_t nb = t.k / kQK;
    const int64_t full = nb / 16 * 16;
    for (int64_t j = 0; j < t.cols; ++j) {
      const uint8_t* w = t.w + j * t.w_stride;
      __m512 facc[2][R], macc[R];
      for (int r = 0; r < R; ++r) facc[0][r] = facc[1][r] = macc[r] = _mm512_setzero_ps();
      for (int64_t b0 = 0; b0 < full; b0 += 16) {
        Step<kVnni, R, true>(w + b0 * 34, 16, a, b0, facc, macc);
      }
      if (full < nb) Step<kVnni, R, false>(w + full * 34, nb - full, a, full, facc, macc);
      for (int r = 0; r < R; ++r) {
        __m512 total = _mm512_add_ps(facc[0][r], facc[1][r]);
        if constexpr (kVnni) total = _mm512_fmadd_ps(macc[r], _mm512_set1_ps(-128.0f), total);
        Store(t, r0 + r, j, _mm512_reduce_add_ps(total));
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// K-quants against kQ8x256 activations. Products go u8 x s8 -> i16 pairs (maddubs), then times
// the integer sub-block scales into i32 (vpdpwssd / madd), one f32 scale per super-block.

// Bytes 0..7 of each 64-bit lane hold the 8 scales; i16 lanes 0..15 get scale 2c, 16..31 2c+1.
inline __m512i Q4KScaleShuffle(int c) {
  alignas(64) int8_t v[64];
  for (int i = 0; i < 64; ++i)
    v[i] = (i % 2 == 1) ? static_cast<int8_t>(0x80) : (i < 32 ? 2 * c : 2 * c + 1);
  return _mm512_load_si512(v);
}

struct Q4_KKernel {
  template <bool kVnni, int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts256 a = ViewActs256<R>(t, r0);
    const int64_t nsb = t.k / kQKK;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shift04 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i sc_shuffle[4] = {Q4KScaleShuffle(0), Q4KScaleShuffle(1), Q4KScaleShuffle(2),
                                   Q4KScaleShuffle(3)};
    // i16 lane l of the mins vector takes min l / 2 (pairs of 16-element sums form a sub-block).
    const __m256i mn_shuffle =
        _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5,
                         -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    for (int64_t j = 0; j < t.cols; ++j) {
      const auto* w = reinterpret_cast<const BlockQ4_K*>(t.w + j * t.w_stride);
      __m512 facc[R];
      __m256 macc[R];
      for (int r = 0; r < R; ++r) {
        facc[r] = _mm512_setzero_ps();
        macc[r] = _mm256_setzero_ps();
      }
      for (int64_t i = 0; i < nsb; ++i) {
        const BlockQ4_K& blk = w[i];
        PrefetchLines(reinterpret_cast<const uint8_t*>(&blk), 3);
        uint32_t u[3];
        std::memcpy(u, blk.scales, 12);
        const uint32_t sc_lo = u[0] & 0x3f3f3f3f;
        const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 2) & 0x30303030);
        const uint32_t mn_lo = u[1] & 0x3f3f3f3f;
        const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 2) & 0x30303030);
        const __m512i sc8 = _mm512_set1_epi64(static_cast<int64_t>(sc_lo | uint64_t{sc_hi} << 32));
        const __m256i mn = _mm256_shuffle_epi8(
            _mm256_set1_epi64x(static_cast<int64_t>(mn_lo | uint64_t{mn_hi} << 32)), mn_shuffle);
        __m512i wq[4], sc[4];
        for (int c = 0; c < 4; ++c) {
          const __m512i z = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * c)));
          wq[c] = _mm512_and_si512(_mm512_srlv_epi16(z, shift04), m4);
          sc[c] = _mm512_shuffle_epi8(sc8, sc_shuffle[c]);
        }
        const float d = HalfToFloat(blk.d), dmin = HalfToFloat(blk.dmin);
        for (int r = 0; r < R; ++r) {
          const int8_t* act = a.qs[r] + i * kQKK;
          __m512i acc = _mm512_setzero_si512();
          for (int c = 0; c < 4; ++c) {
            const __m512i prod = _mm512_maddubs_epi16(wq[c], _mm512_loadu_si512(act + 64 * c));
            acc = Dpwssd<kVnni>(acc, prod, sc[c]);
          }
          const float da = a.d[r][i];
          facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(d * da), facc[r]);
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums[r] + 16 * i));
          macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mn)),
                                    _mm256_set1_ps(dmin * da), macc[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 mins = _mm512_insertf32x8(_mm512_setzero_ps(), macc[r], 0);
        Store(t, r0 + r, j, _mm512_reduce_add_ps(_mm512_sub_ps(facc[r], mins)));
      }
    }
  }
};

// Q6_K: 6-bit values rebuilt from 4 low bits (ql) and 2 high bits (qh) in natural order, offset
// by +32 so they are unsigned; the -32 goes through the activation sums per 16 elements.
struct Q6_KKernel {
  template <bool kVnni, int R>
  static void Run(const Tile& t, int64_t r0) {
    const Acts256 a = ViewActs256<R>(t, r0);
    const int64_t nsb = t.k / kQKK;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i shl42 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr02 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512i sc_idx[4];
    for (int v = 0; v < 4; ++v) {
      alignas(64) int16_t idx[32];
      for (int l = 0; l < 32; ++l) idx[l] = static_cast<int16_t>(4 * v + l / 8);
      sc_idx[v] = _mm512_load_si512(idx);
    }
    for (int64_t j = 0; j < t.cols; ++j) {
      const auto* w = reinterpret_cast<const BlockQ6_K*>(t.w + j * t.w_stride);
      __m512 facc[R];
      for (int r = 0; r < R; ++r) facc[r] = _mm512_setzero_ps();
      for (int64_t i = 0; i < nsb; ++i) {
        const BlockQ6_K& blk = w[i];
        PrefetchLines(reinterpret_cast<const uint8_t*>(&blk), 4);
        __m512i wq[4];
        for (int h = 0; h < 2; ++h) {
          const __m512i ql = _mm512_loadu_si512(blk.ql + 64 * h);
          const __m512i qh = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h)));
          wq[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                      _mm512_and_si512(_mm512_sllv_epi16(qh, shl42), m30));
          wq[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, shr02), m30));
        }
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
        __m512i sc[4];
        for (int v = 0; v < 4; ++v) {
          sc[v] = _mm512_permutexvar_epi16(sc_idx[v], _mm512_castsi256_si512(sc16));
        }
        const float d = HalfToFloat(blk.d);
        for (int r = 0; r < R; ++r) {
          const int8_t* act = a.qs[r] + i * kQKK;
          __m512i acc = _mm512_setzero_si512();
          for (int v = 0; v < 4; ++v) {
            const __m512i prod = _mm512_maddubs_epi16(wq[v], _mm512_loadu_si512(act + 64 * v));
            acc = Dpwssd<kVnni>(acc, prod, sc[v]);
          }
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums[r] + 16 * i));
          const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
          acc = _mm512_sub_epi32(acc, _mm512_zextsi256_si512(corr));
          facc[r] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(d * a.d[r][i]), facc[r]);
        }
      }
      for (int r = 0; r < R; ++r) Store(t, r0 + r, j, _mm512_reduce_add_ps(facc[r]));
    }
  }
};

template <bool kVnni>
KernelSet MakeKernels() {
  KernelSet s;
  s.tile[static_cast<int>(DType::kF32)] = RowGroups<FloatRows<DType::kF32>, kVnni>;
  s.tile[static_cast<int>(DType::kF16)] = RowGroups<FloatRows<DType::kF16>, kVnni>;
  s.tile[static_cast<int>(DType::kBF16)] = RowGroups<FloatRows<DType::kBF16>, kVnni>;
  s.tile[static_cast<int>(DType::kQ8_0)] = RowGroups<Q8_0Kernel, kVnni>;
  s.tile[static_cast<int>(DType::kQ4_0)] = RowGroups<Q4_0Kernel, kVnni>;
  s.tile[static_cast<int>(DType::kQ4_1)] = RowGroups<Q4_1Kernel, kVnni>;
  s.tile[static_cast<int>(DType::kQ4_K)] = RowGroups<Q4_KKernel, kVnni>;
  s.tile[static_cast<int>(DType::kQ6_K)] = RowGroups<Q6_KKernel, kVnni>;
  s.quantize_acts = QuantizeActs;
  return s;
}

}  // namespace

const KernelSet& Avx512Kernels(bool vnni) {
  static const KernelSet with_vnni = MakeKernels<true>();
  static const KernelSet without_vnni = MakeKernels<false>();
  return vnni ? with_vnni : without_vnni;
}

}  // namespace dinfer::kernels::cpu::internal
