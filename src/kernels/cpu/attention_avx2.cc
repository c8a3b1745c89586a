// AVX2 paged attention kernel: 8 keys per step. See attention.cc for the tiling, the chunked
// online softmax and why each row's result is independent of the batch (batch invariance).
//
// Scores: for each row, 8 accumulators (one per key) gather lane-wise products q·k over the head
// dims, then a fixed shuffle tree sums each accumulator's lanes into lane j of one vector; the
// arithmetic of a score depends on nothing but q, k and head_dim. Values: per row, the head dims
// are in lanes and each key adds p·v with a broadcast probability.
// This file must not call inline functions of shared headers (see matmul_internal.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace dinfer::kernels::cpu::attention_internal {

void AttentionTileAvx2(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                       int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                       int64_t num_chunks, float* partials, float* scratch);
void AttentionCombineAvx2(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                          int64_t num_chunks, const float* partials, float* scratch);

namespace {

constexpr int kKeys = 8;
constexpr float kNegInf = -__builtin_inff();

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }

// e^x, within 1 ulp; exactly 0 below -87.33 (including -inf) and exactly 1 at 0.
inline __m256 Exp(__m256 x) {
  const __m256 min_x = _mm256_set1_ps(-87.33654f);
  const __m256 keep = _mm256_cmp_ps(x, min_x, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, min_x), _mm256_set1_ps(88.0f));
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split in a short high part and the rest.
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // Taylor series of e^r to degree 7 (truncation error below 4e-9 relative).
  __m256 y = _mm256_set1_ps(1.0f / 5040.0f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 720.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 120.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 24.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 6.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  // 2^n for n in [-126, 127] through the exponent bits.
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

inline float ExpScalar(float x) { return _mm256_cvtss_f32(Exp(_mm256_set1_ps(x))); }

// tanh(x): odd Taylor series below |x| = 0.4, (1 - e^-2|x|) / (1 + e^-2|x|) above.
inline __m256 Tanh(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign, x);
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 s = _mm256_set1_ps(21844.0f / 6081075.0f);
  s = _mm256_fmadd_ps(s, x2, _mm256_set1_ps(-1382.0f / 155925.0f));
  s = _mm256_fmadd_ps(s, x2, _mm256_set1_ps(62.0f / 2835.0f));
  s = _mm256_fmadd_ps(s, x2, _mm256_set1_ps(-17.0f / 315.0f));
  s = _mm256_fmadd_ps(s, x2, _mm256_set1_ps(2.0f / 15.0f));
  s = _mm256_fmadd_ps(s, x2, _mm256_set1_ps(-1.0f / 3.0f));
  s = _mm256_fmadd_ps(_mm256_mul_ps(s, x2), x, x);
  const __m256 e = Exp(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 l = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  l = _mm256_or_ps(l, _mm256_and_ps(sign, x));
  return _mm256_blendv_ps(l, s, _mm256_cmp_ps(a, _mm256_set1_ps(0.4f), _CMP_LT_OQ));
}

// Lane j of the result is a[j]'s lanes combined by `op` in a fixed tree: lanes l and l + 4,
// then l and l + 2, then l and l + 1.
template <__m256 (*op)(__m256, __m256)>
inline __m256 ReduceLanes8(const __m256* a) {
  __m256 w[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // lanes 0-3: key j, lanes 4-7: key j + 4
    w[j] = op(_mm256_permute2f128_ps(a[j], a[j + 4], 0x20),
              _mm256_permute2f128_ps(a[j], a[j + 4], 0x31));
  }
  // Per 128-bit half: keys (0, 1) and (4, 5) in z0, (2, 3) and (6, 7) in z1, two partials each.
  const __m256 z0 = op(_mm256_shuffle_ps(w[0], w[1], 0x44), _mm256_shuffle_ps(w[0], w[1], 0xEE));
  const __m256 z1 = op(_mm256_shuffle_ps(w[2], w[3], 0x44), _mm256_shuffle_ps(w[2], w[3], 0xEE));
  return op(_mm256_shuffle_ps(z0, z1, 0x88), _mm256_shuffle_ps(z0, z1, 0xDD));
}

inline __m256 Add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 MaxOf(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }

inline float ReduceMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float ReduceAdd(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// Lanes [0, n) set, n in [0, 8].
inline __m256i FirstLanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256i VecMask(int64_t index, int64_t nd, int64_t tail) {
  return FirstLanes(index < nd - 1 ? 8 : (index == nd - 1 ? tail : 0));
}

// Scores of one query row against 8 keys (unscaled dot products), head dims taken NB vectors
// at a time. kMasked: loads through masks (head_dim % 8 != 0 or nd % NB != 0).
template <int NB, bool kMasked>
__m256 RowScores(const float* q, const float* const* kp, int64_t offset, int64_t nd, int64_t tail) {
  __m256 a[kKeys];
#pragma GCC unroll 16
  for (int j = 0; j < kKeys; ++j) a[j] = _mm256_setzero_ps();
  for (int64_t ib = 0; ib < nd; ib += NB) {
    __m256 qv[NB];
    __m256i m[NB];
#pragma GCC unroll 4
    for (int i = 0; i < NB; ++i) {
      if (kMasked) m[i] = VecMask(ib + i, nd, tail);
      qv[i] =
          kMasked ? _mm256_maskload_ps(q + 8 * (ib + i), m[i]) : _mm256_loadu_ps(q + 8 * (ib + i));
    }
#pragma GCC unroll 8
    for (int j = 0; j < kKeys; ++j) {
      const float* k = kp[j] + offset + 8 * ib;
#pragma GCC unroll 4
      for (int i = 0; i < NB; ++i) {
        const __m256 kv =
            kMasked ? _mm256_maskload_ps(k + 8 * i, m[i]) : _mm256_loadu_ps(k + 8 * i);
        a[j] = _mm256_fmadd_ps(qv[i], kv, a[j]);
      }
    }
  }
  return ReduceLanes8<Add>(a);
}

using ScoresFn = __m256 (*)(const float*, const float* const*, int64_t, int64_t, int64_t);

template <bool kMasked>
ScoresFn PickScores(int64_t nd) {
  switch (nd) {
    case 1:
      return RowScores<1, kMasked>;
    case 2:
      return RowScores<2, kMasked>;
    case 3:
      return RowScores<3, kMasked>;
    default:
      return RowScores<4, kMasked>;
  }
}

ScoresFn PickScores(int64_t head_dim) {
  const int64_t nd = (head_dim + 7) / 8;
  const bool masked = head_dim % 8 != 0 || (nd > 4 && nd % 4 != 0);
  return masked ? PickScores<true>(nd) : PickScores<false>(nd);
}

// acc[r] = acc[r] * alpha[r] + sum over keys j in [j0, j1] of prob[r][j] * v_j, for R rows and
// the DV head-dim vectors from vector d0.
template <int R, int DV>
void PvBlock(float* acc, int64_t acc_stride, const float* prob, const float* alpha,
             const float* const* vp, int64_t offset, int64_t j0, int64_t j1, int64_t d0, int64_t nd,
             int64_t tail) {
  __m256i m[DV];
#pragma GCC unroll 16
  for (int x = 0; x < DV; ++x) m[x] = VecMask(d0 + x, nd, tail);
  __m256 c[R][DV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 16
    for (int x = 0; x < DV; ++x) {
      c[r][x] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * acc_stride + 8 * (d0 + x)), a);
    }
  }
  for (int64_t j = j0; j <= j1; ++j) {
    const float* v = vp[j] + offset + 8 * d0;
    __m256 vv[DV];
#pragma GCC unroll 16
    for (int x = 0; x < DV; ++x) vv[x] = _mm256_maskload_ps(v + 8 * x, m[x]);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 pr = _mm256_broadcast_ss(prob + r * kKeys + j);
#pragma GCC unroll 16
      for (int x = 0; x < DV; ++x) c[r][x] = _mm256_fmadd_ps(pr, vv[x], c[r][x]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int x = 0; x < DV; ++x) _mm256_storeu_ps(acc + r * acc_stride + 8 * (d0 + x), c[r][x]);
  }
}

using PvFn = void (*)(float*, int64_t, const float*, const float*, const float* const*, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int64_t);
constexpr int kPvRows = 3, kPvVecs = 3;

template <int R>
PvFn PickPv(int64_t dv) {
  switch (dv) {
    case 1:
      return PvBlock<R, 1>;
    case 2:
      return PvBlock<R, 2>;
    default:
      return PvBlock<R, 3>;
  }
}

PvFn PickPv(int64_t rows, int64_t dv) {
  switch (rows) {
    case 1:
      return PickPv<1>(dv);
    case 2:
      return PickPv<2>(dv);
    default:
      return PickPv<3>(dv);
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
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (int64_t i = 0; i < dp; i += 8) {
    const __m256 f = _mm256_mul_ps(_mm256_loadu_ps(facc + i), va);
    _mm256_storeu_ps(facc + i, _mm256_fmadd_ps(_mm256_loadu_ps(acc + i), vb, f));
  }
  *fl = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(l), _mm_set_ss(b), _mm_set_ss(*fl * a)));
  *fm = nm;
}

inline void WriteOut(float* out, const float* facc, float fl, int64_t d) {
  const __m256 vl = _mm256_set1_ps(fl);
  for (int64_t i = 0; i < d; i += 8) {
    _mm256_maskstore_ps(out + i, FirstLanes(Min(8, d - i)),
                        _mm256_div_ps(_mm256_loadu_ps(facc + i), vl));
  }
}

}  // namespace

void AttentionTileAvx2(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                       int64_t chunk_keys, int64_t c0, int64_t c1, int64_t chunk_first,
                       int64_t num_chunks, float* partials, float* scratch) {
  const int64_t d = p.head_dim, g = p.num_heads / p.num_kv_heads, bs = p.block_size;
  const int64_t kv_dim = p.num_kv_heads * d, qs = p.q_stride ? p.q_stride : p.num_heads * d;
  const int64_t nd = (d + 7) / 8, dp = (d + 15) / 16 * 16, rec = dp + 16;
  // Rows: KV head major, then token, then query head of the group.
  const int64_t head_rows = (t1 - t0) * g, rows = (h1 - h0) * head_rows;
  const int64_t tail = d % 8 == 0 ? 8 : d % 8;
  float* acc = scratch;               // rows × dp: this chunk's accumulators
  float* facc = acc + rows * dp;      // rows × dp: folded over chunks
  float* lsum = facc + rows * dp;     // rows × 8: running sums, per key lane
  float* prob = lsum + rows * kKeys;  // rows × 8: this step's probabilities
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
  const __m256 vscale = _mm256_set1_ps(p.scale), vcap = _mm256_set1_ps(p.softcap);
  const __m256 vneginf = _mm256_set1_ps(kNegInf);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
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
              _mm256_storeu_ps(sr, vneginf);
              continue;
            }
            __m256 s = _mm256_mul_ps(scores_fn(q + gi * d, kp, kvh * d, nd, tail), vscale);
            if (softcap) s = _mm256_mul_ps(vcap, Tanh(_mm256_div_ps(s, vcap)));
            const __m256i live = _mm256_and_si256(
                _mm256_cmpgt_epi32(iota, _mm256_set1_epi32(static_cast<int>(rlo - ts) - 1)),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rhi - ts) + 1), iota));
            _mm256_storeu_ps(sr, _mm256_blendv_ps(vneginf, s, _mm256_castsi256_ps(live)));
          }
        }
        // Online softmax, 8 rows at a time: their maxima in one vector, then the rescale
        // factors alpha = e^(old max - new max) (0 while a row has seen no key), then per row
        // the probabilities e^(s - new max) (0 where masked) and the running sums.
        for (int64_t rb = r0; rb < r0 + head_rows; rb += 8) {
          const int64_t n = Min(8, r0 + head_rows - rb);
          const __m256i rows_mask = FirstLanes(n);
          __m256 row_max;
          if (n <= 2) {  // decode: a few rows per KV head
            float m[8];
            for (int64_t i = 0; i < n; ++i)
              m[i] = ReduceMax(_mm256_loadu_ps(prob + (rb + i) * kKeys));
            row_max = _mm256_blendv_ps(vneginf, _mm256_maskload_ps(m, rows_mask),
                                       _mm256_castsi256_ps(rows_mask));
          } else {
            __m256 sv[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
              sv[i] = i < n ? _mm256_loadu_ps(prob + (rb + i) * kKeys) : vneginf;
            }
            row_max = ReduceLanes8<MaxOf>(sv);
          }
          const __m256 mold = _mm256_blendv_ps(vneginf, _mm256_maskload_ps(mrow + rb, rows_mask),
                                               _mm256_castsi256_ps(rows_mask));
          const __m256 mnew = _mm256_max_ps(mold, row_max);
          _mm256_maskstore_ps(alpha + rb, rows_mask, Exp(_mm256_sub_ps(mold, mnew)));
          _mm256_maskstore_ps(mrow + rb, rows_mask, mnew);
        }
        for (int64_t r = r0; r < r0 + head_rows; ++r) {
          float* pr = prob + r * kKeys;
          float* ls = lsum + r * kKeys;
          const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(pr), _mm256_set1_ps(mrow[r])));
          _mm256_storeu_ps(ls, _mm256_fmadd_ps(_mm256_loadu_ps(ls), _mm256_set1_ps(alpha[r]), e));
          _mm256_storeu_ps(pr, e);
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
      const float l = ReduceAdd(_mm256_loadu_ps(lsum + r * kKeys));
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

void AttentionCombineAvx2(const AttentionParams& p, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                          int64_t num_chunks, const float* partials, float* scratch) {
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
