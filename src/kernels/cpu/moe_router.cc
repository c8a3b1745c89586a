// MoE routing (deepseek_v4.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/deepseek_v4.h"

namespace dinfer::kernels::cpu {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch's softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void Route(const RouterParams& p) {
  const int64_t e = p.num_experts, k = p.top_k;
  std::vector<float> scores(static_cast<size_t>(e)), biased(static_cast<size_t>(e));
  std::vector<int32_t> order(static_cast<size_t>(e));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* logits = p.logits + t * e;
    switch (p.scoring) {
      case RouterScoring::kSqrtSoftplus:
        for (int64_t i = 0; i < e; ++i) scores[i] = std::sqrt(Softplus(logits[i]));
        break;
      case RouterScoring::kSigmoid:
        for (int64_t i = 0; i < e; ++i) scores[i] = Sigmoid(logits[i]);
        break;
      case RouterScoring::kSoftmax: {
        const float mx = *std::max_element(logits, logits + e);
        float sum = 0;
        for (int64_t i = 0; i < e; ++i) sum += (scores[i] = std::exp(logits[i] - mx));
        for (int64_t i = 0; i < e; ++i) scores[i] /= sum;
        break;
      }
    }
    int32_t* experts = p.experts + t * k;
    if (p.hash_experts != nullptr) {
      std::copy(p.hash_experts + t * k, p.hash_experts + (t + 1) * k, experts);
    } else {
      for (int64_t i = 0; i < e; ++i) biased[i] = scores[i] + (p.bias ? p.bias[i] : 0.0f);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
      });
      std::copy(order.begin(), order.begin() + k, experts);
    }
    float* weights = p.weights + t * k;
    float sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += (weights[i] = scores[experts[i]]);
    for (int64_t i = 0; i < k; ++i) {
      weights[i] = (p.normalize ? weights[i] / (sum + 1e-20f) : weights[i]) * p.scaling;
    }
  }
}

}  // namespace dinfer::kernels::cpu
