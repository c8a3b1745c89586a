// SparseAttention (deepseek_v4.h): one task per query token and group of heads. All heads share
// the single key/value head, so each key row is loaded once per group and dotted with every head.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/deepseek_v4.h"

namespace dinfer::kernels::cpu {
namespace {

#define DINFER_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

DINFER_MULTIVERSION float Dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

DINFER_MULTIVERSION void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// The key rows a query token attends: its window, then its compressed entries; bf16 rows are
// widened into `widened`.
void GatherKeys(const SparseAttentionParams& p, int64_t t, std::vector<const float*>* keys,
                std::vector<float>* widened) {
  struct Ref {
    const void* plane;
    KvDType dtype;
    int64_t row;
  };
  thread_local std::vector<Ref> refs;
  refs.clear();
  const int32_t* table = p.block_tables + p.token_seq[t] * p.max_blocks_per_seq;
  const int64_t pos = p.q_pos[t];
  for (int64_t j = std::max<int64_t>(0, pos - p.window + 1); j <= pos; ++j) {
    const int64_t slot =
        static_cast<int64_t>(table[j / p.block_size]) * p.block_size + j % p.block_size;
    refs.push_back({p.window_kv, p.window_dtype, slot});
  }
  if (p.compressed != nullptr) {
    const bool own = p.compressed_block_tables != nullptr;
    const int32_t* ctable =
        own ? p.compressed_block_tables + p.token_seq[t] * p.compressed_max_blocks_per_seq : table;
    const int64_t cbs = own ? p.compressed_block_size : p.block_size;
    auto add = [&](int64_t w) {
      refs.push_back({p.compressed, p.compressed_dtype,
                      CompressedSlot(ctable, cbs, p.rate, p.rows_per_block, w)});
    };
    if (p.selected != nullptr) {
      for (int64_t i = 0; i < p.num_selected; ++i) {
        const int32_t w = p.selected[t * p.num_selected + i];
        if (w >= 0) add(w);
      }
    } else {
      for (int64_t w = 0; w < (pos + 1) / p.rate; ++w) add(w);
    }
  }
  const int64_t d = p.head_dim;
  widened->resize(refs.size() * static_cast<size_t>(d));
  keys->resize(refs.size());
  for (size_t j = 0; j < refs.size(); ++j) {
    (*keys)[j] = KvRow(refs[j].plane, refs[j].dtype, refs[j].row, d, widened->data() + j * d);
  }
}

}  // namespace

void SparseAttention(const SparseAttentionParams& p) {
  const int64_t d = p.head_dim;
  const int threads = p.pool != nullptr ? p.pool->num_threads() : 1;
  // Few tokens (decode): split the heads too, so that every thread has work.
  int64_t heads_per_task = p.num_heads;
  while (heads_per_task > 1 && p.num_tokens * (p.num_heads / heads_per_task) < 2 * threads &&
         heads_per_task % 2 == 0) {
    heads_per_task /= 2;
  }
  const int64_t groups = p.num_heads / heads_per_task;
  auto run = [&](int64_t task) {
    const int64_t t = task / groups, h0 = task % groups * heads_per_task;
    thread_local std::vector<const float*> keys;
    thread_local std::vector<float> scores, widened;
    GatherKeys(p, t, &keys, &widened);
    const int64_t n = static_cast<int64_t>(keys.size());
    scores.resize(static_cast<size_t>(n));
    for (int64_t h = h0; h < h0 + heads_per_task; ++h) {
      const float* q = p.q + t * p.q_stride + h * d;
      float* out = p.out + t * p.out_stride + h * d;
      float max_score = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = Dot(q, keys[j], d) * p.scale;
        max_score = std::max(max_score, scores[j]);
      }
      float sum = p.sinks != nullptr ? std::exp(p.sinks[h] - max_score) : 0.0f;
      std::fill(out, out + d, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float e = std::exp(scores[j] - max_score);
        sum += e;
        Axpy(out, e, keys[j], d);
      }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      for (int64_t i = 0; i < d; ++i) out[i] *= inv;
    }
  };
  const int64_t tasks = p.num_tokens * groups;
  if (p.pool == nullptr || tasks == 1) {
    for (int64_t i = 0; i < tasks; ++i) run(i);
  } else {
    p.pool->ParallelFor(tasks, [&](int, int64_t i) { run(i); });
  }
}

void SparseAttentionReference(const SparseAttentionParams& p) {
  std::vector<const float*> keys;
  std::vector<float> widened;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    GatherKeys(p, t, &keys, &widened);
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float* q = p.q + t * p.q_stride + h * p.head_dim;
      std::vector<double> s(keys.size());
      double max_score = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int64_t i = 0; i < p.head_dim; ++i) dot += double{q[i]} * keys[j][i];
        s[j] = dot * p.scale;
        max_score = std::max(max_score, s[j]);
      }
      double sum = p.sinks != nullptr ? std::exp(p.sinks[h] - max_score) : 0.0;
      for (double& v : s) {
        v = std::exp(v - max_score);
        sum += v;
      }
      float* out = p.out + t * p.out_stride + h * p.head_dim;
      for (int64_t i = 0; i < p.head_dim; ++i) {
        double acc = 0;
        for (size_t j = 0; j < keys.size(); ++j) acc += s[j] * keys[j][i];
        out[i] = static_cast<float>(sum > 0 ? acc / sum : 0.0);
      }
    }
  }
}

}  // namespace dinfer::kernels::cpu
