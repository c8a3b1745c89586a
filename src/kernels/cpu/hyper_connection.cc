// Hyper-connection kernels (deepseek_v4.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/deepseek_v4.h"

namespace dinfer::kernels::cpu {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void HcPre(const HcPreParams& p) {
  const int64_t hc = p.hc, mix = (2 + hc) * hc;
  std::vector<float> comb(static_cast<size_t>(hc * hc)), pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* m = p.mixes + t * mix;
    for (int64_t i = 0; i < hc; ++i) {
      pre[i] = Sigmoid(m[i] * p.scale[0] + p.base[i]) + p.eps;
      p.post[t * hc + i] = 2.0f * Sigmoid(m[hc + i] * p.scale[1] + p.base[hc + i]);
    }
    for (int64_t r = 0; r < hc; ++r) {
      float* row = comb.data() + r * hc;
      float mx = -INFINITY;
      for (int64_t c = 0; c < hc; ++c) {
        row[c] = m[2 * hc + r * hc + c] * p.scale[2] + p.base[2 * hc + r * hc + c];
        mx = std::max(mx, row[c]);
      }
      float sum = 0;
      for (int64_t c = 0; c < hc; ++c) sum += (row[c] = std::exp(row[c] - mx));
      for (int64_t c = 0; c < hc; ++c) row[c] = row[c] / sum + p.eps;
    }
    auto normalize_columns = [&] {
      for (int64_t c = 0; c < hc; ++c) {
        float sum = 0;
        for (int64_t r = 0; r < hc; ++r) sum += comb[r * hc + c];
        for (int64_t r = 0; r < hc; ++r) comb[r * hc + c] /= sum + p.eps;
      }
    };
    normalize_columns();
    for (int64_t it = 1; it < p.iters; ++it) {
      for (int64_t r = 0; r < hc; ++r) {
        float sum = 0;
        for (int64_t c = 0; c < hc; ++c) sum += comb[r * hc + c];
        for (int64_t c = 0; c < hc; ++c) comb[r * hc + c] /= sum + p.eps;
      }
      normalize_columns();
    }
    std::copy(comb.begin(), comb.end(), p.comb + t * hc * hc);
    float* out = p.collapsed + t * p.dim;
    const float* x = p.streams + t * hc * p.dim;
    for (int64_t d = 0; d < p.dim; ++d) {
      float acc = 0;
      for (int64_t i = 0; i < hc; ++i) acc += pre[i] * x[i * p.dim + d];
      out[d] = acc;
    }
  }
}

void HcPost(const HcPostParams& p) {
  const int64_t hc = p.hc, dim = p.dim;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* x = p.streams + t * hc * dim;
    const float* y = p.y + t * dim;
    const float* comb = p.comb + t * hc * hc;
    for (int64_t k = 0; k < hc; ++k) {
      float* out = p.out + (t * hc + k) * dim;
      const float post = p.post[t * hc + k];
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0;
        for (int64_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * x[j * dim + d];
        out[d] = post * y[d] + acc;
      }
    }
  }
}

void HcHead(const HcHeadParams& p) {
  const int64_t hc = p.hc;
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t i = 0; i < hc; ++i) {
      pre[i] = Sigmoid(p.mixes[t * hc + i] * p.scale + p.base[i]) + p.eps;
    }
    const float* x = p.streams + t * hc * p.dim;
    for (int64_t d = 0; d < p.dim; ++d) {
      float acc = 0;
      for (int64_t i = 0; i < hc; ++i) acc += pre[i] * x[i * p.dim + d];
      p.out[t * p.dim + d] = acc;
    }
  }
}

}  // namespace dinfer::kernels::cpu
