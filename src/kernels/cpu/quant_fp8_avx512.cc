// AVX-512 row dequantization of the f8_e4m3_b32 and mxfp4 blocks (quant.h), selected by
// DequantizeRow when the active ISA is AVX-512: the element formats are table lookups done with
// lane permutes (16 e2m1 values fit one register; e4m3's 128 magnitudes take four two-register
// permutes and a blend). Results equal the portable decoders bit for bit.
#include <immintrin.h>

#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu::internal {

void DequantizeMxfp4Avx512(const BlockMxfp4* b, const float* e2m1, const float* e8m0, float* dst,
                           int64_t nb) {
  const __m512 lut = _mm512_loadu_ps(e2m1);
  // Element 2j comes from the low nibble of byte j, 2j + 1 from the high one.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i low4 = _mm512_set1_epi32(0xf);
  for (int64_t i = 0; i < nb; ++i) {
    const __m512 scale = _mm512_set1_ps(e8m0[b[i].e]);
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs)));
    const __m512 lo =
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(bytes, low4), lut), scale);
    const __m512 hi = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), lut), scale);
    _mm512_storeu_ps(dst + i * 32, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(dst + i * 32 + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

void DequantizeF8E4M3Avx512(const BlockF8E4M3B32* b, const float* e4m3, float* dst, int64_t nb) {
  __m512 t[8];
  for (int k = 0; k < 8; ++k) t[k] = _mm512_loadu_ps(e4m3 + 16 * k);  // magnitudes 0..127
  const __m512i mag_bits = _mm512_set1_epi32(0x7f);
  const __m512i sign_bit = _mm512_set1_epi32(0x80);
  for (int64_t i = 0; i < nb; ++i) {
    const __m512 scale = _mm512_set1_ps(b[i].d);
    for (int h = 0; h < 2; ++h) {
      const __m512i bytes =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16 * h)));
      const __m512i mag = _mm512_and_si512(bytes, mag_bits);
      // permutex2var uses the low 5 bits: one lookup per 32 magnitudes, picked by bits 5-6.
      __m512 v = _mm512_permutex2var_ps(t[0], mag, t[1]);
      const __m512i group = _mm512_srli_epi32(mag, 5);
      for (int g = 1; g < 4; ++g) {
        const __mmask16 in_group = _mm512_cmpeq_epi32_mask(group, _mm512_set1_epi32(g));
        v = _mm512_mask_blend_ps(in_group, v, _mm512_permutex2var_ps(t[2 * g], mag, t[2 * g + 1]));
      }
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(bytes, sign_bit), 24);
      v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
      _mm512_storeu_ps(dst + i * 32 + 16 * h, _mm512_mul_ps(v, scale));
    }
  }
}

}  // namespace dinfer::kernels::cpu::internal
