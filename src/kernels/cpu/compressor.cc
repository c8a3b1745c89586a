// Compressor and IndexerTopK (deepseek_v4.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/deepseek_v4.h"

namespace dinfer::kernels::cpu {
namespace {

// Online softmax pooling of one series over [d0, d1): running max m, sum s and weighted sum a.
struct Accumulator {
  float* m;
  float* s;
  float* a;

  void Clear(int64_t d0, int64_t d1) {
    std::fill(m + d0, m + d1, -INFINITY);
    std::fill(s + d0, s + d1, 0.0f);
    std::fill(a + d0, a + d1, 0.0f);
  }
  // Adds a slot: values kv[d], logits g[d] + bias[d].
  void Add(const float* kv, const float* g, const float* bias, int64_t d0, int64_t d1) {
    for (int64_t d = d0; d < d1; ++d) {
      const float logit = g[d] + bias[d];
      if (logit > m[d]) {
        const float shrink = std::exp(m[d] - logit);
        a[d] = a[d] * shrink + kv[d];
        s[d] = s[d] * shrink + 1.0f;
        m[d] = logit;
      } else {
        const float e = std::exp(logit - m[d]);
        a[d] += e * kv[d];
        s[d] += e;
      }
    }
  }
  void Emit(float* out, int64_t d0, int64_t d1) const {
    for (int64_t d = d0; d < d1; ++d) out[d] = a[d] / s[d];
  }
  void CopyFrom(const Accumulator& o, int64_t d0, int64_t d1) {
    std::copy(o.m + d0, o.m + d1, m + d0);
    std::copy(o.s + d0, o.s + d1, s + d0);
    std::copy(o.a + d0, o.a + d1, a + d0);
  }
};

// The state row: the accumulator of the window in progress, then (overlap) the one of the next
// window, which pools the first halves of the current window's tokens.
Accumulator Series(float* row, int64_t dim, int which) {
  float* base = row + static_cast<int64_t>(which) * 3 * dim;
  return Accumulator{base, base + dim, base + 2 * dim};
}

// Runs of consecutive tokens of one sequence: [begin, end).
std::vector<std::pair<int64_t, int64_t>> Runs(const int32_t* token_seq, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t t = 0; t < n;) {
    int64_t e = t + 1;
    while (e < n && token_seq[e] == token_seq[t]) ++e;
    runs.emplace_back(t, e);
    t = e;
  }
  return runs;
}

}  // namespace

int64_t CompressorStateWidth(int64_t dim, bool overlap) { return (overlap ? 6 : 3) * dim; }

void Compressor(const CompressorParams& p) {
  const int64_t dim = p.dim, width = CompressorStateWidth(dim, p.overlap);
  const auto runs = Runs(p.token_seq, p.num_tokens);
  constexpr int64_t kDimsPerTask = 64;
  const int64_t chunks = (dim + kDimsPerTask - 1) / kDimsPerTask;
  auto run = [&](int64_t task) {
    const auto [begin, end] = runs[task / chunks];
    const int64_t d0 = task % chunks * kDimsPerTask, d1 = std::min(dim, d0 + kDimsPerTask);
    const int32_t* table = p.block_tables + p.token_seq[begin] * p.max_blocks_per_seq;
    auto state_row = [&](int64_t pos) { return p.state + table[pos / p.block_size] * width; };
    thread_local std::vector<float> local;
    local.resize(static_cast<size_t>(width));
    Accumulator cur = Series(local.data(), dim, 0), next = Series(local.data(), dim, 1);
    const int64_t first = p.positions[begin];
    if (first > 0) {
      float* saved = state_row(first - 1);
      for (int s = 0; s < (p.overlap ? 2 : 1); ++s) {
        Series(local.data(), dim, s).CopyFrom(Series(saved, dim, s), d0, d1);
      }
    } else {
      cur.Clear(d0, d1);
      if (p.overlap) next.Clear(d0, d1);
    }
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = p.positions[t], slot = pos % p.rate;
      const float* kv = p.kv + t * p.kv_stride;
      const float* g = p.gate + t * p.gate_stride;
      const float* bias = p.bias + slot * dim * (p.overlap ? 2 : 1);
      if (p.overlap) {
        cur.Add(kv + dim, g + dim, bias + dim, d0, d1);
        next.Add(kv, g, bias, d0, d1);
      } else {
        cur.Add(kv, g, bias, d0, d1);
      }
      if (slot == p.rate - 1) {
        cur.Emit(p.entries + p.entry_row[t] * dim, d0, d1);
        if (p.overlap) {
          cur.CopyFrom(next, d0, d1);
          next.Clear(d0, d1);
        } else {
          cur.Clear(d0, d1);
        }
      }
      if ((pos + 1) % p.block_size == 0 || t + 1 == end) {
        float* row = state_row(pos);
        for (int s = 0; s < (p.overlap ? 2 : 1); ++s) {
          Series(row, dim, s).CopyFrom(Series(local.data(), dim, s), d0, d1);
        }
      }
    }
  };
  const int64_t tasks = static_cast<int64_t>(runs.size()) * chunks;
  if (p.pool == nullptr || tasks == 1) {
    for (int64_t i = 0; i < tasks; ++i) run(i);
  } else {
    p.pool->ParallelFor(tasks, [&](int, int64_t i) { run(i); });
  }
}

void CompressorReference(const CompressorParams& p) {
  const int64_t dim = p.dim, width = dim * (p.overlap ? 2 : 1);
  for (const auto& [begin, end] : Runs(p.token_seq, p.num_tokens)) {
    for (int64_t t = begin; t < end; ++t) {
      if (p.entry_row[t] < 0) continue;
      // Window w ends at token t; its slots are the tokens t - rate + 1 .. t (second halves with
      // overlap) and, with overlap, the first halves of the rate tokens before them.
      std::vector<std::pair<int64_t, int64_t>> slots;  // (token, column offset)
      const int64_t off = p.overlap ? dim : 0;
      if (p.overlap) {
        for (int64_t j = t - 2 * p.rate + 1; j <= t - p.rate; ++j) {
          if (j >= begin) slots.emplace_back(j, 0);
        }
      }
      for (int64_t j = t - p.rate + 1; j <= t; ++j) slots.emplace_back(j, off);
      for (int64_t d = 0; d < dim; ++d) {
        double max_logit = -INFINITY;
        std::vector<double> logits;
        for (const auto& [j, c] : slots) {
          const int64_t slot = p.positions[j] % p.rate;
          logits.push_back(double{p.gate[j * p.gate_stride + c + d]} +
                           p.bias[slot * width + c + d]);
          max_logit = std::max(max_logit, logits.back());
        }
        double sum = 0, acc = 0;
        for (size_t i = 0; i < slots.size(); ++i) {
          const double e = std::exp(logits[i] - max_logit);
          sum += e;
          acc += e * p.kv[slots[i].first * p.kv_stride + slots[i].second + d];
        }
        p.entries[p.entry_row[t] * dim + d] = static_cast<float>(acc / sum);
      }
    }
  }
}

namespace {

// score(w) for the valid entries of token t, in entry order.
template <typename Real>
void IndexerScores(const IndexerParams& p, int64_t t, std::vector<Real>* scores) {
  const int32_t* table = p.block_tables + p.token_seq[t] * p.max_blocks_per_seq;
  const int64_t valid = (p.q_pos[t] + 1) / p.rate;
  scores->assign(static_cast<size_t>(valid), 0);
  thread_local std::vector<float> widened;
  widened.resize(static_cast<size_t>(p.head_dim));
  for (int64_t w = 0; w < valid; ++w) {
    const float* k = KvRow(p.keys, p.keys_dtype,
                           CompressedSlot(table, p.block_size, p.rate, p.rows_per_block, w),
                           p.head_dim, widened.data());
    Real score = 0;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float* q = p.q + t * p.q_stride + h * p.head_dim;
      Real dot = 0;
      for (int64_t i = 0; i < p.head_dim; ++i) dot += static_cast<Real>(q[i]) * k[i];
      score += std::max<Real>(dot, 0) * p.scale * p.weights[t * p.weights_stride + h];
    }
    (*scores)[w] = score;
  }
}

template <typename Real>
void Select(const IndexerParams& p, int64_t t, const std::vector<Real>& scores,
            std::vector<int32_t>* order) {
  const int64_t valid = static_cast<int64_t>(scores.size());
  const int64_t k = std::min(valid, p.topk);
  order->resize(static_cast<size_t>(valid));
  std::iota(order->begin(), order->end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::partial_sort(order->begin(), order->begin() + k, order->end(), better);
  int32_t* out = p.selected + t * p.topk;
  std::copy(order->begin(), order->begin() + k, out);
  std::fill(out + k, out + p.topk, -1);
}

}  // namespace

void IndexerTopK(const IndexerParams& p) {
  auto run = [&](int64_t t) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int32_t> order;
    IndexerScores(p, t, &scores);
    Select(p, t, scores, &order);
  };
  if (p.pool == nullptr || p.num_tokens == 1) {
    for (int64_t t = 0; t < p.num_tokens; ++t) run(t);
  } else {
    p.pool->ParallelFor(p.num_tokens, [&](int, int64_t t) { run(t); });
  }
}

void IndexerTopKReference(const IndexerParams& p) {
  std::vector<double> scores;
  std::vector<int32_t> order;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    IndexerScores(p, t, &scores);
    Select(p, t, scores, &order);
  }
}

}  // namespace dinfer::kernels::cpu
