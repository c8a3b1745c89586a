// Conformance of the CPU element-wise and attention kernels against their plain references.
// DINFER_CONFORMANCE_PERF=1 adds an attention benchmark against the previous kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"

namespace dinfer::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rtol) {
  ASSERT_EQ(got.size(), want.size());
  float max_ref = 0;
  for (float w : want) max_ref = std::max(max_ref, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rtol * std::max(1.0f, max_ref)) << "at " << i;
  }
}

TEST(OpsConformance, RmsNorm) {
  for (int64_t dim : {1, 7, 64, 576, 4096}) {
    for (float offset : {0.0f, 1.0f}) {
      const int64_t rows = 5;
      auto x = Random(rows * dim, 1);
      auto w = Random(dim, 2);
      std::vector<float> got(x.size()), want(x.size());
      RmsNormParams p;
      p.x = x.data();
      p.weight = w.data();
      p.rows = rows;
      p.dim = dim;
      p.eps = 1e-5f;
      p.weight_offset = offset;
      p.out = got.data();
      RmsNorm(p);
      p.out = want.data();
      RmsNormReference(p);
      ExpectClose(got, want, 1e-6f);
    }
  }
}

TEST(OpsConformance, RopeBothLayouts) {
  for (bool interleaved : {false, true}) {
    for (int64_t rotary : {32, 64}) {
      const int64_t rows = 9, heads = 3, head_dim = 64;
      auto x = Random(rows * heads * head_dim, 3);
      std::vector<float> inv(rotary / 2);
      for (int64_t i = 0; i < rotary / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / rotary);
      std::vector<int32_t> pos(rows);
      for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>(r * 37 + 5);
      auto got = x, want = x;
      RopeParams p;
      p.rows = rows;
      p.num_heads = heads;
      p.head_dim = head_dim;
      p.rotary_dim = rotary;
      p.positions = pos.data();
      p.inv_freq = inv.data();
      p.interleaved = interleaved;
      p.x = got.data();
      Rope(p);
      p.x = want.data();
      RopeReference(p);
      ExpectClose(got, want, 2e-6f);
      // Dims past rotary_dim are untouched.
      for (int64_t d = rotary; d < head_dim; ++d) ASSERT_EQ(got[d], x[d]);
    }
  }
}

TEST(OpsConformance, SiluMul) {
  const int64_t rows = 3, dim = 100;
  auto g = Random(rows * dim, 4, 3.0f), u = Random(rows * dim, 5);
  std::vector<float> out(rows * dim);
  SiluMulParams p;
  p.gate = g.data();
  p.up = u.data();
  p.out = out.data();
  p.rows = rows;
  p.dim = dim;
  SiluMul(p);
  for (size_t i = 0; i < out.size(); ++i) {
    const double want = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
  }
}

// ---- Attention ----

struct AttnShape {
  int64_t heads, kv_heads, head_dim, block_size, window;
  float softcap;
};

// A sequence in an attention batch: `cached` tokens of context already in the cache, then
// `new_tokens` query tokens (a prefill chunk, or one decode token). `data` seeds its q/k/v, so the
// same sequence gets the same values whichever batch (and cache blocks) it lands in.
struct SeqSpec {
  int64_t cached, new_tokens;
  uint32_t data;
};

// Deterministic pseudo-random row for (seed, index, tag).
void FillRow(float* dst, int64_t n, uint32_t seed, int64_t index, uint32_t tag) {
  std::mt19937 rng(seed * 1000003u + static_cast<uint32_t>(index) * 7919u + tag * 104729u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) dst[i] = nd(rng);
}

// A batch of sequences over a shared paged cache whose blocks are handed out in scrambled order.
struct AttnBatch {
  AttnShape shape;
  std::vector<SeqSpec> seqs;
  std::vector<float> k_cache, v_cache, q;
  std::vector<int32_t> tables, token_seq, q_pos;
  std::vector<int64_t> first_token;  // per sequence: its first row in q/out
  int64_t max_blocks = 0, tokens = 0;

  AttentionParams Params(float* out, ThreadPool* pool) const {
    AttentionParams p;
    p.q = q.data();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.block_size = shape.block_size;
    p.num_heads = shape.heads;
    p.num_kv_heads = shape.kv_heads;
    p.head_dim = shape.head_dim;
    p.token_seq = token_seq.data();
    p.q_pos = q_pos.data();
    p.num_tokens = tokens;
    p.block_tables = tables.data();
    p.max_blocks_per_seq = max_blocks;
    p.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    p.sliding_window = shape.window;
    p.softcap = shape.softcap;
    p.pool = pool;
    p.out = out;
    return p;
  }
  // The output rows of sequence s.
  std::vector<float> SeqRows(const std::vector<float>& out, size_t s) const {
    const int64_t row = shape.heads * shape.head_dim;
    const auto* begin = out.data() + first_token[s] * row;
    return std::vector<float>(begin, begin + seqs[s].new_tokens * row);
  }
};

AttnBatch MakeBatch(const AttnShape& shape, const std::vector<SeqSpec>& seqs, uint32_t seed) {
  AttnBatch b;
  b.shape = shape;
  b.seqs = seqs;
  const int64_t kv_dim = shape.kv_heads * shape.head_dim, bs = shape.block_size;
  int64_t total_blocks = 0;
  for (const SeqSpec& s : seqs) {
    const int64_t blocks = (s.cached + s.new_tokens + bs - 1) / bs;
    b.max_blocks = std::max(b.max_blocks, blocks + 2);
    total_blocks += blocks;
  }
  const int64_t num_blocks = total_blocks + 7;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  b.k_cache.assign(num_blocks * bs * kv_dim, std::nanf(""));  // unused slots are poisoned
  b.v_cache = b.k_cache;
  b.tables.assign(seqs.size() * b.max_blocks, -1);
  int64_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqSpec& spec = seqs[s];
    const int64_t len = spec.cached + spec.new_tokens;
    for (int64_t i = 0; i < (len + bs - 1) / bs; ++i) b.tables[s * b.max_blocks + i] = perm[next++];
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot = b.tables[s * b.max_blocks + pos / bs] * bs + pos % bs;
      FillRow(b.k_cache.data() + slot * kv_dim, kv_dim, spec.data, pos, 1);
      FillRow(b.v_cache.data() + slot * kv_dim, kv_dim, spec.data, pos, 2);
    }
    b.first_token.push_back(b.tokens);
    for (int64_t pos = spec.cached; pos < len; ++pos) {
      b.token_seq.push_back(static_cast<int32_t>(s));
      b.q_pos.push_back(static_cast<int32_t>(pos));
      ++b.tokens;
    }
  }
  const int64_t q_row = shape.heads * shape.head_dim;
  b.q.resize(b.tokens * q_row);
  for (int64_t t = 0; t < b.tokens; ++t) {
    FillRow(b.q.data() + t * q_row, q_row, seqs[b.token_seq[t]].data, b.q_pos[t], 3);
  }
  return b;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

// Restores the active ISA when it goes out of scope.
class IsaRestore {
 public:
  IsaRestore() : isa_(ActiveIsa()) {}
  ~IsaRestore() { SetIsaForTesting(isa_); }

 private:
  Isa isa_;
};

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

enum class Scenario {
  kMixed,    // a 23-token chunk after 40 cached tokens, and a decode token at position 150
  kLong,     // 130-token chunk after 1000 cached, decodes at 1200 and 1536, a fresh 37-token prompt
  kPrefill,  // one 300-token prompt from position 0
};

struct AttnCase {
  AttnShape shape;
  Scenario scenario;
};

std::vector<SeqSpec> ScenarioSeqs(Scenario s) {
  switch (s) {
    case Scenario::kMixed:
      return {{40, 23, 11}, {150, 1, 12}};
    case Scenario::kLong:
      return {{1000, 130, 21}, {1200, 1, 22}, {0, 37, 23}, {1536, 1, 24}};
    case Scenario::kPrefill:
      return {{0, 300, 31}};
  }
  return {};
}

class AttentionConformance : public ::testing::TestWithParam<AttnCase> {};

// Every supported ISA, 1 and 3 threads, against the double-precision reference.
TEST_P(AttentionConformance, MatchesReference) {
  const AttnCase c = GetParam();
  const AttnBatch b = MakeBatch(c.shape, ScenarioSeqs(c.scenario), 8);
  const int64_t n = b.tokens * c.shape.heads * c.shape.head_dim;
  std::vector<float> want(n);
  AttentionReference(b.Params(want.data(), nullptr));
  IsaRestore restore;
  ThreadPool pool(3);
  for (Isa isa : SupportedIsas()) {
    SetIsaForTesting(isa);
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
      SCOPED_TRACE(std::string(IsaName(isa)) + (tp ? " 3 threads" : " 1 thread"));
      std::vector<float> got(n, std::nanf(""));
      Attention(b.Params(got.data(), tp));
      ExpectClose(got, want, 1e-5f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionConformance,
    ::testing::Values(AttnCase{{4, 4, 64, 16, 0, 0}, Scenario::kMixed},
                      AttnCase{{8, 2, 64, 16, 0, 0}, Scenario::kMixed},
                      AttnCase{{9, 3, 64, 8, 0, 0}, Scenario::kMixed},
                      AttnCase{{4, 1, 128, 16, 24, 0}, Scenario::kMixed},
                      AttnCase{{4, 2, 32, 32, 7, 0}, Scenario::kMixed},
                      AttnCase{{4, 2, 64, 16, 0, 50.0f}, Scenario::kMixed},
                      // Long contexts, chunked prefill after cached context, GQA groups 1/3/4/8.
                      AttnCase{{9, 3, 64, 16, 0, 0}, Scenario::kLong},
                      AttnCase{{4, 4, 128, 32, 0, 0}, Scenario::kLong},
                      AttnCase{{8, 2, 128, 16, 0, 0}, Scenario::kLong},
                      AttnCase{{8, 1, 64, 32, 0, 0}, Scenario::kLong},
                      AttnCase{{6, 2, 64, 16, 300, 0}, Scenario::kLong},
                      AttnCase{{8, 2, 128, 32, 0, 30.0f}, Scenario::kLong},
                      AttnCase{{8, 4, 128, 16, 700, 50.0f}, Scenario::kLong},
                      AttnCase{{9, 3, 64, 16, 0, 0}, Scenario::kPrefill},
                      AttnCase{{16, 2, 128, 32, 100, 0}, Scenario::kPrefill},
                      // Head dims off the vector width, and a wide one.
                      AttnCase{{3, 1, 40, 16, 0, 0}, Scenario::kMixed},
                      AttnCase{{4, 2, 72, 8, 0, 20.0f}, Scenario::kLong},
                      AttnCase{{2, 1, 256, 16, 0, 0}, Scenario::kLong},
                      AttnCase{{5, 5, 80, 16, 50, 0}, Scenario::kMixed}));

// A sequence's outputs do not depend on the other sequences in the batch, on the thread count
// (which changes the tiling and whether keys are split across tasks), nor on how its query
// tokens are split into chunks: bitwise, for every ISA.
TEST(AttentionInvariance, BatchAndThreadsBitwise) {
  const AttnShape shape{9, 3, 64, 16, 0, 0};
  const SeqSpec prefill{1000, 130, 41}, decode{1100, 1, 42};
  const std::vector<SeqSpec> others = {{300, 1, 43}, {20, 60, 44}, {2047, 1, 45}};
  ThreadPool pool2(2), pool4(4);
  IsaRestore restore;
  for (Isa isa : SupportedIsas()) {
    SetIsaForTesting(isa);
    SCOPED_TRACE(IsaName(isa));
    for (const SeqSpec& target : {prefill, decode}) {
      // Alone, one thread.
      const AttnBatch alone = MakeBatch(shape, {target}, 1);
      std::vector<float> want(alone.tokens * shape.heads * shape.head_dim);
      Attention(alone.Params(want.data(), nullptr));
      {
        std::vector<float> ref(want.size());
        AttentionReference(alone.Params(ref.data(), nullptr));
        ExpectClose(want, ref, 1e-5f);
      }
      // Alone and in two different batches (with the target's index there), on 1, 2 and 4
      // threads.
      const std::vector<std::pair<AttnBatch, size_t>> batches = {
          {alone, 0},
          {MakeBatch(shape, {others[0], target, others[1]}, 2), 1},
          {MakeBatch(shape, {others[2], others[1], others[0], target}, 3), 3}};
      for (const auto& [b, index] : batches) {
        for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool2, &pool4}) {
          std::vector<float> out(b.tokens * shape.heads * shape.head_dim);
          Attention(b.Params(out.data(), tp));
          EXPECT_TRUE(BitwiseEqual(b.SeqRows(out, index), want))
              << "batch of " << b.seqs.size() << ", " << (tp ? tp->num_threads() : 1)
              << " threads, " << target.new_tokens << " query tokens";
        }
      }
      // The prefill chunk split in two chunks: the same bits per token.
      if (target.new_tokens > 1) {
        const int64_t first = 57, row = shape.heads * shape.head_dim;
        const AttnBatch a = MakeBatch(shape, {{target.cached, first, target.data}}, 4);
        const AttnBatch b =
            MakeBatch(shape, {{target.cached + first, target.new_tokens - first, target.data}}, 5);
        std::vector<float> out_a(a.tokens * row), out_b(b.tokens * row);
        Attention(a.Params(out_a.data(), &pool4));
        Attention(b.Params(out_b.data(), &pool2));
        out_a.insert(out_a.end(), out_b.begin(), out_b.end());
        EXPECT_TRUE(BitwiseEqual(out_a, want)) << "prefill split into chunks";
      }
    }
  }
}

// ---- Attention perf (DINFER_CONFORMANCE_PERF=1) ----

// The kernel this file's Attention replaced (one task per token and head, a dot product per key,
// two passes over a scores buffer), kept to report the speed-up.
namespace legacy {

#define DINFER_LEGACY_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

DINFER_LEGACY_MULTIVERSION float Dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

DINFER_LEGACY_MULTIVERSION void Axpy(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

DINFER_LEGACY_MULTIVERSION void Scale(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

const float* KvRow(const float* cache, const int32_t* table, int64_t block_size, int64_t kv_dim,
                   int64_t pos) {
  const int64_t block = table[pos / block_size];
  return cache + (block * block_size + pos % block_size) * kv_dim;
}

void LegacyAttention(const AttentionParams& p) {
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  const int64_t qs = p.q_stride ? p.q_stride : p.num_heads * p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  auto task = [&](int, int64_t index) {
    const int64_t t = index / p.num_heads;
    const int64_t h = index % p.num_heads;
    const int64_t kvh = h / group;
    const int32_t* table = p.block_tables + p.token_seq[t] * p.max_blocks_per_seq;
    const int64_t pos = p.q_pos[t];
    const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
    const int64_t n = pos - lo + 1;
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(n));
    const float* q = p.q + t * qs + h * p.head_dim;
    float max_score = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* k = KvRow(p.k_cache, table, p.block_size, kv_dim, lo + j) + kvh * p.head_dim;
      float s = Dot(q, k, p.head_dim) * p.scale;
      if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
      scores[j] = s;
      max_score = std::max(max_score, s);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    float* out = p.out + (t * p.num_heads + h) * p.head_dim;
    std::memset(out, 0, sizeof(float) * p.head_dim);
    for (int64_t j = 0; j < n; ++j) {
      const float* v = KvRow(p.v_cache, table, p.block_size, kv_dim, lo + j) + kvh * p.head_dim;
      Axpy(out, v, scores[j], p.head_dim);
    }
    Scale(out, 1.0f / sum, p.head_dim);
  };
  const int64_t tasks = p.num_tokens * p.num_heads;
  if (p.pool != nullptr) {
    p.pool->ParallelFor(tasks, task);
  } else {
    for (int64_t i = 0; i < tasks; ++i) task(0, i);
  }
}

}  // namespace legacy

double SecondsPerCall(const std::function<void()>& fn, int min_iters, double min_seconds) {
  fn();  // warm up
  int iters = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (iters < min_iters || elapsed < min_seconds) {
    fn();
    ++iters;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return elapsed / iters;
}

// GFLOP/s counted as 4 * head_dim * heads per (query, attended key) pair (a causal prompt of n
// tokens attends n(n+1)/2 pairs). DINFER_PERF_THREADS
// (e.g. "1,2,8") picks the thread counts, DINFER_PERF_ISAS (e.g. "avx512,avx2") the ISAs and
// DINFER_PERF_WORKLOADS (e.g. "prefill") the workloads by name; DINFER_PERF_LEGACY=0 skips the
// old kernel.
TEST(AttentionPerf, Throughput) {
  const char* env = std::getenv("DINFER_CONFORMANCE_PERF");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set DINFER_CONFORMANCE_PERF=1";
  std::vector<int> thread_counts = {1, 2};
  if (const char* t = std::getenv("DINFER_PERF_THREADS")) {
    thread_counts.clear();
    for (const char* s = t; *s != '\0';) {
      char* end = nullptr;
      thread_counts.push_back(static_cast<int>(std::strtol(s, &end, 10)));
      s = *end == ',' ? end + 1 : end;
    }
  }
  const AttnShape shape{9, 3, 64, 16, 0, 0};  // SmolLM2-135M
  struct Workload {
    const char* name;
    std::vector<SeqSpec> seqs;
  };
  const std::vector<Workload> workloads = {
      {"prefill 1x1024", {{0, 1024, 1}}},
      {"decode 4x1000", {{999, 1, 1}, {999, 1, 2}, {999, 1, 3}, {999, 1, 4}}},
      {"decode 1x4000", {{3999, 1, 1}}},
      {"decode 4x250", {{249, 1, 1}, {249, 1, 2}, {249, 1, 3}, {249, 1, 4}}},
  };
  std::printf("%-15s %-7s %3s %12s %12s %12s %12s %8s\n", "workload", "isa", "thr", "legacy us",
              "legacy GF/s", "new us", "new GF/s", "speedup");
  // Whether a comma-separated item of the filter in env_name occurs in `name` (no filter: all).
  const auto selected = [](const char* env_name, std::string_view name) {
    const char* filter = std::getenv(env_name);
    if (filter == nullptr) return true;
    for (std::string_view rest = filter; !rest.empty();) {
      const size_t comma = std::min(rest.find(','), rest.size());
      if (comma > 0 && name.find(rest.substr(0, comma)) != std::string_view::npos) return true;
      rest.remove_prefix(std::min(comma + 1, rest.size()));
    }
    return false;
  };
  const char* legacy_env = std::getenv("DINFER_PERF_LEGACY");
  const bool run_legacy = legacy_env == nullptr || std::string(legacy_env) != "0";
  IsaRestore restore;
  for (const Workload& w : workloads) {
    if (!selected("DINFER_PERF_WORKLOADS", w.name)) continue;
    const AttnBatch b = MakeBatch(shape, w.seqs, 1);
    double pairs = 0;
    for (int64_t t = 0; t < b.tokens; ++t) pairs += b.q_pos[t] + 1;
    const double flops = 4.0 * pairs * shape.head_dim * shape.heads;
    std::vector<float> out(b.tokens * shape.heads * shape.head_dim);
    for (int threads : thread_counts) {
      ThreadPool pool(threads);
      const AttentionParams p = b.Params(out.data(), threads > 1 ? &pool : nullptr);
      const double legacy_s =
          run_legacy ? SecondsPerCall([&] { legacy::LegacyAttention(p); }, 3, 0.3) : 0.0;
      for (Isa isa : SupportedIsas()) {
        if (!selected("DINFER_PERF_ISAS", IsaName(isa))) continue;
        SetIsaForTesting(isa);
        const double s = SecondsPerCall([&] { Attention(p); }, 3, 0.3);
        std::printf("%-15s %-7s %3d %12.1f %12.2f %12.1f %12.2f %7.1fx\n", w.name,
                    std::string(IsaName(isa)).c_str(), threads, legacy_s * 1e6,
                    flops / legacy_s / 1e9, s * 1e6, flops / s / 1e9, legacy_s / s);
      }
    }
  }
}

}  // namespace
}  // namespace dinfer::kernels::cpu
