#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu {
namespace {

// Hot inner loops get one clone per instruction set; the loader picks the best at run time.
#define DINFER_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

DINFER_MULTIVERSION void Scale(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

DINFER_MULTIVERSION void AddLoop(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

DINFER_MULTIVERSION void RmsNormRow(const float* x, const float* w, float* out, int64_t dim,
                                    float eps, float offset) {
  double ss = 0.0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
  if (w == nullptr) {
    for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv;
    return;
  }
  for (int64_t i = 0; i < dim; ++i) out[i] = (x[i] * inv) * (w[i] + offset);
}

DINFER_MULTIVERSION void SiluMulRow(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

DINFER_MULTIVERSION void SiluMulClampRow(const float* g, const float* u, float* o, int64_t n,
                                         float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = std::min(g[i], limit);
    const float ui = std::clamp(u[i], -limit, limit);
    o[i] = gi / (1.0f + std::exp(-gi)) * ui;
  }
}

inline const float* KvRow(const float* cache, const int32_t* table, int64_t block_size,
                          int64_t kv_dim, int64_t pos) {
  const int64_t block = table[pos / block_size];
  return cache + (block * block_size + pos % block_size) * kv_dim;
}

}  // namespace

void RmsNorm(const RmsNormParams& p) {
  const int64_t xs = p.x_stride ? p.x_stride : p.dim;
  const int64_t os = p.out_stride ? p.out_stride : p.dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    RmsNormRow(p.x + r * xs, p.weight, p.out + r * os, p.dim, p.eps, p.weight_offset);
  }
}

void RmsNormReference(const RmsNormParams& p) {
  const int64_t xs = p.x_stride ? p.x_stride : p.dim;
  const int64_t os = p.out_stride ? p.out_stride : p.dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) ss += double{p.x[r * xs + i]} * p.x[r * xs + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(p.dim) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      const double w = p.weight != nullptr ? p.weight[i] + p.weight_offset : 1.0;
      p.out[r * os + i] = static_cast<float>(p.x[r * xs + i] * inv * w);
    }
  }
}

void Rope(const RopeParams& p) {
  const int64_t rs = p.row_stride ? p.row_stride : p.num_heads * p.head_dim;
  const int64_t half = p.rotary_dim / 2;
  std::vector<float> cs(static_cast<size_t>(half) * 2);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float pos = static_cast<float>(p.positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      // Angles in f32 like the reference implementations, which compute pos * inv_freq in f32.
      const float angle = pos * p.inv_freq[i];
      cs[2 * i] = std::cos(angle) * p.attention_scaling;
      cs[2 * i + 1] = std::sin(angle) * p.attention_scaling * (p.inverse ? -1.0f : 1.0f);
    }
    for (int64_t h = 0; h < p.num_heads; ++h) {
      float* x = p.x + r * rs + h * p.head_dim + p.rotary_offset;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = p.interleaved ? 2 * i : i;
        const int64_t b = p.interleaved ? 2 * i + 1 : i + half;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
        x[b] = x1 * cs[2 * i] + x0 * cs[2 * i + 1];
      }
    }
  }
}

void RopeReference(const RopeParams& p) {
  const int64_t rs = p.row_stride ? p.row_stride : p.num_heads * p.head_dim;
  const int64_t half = p.rotary_dim / 2;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      float* x = p.x + r * rs + h * p.head_dim + p.rotary_offset;
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            static_cast<double>(static_cast<float>(p.positions[r]) * p.inv_freq[i]);
        const double c = std::cos(angle) * p.attention_scaling;
        const double s = std::sin(angle) * p.attention_scaling * (p.inverse ? -1.0 : 1.0);
        const int64_t a = p.interleaved ? 2 * i : i;
        const int64_t b = p.interleaved ? 2 * i + 1 : i + half;
        const double x0 = x[a], x1 = x[b];
        x[a] = static_cast<float>(x0 * c - x1 * s);
        x[b] = static_cast<float>(x1 * c + x0 * s);
      }
    }
  }
}

void SiluMul(const SiluMulParams& p) {
  const int64_t gs = p.gate_stride ? p.gate_stride : p.dim;
  const int64_t us = p.up_stride ? p.up_stride : p.dim;
  const int64_t os = p.out_stride ? p.out_stride : p.dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    if (p.limit > 0.0f) {
      SiluMulClampRow(p.gate + r * gs, p.up + r * us, p.out + r * os, p.dim, p.limit);
    } else {
      SiluMulRow(p.gate + r * gs, p.up + r * us, p.out + r * os, p.dim);
    }
  }
}

void AddInPlace(float* y, const float* x, int64_t n) { AddLoop(y, x, n); }

void Embedding(const EmbeddingParams& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const auto* row = static_cast<const uint8_t*>(p.table) + p.ids[t] * p.row_bytes;
    float* out = p.out + t * p.dim;
    DequantizeRow(p.dtype, row, out, p.dim);
    if (p.scale != 1.0f) Scale(out, p.scale, p.dim);
  }
}

void KvWrite(const KvWriteParams& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    std::memcpy(p.k_cache + slot * p.kv_dim, p.k + t * p.k_stride, sizeof(float) * p.kv_dim);
    std::memcpy(p.v_cache + slot * p.kv_dim, p.v + t * p.v_stride, sizeof(float) * p.kv_dim);
  }
}

void AttentionReference(const AttentionParams& p) {
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  const int64_t qs = p.q_stride ? p.q_stride : p.num_heads * p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int32_t* table = p.block_tables + p.token_seq[t] * p.max_blocks_per_seq;
    const int64_t pos = p.q_pos[t];
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const int64_t kvh = h / group;
      const float* q = p.q + t * qs + h * p.head_dim;
      std::vector<double> w(static_cast<size_t>(pos + 1), 0.0);
      double max_score = -INFINITY;
      for (int64_t j = 0; j <= pos; ++j) {
        if (p.sliding_window > 0 && j <= pos - p.sliding_window) continue;
        const float* k = KvRow(p.k_cache, table, p.block_size, kv_dim, j) + kvh * p.head_dim;
        double s = 0;
        for (int64_t d = 0; d < p.head_dim; ++d) s += double{q[d]} * k[d];
        s *= p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        w[j] = s;
        max_score = std::max(max_score, s);
      }
      double sum = 0;
      for (int64_t j = 0; j <= pos; ++j) {
        if (p.sliding_window > 0 && j <= pos - p.sliding_window) {
          w[j] = 0;
          continue;
        }
        w[j] = std::exp(w[j] - max_score);
        sum += w[j];
      }
      float* out = p.out + (t * p.num_heads + h) * p.head_dim;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          if (w[j] == 0) continue;
          acc += w[j] * KvRow(p.v_cache, table, p.block_size, kv_dim, j)[kvh * p.head_dim + d];
        }
        out[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace dinfer::kernels::cpu
