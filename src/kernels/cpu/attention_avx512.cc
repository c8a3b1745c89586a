// AVX-512 paged attention kernel: 16 keys per step. See attention.cc for the tiling, the chunked
// online softmax and why each row's result is independent of the batch (batch invariance).
//
// Scores: for each row, 16 accumulators (one per key) gather lane-wise products q·k over the head
// dims, then a fixed shuffle tree sums each accumulator's lanes into lane j of one vector; the
// arithmetic of a score depends on nothing but q, k and head_dim. Values: per row, the head dims
// are in lanes and each key adds p·v with a broadcast probability.
// This file must not call inline functions of shared headers (see matmul_internal.h).

// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves, which
// -Wuninitialized reports at every use after inlining.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace dinfer::kernels::cpu::attention_internal {

void AttentionTileAvx512(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                         int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                         int64_t num_chunks, float* partials, float* scratch);
void AttentionCombineAvx512(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0,
                            int64_t h1, int64_t num_chunks, const float* partials, float* scratch);

namespace {

constexpr int kKeys = 16;
constexpr float kNegInf = -__builtin_inff();

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }

// e^x, within 1 ulp; exactly 0 below -87.33 (including -inf) and exactly 1 at 0.
inline __m512 Exp(__m512 x) {
  const __m512 min_x = _mm512_set1_ps(-87.33654f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, min_x, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, min_x), _mm512_set1_ps(88.0f));
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split in a short high part and the rest.
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  // Taylor series of e^r to degree 7 (truncation error below 4e-9 relative).
  __m512 y = _mm512_set1_ps(1.0f / 5040.0f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 720.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(y, n));
}

inline float ExpScalar(float x) { return _mm512_cvtss_f32(Exp(_mm512_set1_ps(x))); }

// tanh(x): odd Taylor series below |x| = 0.4, (1 - e^-2|x|) / (1 + e^-2|x|) above.
inline __m512 Tanh(__m512 x) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 a = _mm512_andnot_ps(sign, x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 s = _mm512_set1_ps(21844.0f / 6081075.0f);
  s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(-1382.0f / 155925.0f));
  s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(62.0f / 2835.0f));
  s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(-17.0f / 315.0f));
  s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(2.0f / 15.0f));
  s = _mm512_fmadd_ps(s, x2, _mm512_set1_ps(-1.0f / 3.0f));
  s = _mm512_fmadd_ps(_mm512_mul_ps(s, x2), x, x);
  const __m512 e = Exp(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 l = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  l = _mm512_or_ps(l, _mm512_and_ps(sign, x));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.4f), _CMP_LT_OQ), l, s);
}

// Lane j of the result is a[j]'s lanes combined by `op` in a fixed tree: lanes l and l + 8,
// then l and l + 4, then l and l + 2, then l and l + 1.
template <__m512 (*op)(__m512, __m512)>
inline __m512 ReduceLanes16(const __m512* a) {
  __m512 w[8];
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) {
    const int j = (i & 3) + (i & 4) * 2;  // pairs (j, j + 4) for j in 0..3 and 8..11
    w[i] =
        op(_mm512_shuffle_f32x4(a[j], a[j + 4], 0x44), _mm512_shuffle_f32x4(a[j], a[j + 4], 0xEE));
  }
  __m512 z[4];
#pragma GCC unroll 16
  for (int m = 0; m < 4; ++m) {  // 128-bit chunk k of z[m]: key 4k + m
    z[m] =
        op(_mm512_shuffle_f32x4(w[m], w[m + 4], 0x88), _mm512_shuffle_f32x4(w[m], w[m + 4], 0xDD));
  }
  const __m512 u0 = op(_mm512_shuffle_ps(z[0], z[1], 0x44), _mm512_shuffle_ps(z[0], z[1], 0xEE));
  const __m512 u1 = op(_mm512_shuffle_ps(z[2], z[3], 0x44), _mm512_shuffle_ps(z[2], z[3], 0xEE));
  return op(_mm512_shuffle_ps(u0, u1, 0x88), _mm512_shuffle_ps(u0, u1, 0xDD));
}

inline __m512 Add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __m512 MaxOf(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }

inline __mmask16 VecMask(int64_t index, int64_t nd, __mmask16 tail) {
  return index < nd - 1 ? __mmask16{0xFFFF} : (index == nd - 1 ? tail : __mmask16{0});
}

// Scores of one query row against 16 keys (unscaled dot products), head dims taken NB vectors
// at a time. kMasked: loads through masks (head_dim % 16 != 0 or nd % NB != 0).
template <int NB, bool kMasked>
__m512 RowScores(const float* q, const float* const* kp, int64_t offset, int64_t nd,
                 __mmask16 tail) {
  __m512 a[kKeys];
#pragma GCC unroll 16
  for (int j = 0; j < kKeys; ++j) a[j] = _mm512_setzero_ps();
  for (int64_t ib = 0; ib < nd; ib += NB) {
    __m512 qv[NB];
    __mmask16 m[NB];
#pragma GCC unroll 8
    for (int i = 0; i < NB; ++i) {
      m[i] = kMasked ? VecMask(ib + i, nd, tail) : __mmask16{0xFFFF};
      qv[i] = kMasked ? _mm512_maskz_loadu_ps(m[i], q + 16 * (ib + i))
                      : _mm512_loadu_ps(q + 16 * (ib + i));
    }
#pragma GCC unroll 16
    for (int j = 0; j < kKeys; ++j) {
      const float* k = kp[j] + offset + 16 * ib;
#pragma GCC unroll 8
      for (int i = 0; i < NB; ++i) {
        const __m512 kv =
            kMasked ? _mm512_maskz_loadu_ps(m[i], k + 16 * i) : _mm512_loadu_ps(k + 16 * i);
        a[j] = _mm512_fmadd_ps(qv[i], kv, a[j]);
      }
    }
  }
  return ReduceLanes16<Add>(a);
}

using ScoresFn = __m512 (*)(const float*, const float* const*, int64_t, int64_t, __mmask16);

template <bool kMasked>
ScoresFn PickScores(int64_t nd) {
  switch (nd) {
    case 1:
      return RowScores<1, kMasked>;
    case 2:
      return RowScores<2, kMasked>;
    case 3:
      return RowScores<3, kMasked>;
    case 4:
      return RowScores<4, kMasked>;
    case 5:
      return RowScores<5, kMasked>;
    case 6:
      return RowScores<6, kMasked>;
    case 7:
      return RowScores<7, kMasked>;
    default:
      return RowScores<8, kMasked>;
  }
}

ScoresFn PickScores(int64_t head_dim) {
  const int64_t nd = (head_dim + 15) / 16;
  const bool masked = head_dim % 16 != 0 || (nd > 8 && nd % 8 != 0);
  return masked ? PickScores<true>(nd) : PickScores<false>(nd);
}

// acc[r] = acc[r] * alpha[r] + sum over keys j in [j0, j1] of prob[r][j] * v_j, for R rows and
// the DV head-dim vectors from vector d0.
template <int R, int DV>
void PvBlock(float* acc, int64_t acc_stride, const float* prob, const float* alpha,
             const float* const* vp, int64_t offset, int64_t j0, int64_t j1, int64_t d0, int64_t nd,
             __mmask16 tail) {
  __mmask16 m[DV];
#pragma GCC unroll 16
  for (int x = 0; x < DV; ++x) m[x] = VecMask(d0 + x, nd, tail);
  __m512 c[R][DV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 16
    for (int x = 0; x < DV; ++x) {
      c[r][x] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * acc_stride + 16 * (d0 + x)), a);
    }
  }
  for (int64_t j = j0; j <= j1; ++j) {
    const float* v = vp[j] + offset + 16 * d0;
    __m512 vv[DV];
#pragma GCC unroll 16
    for (int x = 0; x < DV; ++x) vv[x] = _mm512_maskz_loadu_ps(m[x], v + 16 * x);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(prob[r * kKeys + j]);
#pragma GCC unroll 16
      for (int x = 0; x < DV; ++x) c[r][x] = _mm512_fmadd_ps(pr, vv[x], c[r][x]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int x = 0; x < DV; ++x) _mm512_storeu_ps(acc + r * acc_stride + 16 * (d0 + x), c[r][x]);
  }
}

using PvFn = void (*)(float*, int64_t, const float*, const float*, const float* const*, int64_t,
                      int64_t, int64_t, int64_t, int64_t, __mmask16);
constexpr int kPvRows = 6, kPvVecs = 4;

template <int R>
PvFn PickPv(int64_t dv) {
  switch (dv) {
    case 1:
      return PvBlock<R, 1>;
    case 2:
      return PvBlock<R, 2>;
    case 3:
      return PvBlock<R, 3>;
    default:
      return PvBlock<R, 4>;
  }
}

PvFn PickPv(int64_t rows, int64_t dv) {
  switch (rows) {
    case 1:
      return PickPv<1>(dv);
    case 2:
      return PickPv<2>(dv);
    case 3:
      return PickPv<3>(dv);
    case 4:
      return PickPv<4>(dv);
    case 5:
      return PickPv<5>(dv);
    default:
      return PickPv<6>(dv);
  }
}

// Folds a chunk's state (m, l, acc) into the running one (fm, fl, facc), dp floats each.
inline void Fold(float* fm, float* fl, float* facc, float m, float l, const float* acc,
                 int64_t dp) {
  if (m == kNegInf) return;
  if (*fm == kNegInf) {
    *fm = m;
    *fl = l;
    std::memcpy(facc, acc, sizeof(float) * dp);
    return;
  }
  const float nm = *fm > m ? *fm : m;
  const float a = ExpScalar(*fm - nm), b = ExpScalar(m - nm);
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t i = 0; i < dp; i += 16) {
    const __m512 f = _mm512_mul_ps(_mm512_loadu_ps(facc + i), va);
    _mm512_storeu_ps(facc + i, _mm512_fmadd_ps(_mm512_loadu_ps(acc + i), vb, f));
  }
  *fl = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(l), _mm_set_ss(b), _mm_set_ss(*fl * a)));
  *fm = nm;
}

inline void WriteOut(float* out, const float* facc, float fl, int64_t d) {
  const __m512 vl = _mm512_set1_ps(fl);
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = d - i >= 16 ? __mmask16{0xFFFF} : __mmask16((1u << (d - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, _mm512_div_ps(_mm512_loadu_ps(facc + i), vl));
  }
}

}  // namespace

void AttentionTileAvx512(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                         int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                         int64_t num_chunks, float* partials, float* scratch) {
  const int64_t d = p.head_dim, g = p.num_heads / p.num_kv_heads, bs = p.block_size;
  const int64_t kv_dim = p.num_kv_heads * d, qs = p.q_stride ? p.q_stride : p.num_heads * d;
  const int64_t nd = (d + 15) / 16, dp = nd * 16, rec = dp + 16;
  // Rows: KV head major, then token, then query head of the group.
  const int64_t head_rows = (t1 - t0) * g, rows = (h1 - h0) * head_rows;
  const __mmask16 tail = d % 16 == 0 ? __mmask16{0xFFFF} : __mmask16((1u << (d % 16)) - 1);
  float* acc = scratch;               // rows × dp: this chunk's accumulators
  float* facc = acc + rows * dp;      // rows × dp: folded over chunks
  float* lsum = facc + rows * dp;     // rows × 16: running sums, per key lane
  float* prob = lsum + rows * kKeys;  // rows × 16: this step's probabilities
  float* mrow = prob + rows * kKeys;  // rows: running max
  float* alpha = mrow + rows;         // rows: this step's rescale factor
  float* fm = alpha + rows;
  float* fl = fm + rows;
  float* zero = fl + rows;  // kv_dim zeros: stands in for keys outside the tile's range
  std::memset(zero, 0, sizeof(float) * kv_dim);

  const int32_t* table = p.block_tables + p.token_seq[t0] * p.max_blocks_per_seq;
  int64_t klo = INT64_MAX, khi = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t hi = p.q_pos[t];
    const int64_t lo = p.sliding_window > 0 ? Max(0, hi - p.sliding_window + 1) : 0;
    klo = Min(klo, lo);
    khi = Max(khi, hi);
  }
  const ScoresFn scores_fn = PickScores(d);
  const __m512 vscale = _mm512_set1_ps(p.scale), vcap = _mm512_set1_ps(p.softcap);
  const __m512 vneginf = _mm512_set1_ps(kNegInf);
  const bool softcap = p.softcap > 0.0f;
  if (!partials) {
    for (int64_t r = 0; r < rows; ++r) {
      fm[r] = kNegInf;
      fl[r] = 0.0f;
    }
  }
  const float* kp[kKeys];  // K and V rows of this step (all KV heads; zero rows outside)
  const float* vp[kKeys];

  for (int64_t c = c0; c < c1; ++c) {
    const int64_t cb = c * chunk_keys, ce = cb + chunk_keys - 1;
    const int64_t kb = Max(cb, klo), ke = Min(ce, khi);
    for (int64_t r = 0; r < rows; ++r) mrow[r] = kNegInf;
    std::memset(lsum, 0, sizeof(float) * rows * kKeys);
    std::memset(acc, 0, sizeof(float) * rows * dp);
    for (int64_t ts = kb / kKeys * kKeys; ts <= ke; ts += kKeys) {
      const int64_t jb = Max(kb - ts, 0), je = Min(ke - ts, kKeys - 1);
      for (int64_t j = 0; j < kKeys; ++j) kp[j] = vp[j] = zero;
      for (int64_t j = jb, block = (ts + jb) / bs, in_block = (ts + jb) % bs; j <= je; ++j) {
        const int64_t offset = (table[block] * bs + in_block) * kv_dim;
        kp[j] = p.k_cache + offset;
        vp[j] = p.v_cache + offset;
        if (++in_block == bs) {
          in_block = 0;
          ++block;
        }
      }
      for (int64_t kvh = h0; kvh < h1; ++kvh) {
        const int64_t r0 = (kvh - h0) * head_rows;
        // Scores, scaled, capped and masked (-inf outside each row's keys), into prob.
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t hi = p.q_pos[t];
          const int64_t lo = p.sliding_window > 0 ? Max(0, hi - p.sliding_window + 1) : 0;
          const int64_t rlo = Max(Max(lo, cb), ts), rhi = Min(Min(hi, ce), ts + kKeys - 1);
          const float* q = p.q + t * qs + kvh * g * d;
          for (int64_t gi = 0; gi < g; ++gi) {
            float* sr = prob + (r0 + (t - t0) * g + gi) * kKeys;
            if (rlo > rhi) {  // no key of this step for the row
              _mm512_storeu_ps(sr, vneginf);
              continue;
            }
            __m512 s = _mm512_mul_ps(scores_fn(q + gi * d, kp, kvh * d, nd, tail), vscale);
            if (softcap) s = _mm512_mul_ps(vcap, Tanh(_mm512_div_ps(s, vcap)));
            const auto a = static_cast<unsigned>(rlo - ts), b = static_cast<unsigned>(rhi - ts);
            const auto live = static_cast<__mmask16>(((2u << b) - 1) & ~((1u << a) - 1));
            _mm512_storeu_ps(sr, _mm512_mask_mov_ps(vneginf, live, s));
          }
        }
        // Online softmax, 16 rows at a time: their maxima in one vector, then the rescale
        // factors alpha = e^(old max - new max) (0 while a row has seen no key), then per row
        // the probabilities e^(s - new max) (0 where masked) and the running sums.
        for (int64_t rb = r0; rb < r0 + head_rows; rb += 16) {
          const int64_t n = Min(16, r0 + head_rows - rb);
          const auto rows_mask = static_cast<__mmask16>((1u << n) - 1);
          __m512 row_max;
          if (n <= 4) {  // decode: a few rows per KV head
            float m[4];
            for (int64_t i = 0; i < n; ++i) {
              m[i] = _mm512_reduce_max_ps(_mm512_loadu_ps(prob + (rb + i) * kKeys));
            }
            row_max = _mm512_mask_loadu_ps(vneginf, rows_mask, m);
          } else {
            __m512 sv[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i) {
              sv[i] = i < n ? _mm512_loadu_ps(prob + (rb + i) * kKeys) : vneginf;
            }
            row_max = ReduceLanes16<MaxOf>(sv);
          }
          const __m512 mold = _mm512_mask_loadu_ps(vneginf, rows_mask, mrow + rb);
          const __m512 mnew = _mm512_max_ps(mold, row_max);
          _mm512_mask_storeu_ps(alpha + rb, rows_mask, Exp(_mm512_sub_ps(mold, mnew)));
          _mm512_mask_storeu_ps(mrow + rb, rows_mask, mnew);
        }
        for (int64_t r = r0; r < r0 + head_rows; ++r) {
          float* pr = prob + r * kKeys;
          float* ls = lsum + r * kKeys;
          const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(pr), _mm512_set1_ps(mrow[r])));
          _mm512_storeu_ps(ls, _mm512_fmadd_ps(_mm512_loadu_ps(ls), _mm512_set1_ps(alpha[r]), e));
          _mm512_storeu_ps(pr, e);
        }
        // acc = acc * alpha + P V, a block of rows × head-dim vectors at a time.
        for (int64_t rb = r0; rb < r0 + head_rows; rb += kPvRows) {
          const int64_t nr = Min(kPvRows, r0 + head_rows - rb);
          for (int64_t d0 = 0; d0 < nd; d0 += kPvVecs) {
            PickPv(nr, Min(kPvVecs, nd - d0))(acc + rb * dp, dp, prob + rb * kKeys, alpha + rb, vp,
                                              kvh * d, jb, je, d0, nd, tail);
          }
        }
      }
    }
    // End of the chunk: record or fold each row's state.
    for (int64_t r = 0; r < rows; ++r) {
      float* record = partials ? partials + (r * num_chunks + c - chunk_first) * rec : nullptr;
      if (mrow[r] == kNegInf) {
        if (record) {
          record[dp] = kNegInf;
          record[dp + 1] = 0.0f;
        }
        continue;
      }
      const float l = _mm512_reduce_add_ps(_mm512_loadu_ps(lsum + r * kKeys));
      if (record) {
        std::memcpy(record, acc + r * dp, sizeof(float) * dp);
        record[dp] = mrow[r];
        record[dp + 1] = l;
      } else {
        Fold(fm + r, fl + r, facc + r * dp, mrow[r], l, acc + r * dp, dp);
      }
    }
  }
  if (!partials) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r % head_rows / g, h = (h0 + r / head_rows) * g + r % g;
      WriteOut(p.out + (t * p.num_heads + h) * d, facc + r * dp, fl[r], d);
    }
  }
}

void AttentionCombineAvx512(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0,
                            int64_t h1, int64_t num_chunks, const float* partials, float* scratch) {
  const int64_t d = p.head_dim, g = p.num_heads / p.num_kv_heads;
  const int64_t dp = (d + 15) / 16 * 16, rec = dp + 16, head_rows = (t1 - t0) * g;
  float* facc = scratch;
  for (int64_t r = 0; r < (h1 - h0) * head_rows; ++r) {
    float fm = kNegInf, fl = 0.0f;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const float* record = partials + (r * num_chunks + c) * rec;
      Fold(&fm, &fl, facc, record[dp], record[dp + 1], record, dp);
    }
    const int64_t t = t0 + r % head_rows / g, h = (h0 + r / head_rows) * g + r % g;
    WriteOut(p.out + (t * p.num_heads + h) * d, facc, fl, d);
  }
}

}  // namespace dinfer::kernels::cpu::attention_internal
