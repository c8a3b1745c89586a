// Tensor-core and asynchronous-copy helpers for the attention kernels (included by .cu files
// only): cp.async with zero fill, mma.sync m16n8k16 bf16 / f16 with f32 accumulators, e4m3 pair
// widening, ldmatrix, and the paged-cache row lookup.
#pragma once

#include "kernels/cuda/common.cuh"

namespace dinfer::kernels::cuda {

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool fill) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = fill ? 16 : 0;  // 0: write zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
// A 4-byte asynchronous copy (cp.async.cg copies only 16 bytes; this one goes through L1).
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with f16 operands: the FP8 cache's e4m3 values widen to f16 in one instruction.
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3 values (the low and high byte of the low 16 bits of `pair`; kHigh: of its high 16
// bits, read in place) as an f16 pair, exactly.
template <bool kHigh = false>
__device__ __forceinline__ uint32_t E4M3x2ToHalf2(uint32_t pair) {
  uint32_t h;
  if constexpr (kHigh) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n"
        : "=r"(h)
        : "r"(pair));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n"
        : "=r"(h)
        : "r"(pair));
  }
  return h;
}

// Bytes of a and b picked by the selector (PTX prmt): byte i of the result is byte sel[i] of
// b:a, where 0-3 name a's bytes and 4-7 b's.
__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows whose chunks are XOR-swizzled
// by the row, so that ldmatrix reads of 8 rows hit distinct banks.
__device__ __forceinline__ int Swizzled128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// The mma.sync fragments of k-step s (32 bytes of each row: 16 bf16 or 32 e4m3 values) of two
// 128-byte-swizzled shared tiles: A of kMt row tiles of 16 rows from a_row0 (m16 x k, row-major),
// B of four tiles of 8 rows from b_row0 (the n rows of w, k contiguous).
template <int kMt>
__device__ __forceinline__ void LoadSwizzledFragments(const uint8_t* sa, const uint8_t* sb,
                                                      int a_row0, int b_row0, int s, int lane,
                                                      uint32_t (&a)[kMt][4], uint32_t (&b)[4][2]) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const int r = a_row0 + mt * 16 + (lane & 15);
    LdMatrixX4(a[mt], sa + Swizzled128(r, 2 * s + (lane >> 4)));
  }
#pragma unroll
  for (int np = 0; np < 2; ++np) {
    const int r = b_row0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
    uint32_t f[4];
    LdMatrixX4(f, sb + Swizzled128(r, 2 * s + ((lane >> 3) & 1)));
    b[2 * np][0] = f[0];
    b[2 * np][1] = f[1];
    b[2 * np + 1][0] = f[2];
    b[2 * np + 1][1] = f[3];
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t PackHalf(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A pair of bf16 as a pair of f16 (exact for magnitudes in f16's normal range).
__device__ __forceinline__ uint32_t Bf16x2ToHalf2(uint32_t v) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  return PackHalf(f.x, f.y);
}

// Row of key position j in a paged cache: block table lookup, with shifts when the block size is
// a power of two (the usual 16), which saves an integer division per key.
struct PagedRows {
  const int32_t* table;
  int block_size, shift;  // shift < 0: not a power of two
  __device__ __forceinline__ PagedRows(const int32_t* t, int bs)
      : table(t), block_size(bs), shift(-1) {
    if ((bs & (bs - 1)) == 0) {
      shift = 0;
      while ((1 << shift) < bs) ++shift;
    }
  }
  __device__ __forceinline__ int64_t Slot(int j) const {
    if (shift >= 0) {
      return (static_cast<int64_t>(table[j >> shift]) << shift) + (j & (block_size - 1));
    }
    return static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
  }
};

// Online softmax over the row pair of an mma.sync accumulator tile (rows g and g + 8, a row's
// columns spread over the four threads of a quad), scores in log2 units. From this thread's
// maxima mx0, mx1 of the new scores: the rows' running maxima m (updated), the bases b the new
// scores are exponentiated against (0 for a row with no finite score yet) and the factors corr
// that rescale the old sums l (applied here) and outputs.
struct RowPairStep {
  float b0, b1, corr0, corr1;
};
__device__ __forceinline__ RowPairStep OnlineMaxStep(float mx0, float mx1, float& m0, float& m1,
                                                     float& l0, float& l1) {
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
  return {b0, b1, corr0, corr1};
}

// The whole step on mma.sync fragments: OnlineMaxStep, then the outputs o (kOt n tiles) rescaled
// and the scores s (kNt n tiles) replaced by their exponentials, which add to the sums l. The
// whole warp calls it; the rescale is skipped when no row of the warp has a new maximum (every
// factor is then exactly 1), which after the first tiles is the common case.
template <int kNt, int kOt>
__device__ __forceinline__ void OnlineSoftmaxStep(float (&s)[kNt][4], float (&o)[kOt][4], float mx0,
                                                  float mx1, float& m0, float& m1, float& l0,
                                                  float& l1) {
  const RowPairStep st = OnlineMaxStep(mx0, mx1, m0, m1, l0, l1);
  if (__any_sync(0xffffffffu, st.corr0 != 1.0f || st.corr1 != 1.0f)) {
#pragma unroll
    for (int d = 0; d < kOt; ++d) {
      o[d][0] *= st.corr0;
      o[d][1] *= st.corr0;
      o[d][2] *= st.corr1;
      o[d][3] *= st.corr1;
    }
  }
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    s[nt][0] = exp2f(s[nt][0] - st.b0);
    s[nt][1] = exp2f(s[nt][1] - st.b0);
    s[nt][2] = exp2f(s[nt][2] - st.b1);
    s[nt][3] = exp2f(s[nt][3] - st.b1);
    l0 += s[nt][0] + s[nt][1];
    l1 += s[nt][2] + s[nt][3];
  }
}

// The sum of x over the four threads of a quad (a row of an mma.sync accumulator).
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

}  // namespace dinfer::kernels::cuda
