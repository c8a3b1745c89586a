// DeepSeek-V4's CPU kernels against plain references: sparse attention (window + compressed
// entries + sinks), the compressors' online pooling (also continued across calls from the paged
// state, as decode and chunked prefill do), the indexer's top-k, hyper-connections, MoE routing,
// the trailing / inverse rotary, the FP8 / FP4 element formats and their repacking.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/deepseek_v4.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu {
namespace {

ThreadPool& Pool() {
  static ThreadPool pool(3);
  return pool;
}

std::vector<float> Random(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// A batch of sequences laid out in a paged cache: per token its sequence and position, per
// sequence a scrambled block table.
struct Batch {
  int64_t block_size = 0, max_blocks = 0, num_blocks = 0;
  std::vector<int32_t> token_seq, positions, tables;

  // Sequence s holds positions [starts[s], ends[s]) in this batch.
  Batch(int64_t bs, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends)
      : block_size(bs) {
    int64_t longest = 0;
    for (int64_t e : ends) longest = std::max(longest, e);
    max_blocks = (longest + bs - 1) / bs;
    num_blocks = max_blocks * static_cast<int64_t>(ends.size());
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
    tables = ids;
    for (size_t s = 0; s < ends.size(); ++s) {
      for (int64_t p = starts[s]; p < ends[s]; ++p) {
        token_seq.push_back(static_cast<int32_t>(s));
        positions.push_back(static_cast<int32_t>(p));
      }
    }
  }
  int64_t tokens() const { return static_cast<int64_t>(positions.size()); }
};

TEST(SparseAttentionTest, MatchesReference) {
  const int64_t heads = 8, d = 64, window = 5, bs = 4;
  for (int64_t rate : {2, 8}) {
    for (bool indexed : {false, true}) {
      for (bool bf16 : {false, true}) {
        const Batch b(bs, {0, 3}, {19, 11});
        const int64_t rpb = std::max<int64_t>(1, bs / rate);
        const auto q = Random(b.tokens() * heads * d, 1);
        auto window_kv = Random(b.num_blocks * bs * d, 2);
        auto compressed = Random(b.num_blocks * rpb * d, 3);
        // bf16 planes: the reference reads the same values widened to f32.
        std::vector<uint16_t> window_bf16(window_kv.size()), compressed_bf16(compressed.size());
        if (bf16) {
          for (size_t i = 0; i < window_kv.size(); ++i) {
            window_bf16[i] = F32ToBf16(window_kv[i]);
            window_kv[i] = Bf16ToF32(window_bf16[i]);
          }
          for (size_t i = 0; i < compressed.size(); ++i) {
            compressed_bf16[i] = F32ToBf16(compressed[i]);
            compressed[i] = Bf16ToF32(compressed_bf16[i]);
          }
        }
        const auto sinks = Random(heads, 4);
        const int64_t k = 3;
        std::vector<int32_t> selected(b.tokens() * k);
        std::mt19937 rng(6);
        for (int64_t t = 0; t < b.tokens(); ++t) {
          const int64_t valid = (b.positions[t] + 1) / rate;
          for (int64_t i = 0; i < k; ++i) {
            selected[t * k + i] = i < valid ? static_cast<int32_t>(rng() % valid) : -1;
          }
        }
        SparseAttentionParams p;
        p.q = q.data();
        p.q_stride = heads * d;
        p.out_stride = heads * d;
        p.num_tokens = b.tokens();
        p.num_heads = heads;
        p.head_dim = d;
        p.scale = 0.125f;
        p.sinks = sinks.data();
        p.token_seq = b.token_seq.data();
        p.q_pos = b.positions.data();
        p.block_tables = b.tables.data();
        p.max_blocks_per_seq = b.max_blocks;
        p.block_size = bs;
        p.window_kv = window_kv.data();
        p.window = window;
        p.compressed = compressed.data();
        p.rate = rate;
        p.rows_per_block = rpb;
        if (indexed) {
          p.selected = selected.data();
          p.num_selected = k;
        }
        std::vector<float> want(b.tokens() * heads * d), got(want.size());
        p.out = want.data();
        SparseAttentionReference(p);
        if (bf16) {
          p.window_kv = window_bf16.data();
          p.window_dtype = KvDType::kBF16;
          p.compressed = compressed_bf16.data();
          p.compressed_dtype = KvDType::kBF16;
        }
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &Pool()}) {
          SCOPED_TRACE("rate " + std::to_string(rate) + (indexed ? " indexed" : "") +
                       (bf16 ? " bf16" : "") + (pool ? " pool" : ""));
          p.out = got.data();
          p.pool = pool;
          SparseAttention(p);
          for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6) << i;
        }
      }
    }
  }
}

// Without a sink and with a single key, attention returns that key.
TEST(SparseAttentionTest, SingleKeyNoSink) {
  const int64_t d = 16;
  const Batch b(4, {0}, {1});
  const auto q = Random(2 * d, 1);
  const auto kv = Random(b.num_blocks * 4 * d, 2);
  std::vector<float> out(2 * d);
  SparseAttentionParams p;
  p.q = q.data();
  p.q_stride = 2 * d;
  p.out = out.data();
  p.out_stride = 2 * d;
  p.num_tokens = 1;
  p.num_heads = 2;
  p.head_dim = d;
  p.token_seq = b.token_seq.data();
  p.q_pos = b.positions.data();
  p.block_tables = b.tables.data();
  p.max_blocks_per_seq = b.max_blocks;
  p.block_size = 4;
  p.window_kv = kv.data();
  p.window = 3;
  SparseAttention(p);
  const float* key = kv.data() + b.tables[0] * 4 * d;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < d; ++i) EXPECT_FLOAT_EQ(out[h * d + i], key[i]);
  }
}

struct CompressorCase {
  int64_t rate, block_size;
  bool overlap;
};

// Entries pooled over the whole batch at once, and pooled while the same sequences arrive in
// pieces (a chunk ending mid-window, then single tokens, then the rest), match the two-pass
// reference.
TEST(CompressorTest, MatchesReferenceWholeAndInPieces) {
  for (const CompressorCase& c :
       {CompressorCase{4, 8, true}, CompressorCase{4, 4, true}, CompressorCase{8, 4, false},
        CompressorCase{3, 6, false}, CompressorCase{16, 4, false}}) {
    SCOPED_TRACE("rate " + std::to_string(c.rate) + " block " + std::to_string(c.block_size) +
                 (c.overlap ? " overlap" : ""));
    const int64_t dim = 70, width = dim * (c.overlap ? 2 : 1);
    const std::vector<int64_t> lens = {37, 21};
    const Batch whole(c.block_size, {0, 0}, lens);
    const int64_t n = whole.tokens();
    const auto kv = Random(n * width, 11), gate = Random(n * width, 12, 2.0f);
    const auto bias = Random(c.rate * width, 13);
    std::vector<int32_t> entry_row(n, -1);
    int32_t entries = 0;
    for (int64_t t = 0; t < n; ++t) {
      if ((whole.positions[t] + 1) % c.rate == 0) entry_row[t] = entries++;
    }
    const int64_t state_width = CompressorStateWidth(dim, c.overlap);
    std::vector<float> state(whole.num_blocks * state_width, NAN);
    std::vector<float> want(entries * dim), got(entries * dim, NAN);
    CompressorParams p;
    p.kv = kv.data();
    p.gate = gate.data();
    p.kv_stride = width;
    p.gate_stride = width;
    p.bias = bias.data();
    p.num_tokens = n;
    p.dim = dim;
    p.rate = c.rate;
    p.overlap = c.overlap;
    p.token_seq = whole.token_seq.data();
    p.positions = whole.positions.data();
    p.block_tables = whole.tables.data();
    p.max_blocks_per_seq = whole.max_blocks;
    p.block_size = c.block_size;
    p.state = state.data();
    p.entry_row = entry_row.data();
    p.entries = want.data();
    CompressorReference(p);
    p.entries = got.data();
    p.pool = &Pool();
    Compressor(p);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;

    // The same tokens in steps: [0, 5), then 7 single tokens, then the rest, per sequence.
    std::fill(got.begin(), got.end(), NAN);
    std::fill(state.begin(), state.end(), NAN);
    const std::vector<int64_t> cuts = {0, 5, 6, 7, 8, 9, 10, 11, 12};
    auto offset = [&](int64_t s) { return s == 0 ? 0 : lens[0]; };
    for (size_t step = 0; step < cuts.size(); ++step) {
      std::vector<int64_t> rows;  // rows of the whole batch in this step
      for (int64_t s = 0; s < 2; ++s) {
        const int64_t end = step + 1 < cuts.size() ? cuts[step + 1] : lens[s];
        for (int64_t pos = cuts[step]; pos < std::min(end, lens[s]); ++pos) {
          rows.push_back(offset(s) + pos);
        }
      }
      std::vector<float> skv, sgate;
      std::vector<int32_t> seq, pos, row;
      for (int64_t r : rows) {
        skv.insert(skv.end(), kv.begin() + r * width, kv.begin() + (r + 1) * width);
        sgate.insert(sgate.end(), gate.begin() + r * width, gate.begin() + (r + 1) * width);
        seq.push_back(whole.token_seq[r]);
        pos.push_back(whole.positions[r]);
        row.push_back(entry_row[r]);
      }
      CompressorParams s = p;
      s.kv = skv.data();
      s.gate = sgate.data();
      s.num_tokens = static_cast<int64_t>(rows.size());
      s.token_seq = seq.data();
      s.positions = pos.data();
      s.entry_row = row.data();
      s.pool = step % 2 ? &Pool() : nullptr;
      Compressor(s);
    }
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

TEST(IndexerTest, TopKMatchesReference) {
  const int64_t heads = 4, d = 32, rate = 4, bs = 8;
  const Batch b(bs, {0, 9}, {40, 30});
  const int64_t rpb = bs / rate;
  const auto q = Random(b.tokens() * heads * d, 21);
  const auto weights = Random(b.tokens() * heads, 22);
  const auto keys = Random(b.num_blocks * rpb * d, 23);
  // bf16 keys: the reference reads the same values widened to f32.
  std::vector<uint16_t> keys_bf16(keys.size());
  std::vector<float> keys_widened(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys_bf16[i] = F32ToBf16(keys[i]);
    keys_widened[i] = Bf16ToF32(keys_bf16[i]);
  }
  for (int64_t topk : {1, 3, 16}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("topk " + std::to_string(topk) + (bf16 ? " bf16" : ""));
      IndexerParams p;
      p.q = q.data();
      p.q_stride = heads * d;
      p.weights = weights.data();
      p.weights_stride = heads;
      p.num_tokens = b.tokens();
      p.num_heads = heads;
      p.head_dim = d;
      p.scale = 0.2f;
      p.keys = bf16 ? keys_widened.data() : keys.data();
      p.rate = rate;
      p.rows_per_block = rpb;
      p.token_seq = b.token_seq.data();
      p.q_pos = b.positions.data();
      p.block_tables = b.tables.data();
      p.max_blocks_per_seq = b.max_blocks;
      p.block_size = bs;
      p.topk = topk;
      std::vector<int32_t> want(b.tokens() * topk), got(want.size());
      p.selected = want.data();
      IndexerTopKReference(p);
      if (bf16) {
        p.keys = keys_bf16.data();
        p.keys_dtype = KvDType::kBF16;
      }
      p.selected = got.data();
      p.pool = &Pool();
      IndexerTopK(p);
      for (int64_t t = 0; t < b.tokens(); ++t) {
        const int64_t valid = (b.positions[t] + 1) / rate;
        std::multiset<int32_t> g(got.begin() + t * topk, got.begin() + (t + 1) * topk);
        std::multiset<int32_t> w(want.begin() + t * topk, want.begin() + (t + 1) * topk);
        ASSERT_EQ(g, w) << "token " << t;
        EXPECT_EQ(static_cast<int64_t>(g.count(-1)), std::max<int64_t>(0, topk - valid));
      }
    }
  }
}

TEST(HyperConnectionTest, SinkhornAndMixingMatchDoubleReference) {
  const int64_t hc = 4, dim = 24, n = 3, mix = (2 + hc) * hc, iters = 20;
  const float eps = 1e-6f;
  const auto streams = Random(n * hc * dim, 31), mixes = Random(n * mix, 32, 3.0f);
  const auto base = Random(mix, 33), scale = Random(3, 34);
  std::vector<float> collapsed(n * dim), post(n * hc), comb(n * hc * hc), out(n * hc * dim);
  HcPreParams p{streams.data(), mixes.data(), base.data(),      scale.data(), n,          hc, dim,
                iters,          eps,          collapsed.data(), post.data(),  comb.data()};
  HcPre(p);
  const auto y = Random(n * dim, 35);
  HcPost({streams.data(), y.data(), post.data(), comb.data(), n, hc, dim, out.data()});
  for (int64_t t = 0; t < n; ++t) {
    const float* m = mixes.data() + t * mix;
    auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
    std::vector<double> c(hc * hc);
    for (int64_t r = 0; r < hc; ++r) {
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < hc; ++k) {
        c[r * hc + k] = double{m[2 * hc + r * hc + k]} * scale[2] + base[2 * hc + r * hc + k];
        mx = std::max(mx, c[r * hc + k]);
      }
      for (int64_t k = 0; k < hc; ++k) sum += (c[r * hc + k] = std::exp(c[r * hc + k] - mx));
      for (int64_t k = 0; k < hc; ++k) c[r * hc + k] = c[r * hc + k] / sum + eps;
    }
    for (int64_t it = 0; it < iters; ++it) {
      if (it > 0) {
        for (int64_t r = 0; r < hc; ++r) {
          double sum = 0;
          for (int64_t k = 0; k < hc; ++k) sum += c[r * hc + k];
          for (int64_t k = 0; k < hc; ++k) c[r * hc + k] /= sum + eps;
        }
      }
      for (int64_t k = 0; k < hc; ++k) {
        double sum = 0;
        for (int64_t r = 0; r < hc; ++r) sum += c[r * hc + k];
        for (int64_t r = 0; r < hc; ++r) c[r * hc + k] /= sum + eps;
      }
    }
    for (int64_t i = 0; i < hc * hc; ++i) ASSERT_NEAR(comb[t * hc * hc + i], c[i], 1e-5);
    for (int64_t k = 0; k < hc; ++k) {
      double col = 0;
      for (int64_t r = 0; r < hc; ++r) col += c[r * hc + k];
      EXPECT_NEAR(col, 1.0, 1e-4);  // Sinkhorn's fixed point is doubly stochastic
    }
    for (int64_t d = 0; d < dim; ++d) {
      double want = 0;
      for (int64_t i = 0; i < hc; ++i) {
        want +=
            (sigmoid(double{m[i]} * scale[0] + base[i]) + eps) * streams[(t * hc + i) * dim + d];
      }
      ASSERT_NEAR(collapsed[t * dim + d], want, 1e-5);
    }
    for (int64_t k = 0; k < hc; ++k) {
      const double pk = 2 * sigmoid(double{m[hc + k]} * scale[1] + base[hc + k]);
      ASSERT_NEAR(post[t * hc + k], pk, 1e-6);
      for (int64_t d = 0; d < dim; ++d) {
        double want = pk * y[t * dim + d];
        for (int64_t j = 0; j < hc; ++j) want += c[j * hc + k] * streams[(t * hc + j) * dim + d];
        ASSERT_NEAR(out[(t * hc + k) * dim + d], want, 1e-5);
      }
    }
  }
}

TEST(RouterTest, ScoreCorrectedTopKAndHash) {
  const int64_t n = 5, e = 12, k = 3;
  const auto logits = Random(n * e, 41, 3.0f), bias = Random(e, 42, 0.5f);
  std::vector<int32_t> experts(n * k), hash(n * k);
  std::vector<float> weights(n * k);
  for (int64_t i = 0; i < n * k; ++i) hash[i] = static_cast<int32_t>((i * 5) % e);
  for (bool hashed : {false, true}) {
    RouterParams p;
    p.logits = logits.data();
    p.num_tokens = n;
    p.num_experts = e;
    p.top_k = k;
    p.bias = bias.data();
    p.hash_experts = hashed ? hash.data() : nullptr;
    p.scaling = 1.5f;
    p.experts = experts.data();
    p.weights = weights.data();
    Route(p);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> score(e);
      for (int64_t i = 0; i < e; ++i) {
        const double x = logits[t * e + i];
        score[i] = std::sqrt(x > 20 ? x : std::log1p(std::exp(x)));
      }
      std::vector<int32_t> want(k);
      if (hashed) {
        std::copy(hash.begin() + t * k, hash.begin() + (t + 1) * k, want.begin());
      } else {
        std::vector<int32_t> order(e);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(),
                  [&](int a, int b) { return score[a] + bias[a] > score[b] + bias[b]; });
        std::copy(order.begin(), order.begin() + k, want.begin());
      }
      double sum = 0;
      for (int32_t x : want) sum += score[x];
      for (int64_t i = 0; i < k; ++i) {
        ASSERT_EQ(experts[t * k + i], want[i]);
        ASSERT_NEAR(weights[t * k + i], score[want[i]] / sum * 1.5, 1e-6);
      }
    }
  }
}

TEST(RopeTest, TrailingInterleavedAndInverse) {
  const int64_t rows = 3, heads = 2, d = 16, rd = 6;
  const std::vector<int32_t> positions = {0, 5, 77};
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f};
  const auto x = Random(rows * heads * d, 51);
  std::vector<float> got = x, want = x;
  RopeParams p;
  p.rows = rows;
  p.num_heads = heads;
  p.head_dim = d;
  p.rotary_dim = rd;
  p.rotary_offset = d - rd;
  p.positions = positions.data();
  p.inv_freq = inv_freq.data();
  p.interleaved = true;
  p.x = got.data();
  Rope(p);
  p.x = want.data();
  RopeReference(p);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t o = (r * heads + h) * d;
      for (int64_t i = 0; i < d - rd; ++i) ASSERT_EQ(got[o + i], x[o + i]);  // leading dims kept
      for (int64_t i = 0; i < rd / 2; ++i) {
        const double a = positions[r] * double{inv_freq[i]};
        const double x0 = x[o + d - rd + 2 * i], x1 = x[o + d - rd + 2 * i + 1];
        ASSERT_NEAR(got[o + d - rd + 2 * i], x0 * std::cos(a) - x1 * std::sin(a), 1e-5);
        ASSERT_NEAR(got[o + d - rd + 2 * i + 1], x1 * std::cos(a) + x0 * std::sin(a), 1e-5);
      }
    }
  }
  p.x = got.data();
  p.inverse = true;
  Rope(p);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 1e-5);
}

TEST(Fp8Test, ElementFormats) {
  EXPECT_EQ(E4M3ToF32(0x00), 0.0f);
  EXPECT_EQ(E4M3ToF32(0x38), 1.0f);                  // exponent 7 = bias
  EXPECT_EQ(E4M3ToF32(0x7e), 448.0f);                // the largest finite value
  EXPECT_EQ(E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(E4M3ToF32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(E4M3ToF32(0xff)));
  EXPECT_EQ(E8M0ToF32(127), 1.0f);
  EXPECT_EQ(E8M0ToF32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(E8M0ToF32(0xff)));
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(E2M1ToF32(c), e2m1[c]) << int{c};
}

// Repacking a checkpoint's FP8 weight + block scales and FP4 weight + scales keeps every value.
TEST(Fp8Test, RepackKeepsValues) {
  std::mt19937 rng(61);
  const int64_t rows = 5, cols = 96, br = 2, bc = 64;
  std::vector<uint8_t> w8(rows * cols);
  for (auto& b : w8) b = static_cast<uint8_t>(rng() % 0x7f);  // finite, positive and negative
  for (size_t i = 0; i < w8.size(); i += 3) w8[i] |= 0x80;
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  std::vector<float> scales(sr * sc);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = std::ldexp(1.0f, static_cast<int>(i) - 3);
  std::vector<BlockF8E4M3B32> packed(rows * cols / 32);
  RepackF8E4M3(w8.data(), scales.data(), rows, cols, br, bc, packed.data());
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(DType::kF8E4M3B32, packed.data() + r * cols / 32, row.data(), cols);
    for (int64_t i = 0; i < cols; ++i) {
      ASSERT_EQ(row[i], E4M3ToF32(w8[r * cols + i]) * scales[(r / br) * sc + i / bc]);
    }
  }
  std::vector<uint8_t> w4(rows * cols / 2);
  for (auto& b : w4) b = static_cast<uint8_t>(rng());
  std::vector<float> s4(rows * cols / 32);
  for (size_t i = 0; i < s4.size(); ++i) s4[i] = std::ldexp(1.0f, static_cast<int>(i % 7) - 4);
  std::vector<BlockMxfp4> packed4(rows * cols / 32);
  ASSERT_TRUE(RepackMxfp4(w4.data(), s4.data(), rows, cols, packed4.data()));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(DType::kMxfp4, packed4.data() + r * cols / 32, row.data(), cols);
    for (int64_t i = 0; i < cols; ++i) {
      const uint8_t byte = w4[r * cols / 2 + i / 2];
      const uint8_t code = i % 2 == 0 ? byte & 0xf : byte >> 4;
      ASSERT_EQ(row[i], E2M1ToF32(code) * s4[r * cols / 32 + i / 32]);
    }
  }
  s4[3] = 0.3f;  // not a power of two: UE8M0 cannot hold it
  EXPECT_FALSE(RepackMxfp4(w4.data(), s4.data(), rows, cols, packed4.data()));
}

// Every code of both formats decodes to the same bits on every instruction set.
TEST(Fp8Test, RowDequantizationSameOnEveryIsa) {
  std::vector<BlockF8E4M3B32> f8(8);
  std::vector<BlockMxfp4> f4(16);
  for (int i = 0; i < 256; ++i) f8[i / 32].qs[i % 32] = static_cast<uint8_t>(i);
  for (int b = 0; b < 8; ++b) f8[b].d = std::ldexp(1.0f, b - 3);
  for (int i = 0; i < 256; ++i) f4[i / 16].qs[i % 16] = static_cast<uint8_t>(i);
  for (int b = 0; b < 16; ++b) f4[b].e = static_cast<uint8_t>(120 + b);
  const Isa saved = ActiveIsa();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    SetIsaForTesting(isa);
    SCOPED_TRACE(std::string(IsaName(isa)));
    std::vector<float> out(512);
    DequantizeRow(DType::kF8E4M3B32, f8.data(), out.data(), 256);
    for (int i = 0; i < 256; ++i) {
      const float want = E4M3ToF32(static_cast<uint8_t>(i)) * f8[i / 32].d;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << i;
      } else {
        EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want)) << i;
      }
    }
    DequantizeRow(DType::kMxfp4, f4.data(), out.data(), 512);
    for (int i = 0; i < 512; ++i) {
      const uint8_t byte = static_cast<uint8_t>(i / 2);
      const float want = E2M1ToF32(i % 2 ? byte >> 4 : byte & 0xf) * E8M0ToF32(f4[i / 32].e);
      EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want)) << i;
    }
  }
  SetIsaForTesting(saved);
}

}  // namespace
}  // namespace dinfer::kernels::cpu
