// DeepSeek-V4's compressor (pooling, norm, rotary, paged store) and the lightning indexer's top-k
// on the GPU against the CPU kernels of kernels/cpu/deepseek_v4.h (+ RmsNorm and Rope of
// kernels/cpu/ops.h, as the compressed-attention layer applies them): several sequences in one
// batch, chunked continuation across calls (state carried in the paged state rows), a prefix hit
// starting at a block boundary with the CPU's state from before, and a bounded replay; timings of
// the V4-Flash shapes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <set>

#include "gpu_test_util.h"
#include "kernels/cpu/deepseek_v4.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/v4_compress.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;
namespace cpu = kernels::cpu;

std::vector<float> InvFreq(int64_t rotary_dim) {
  std::vector<float> inv(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    inv[i] = 1.0f / std::pow(10000.0f, 2.0f * static_cast<float>(i) / rotary_dim);
  }
  return inv;
}

cpu::KvDType KvType(DType d) {
  return d == DType::kBF16 ? cpu::KvDType::kBF16 : cpu::KvDType::kF32;
}

// A plane of `n` elements of `dtype` on the host (bf16 as raw bits), filled with NaN.
struct HostPlane {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  HostPlane(DType d, size_t n) : dtype(d) {
    if (d == DType::kF32) {
      f32.assign(n, NAN);
    } else {
      bf16.assign(n, 0xffff);
    }
  }
  void* data() {
    return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : static_cast<void*>(bf16.data());
  }
  size_t bytes() const { return dtype == DType::kF32 ? f32.size() * 4 : bf16.size() * 2; }
  std::vector<float> Values() const {
    if (dtype == DType::kF32) return f32;
    std::vector<float> v(bf16.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = Bf16ToF32(bf16[i]);
    return v;
  }
};

cuda::DeviceBuffer UploadBytes(const void* p, size_t bytes) {
  auto b = cuda::DeviceBuffer::Allocate(std::max<size_t>(bytes, 1));
  EXPECT_TRUE(b.ok());
  EXPECT_TRUE(b->CopyFromHost(p, bytes).ok());
  return std::move(*b);
}

// Element-wise: the same non-finite pattern (unwritten rows NaN on both sides, cleared maxima
// -inf), and the norm-wise relative error of the finite elements within tol.
void ExpectPlanesMatch(const std::vector<float>& got, const std::vector<float>& want, double tol,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  std::vector<float> g, w;
  int64_t pattern = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isfinite(want[i]) && std::isfinite(got[i])) {
      g.push_back(got[i]);
      w.push_back(want[i]);
    } else if (std::isnan(want[i]) != std::isnan(got[i]) ||
               (!std::isnan(want[i]) && got[i] != want[i])) {
      if (++pattern <= 3)
        ADD_FAILURE() << what << " element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(pattern, 0) << what;
  EXPECT_FALSE(w.empty()) << what << ": nothing written";
  const double err = RelError(g, w);
  EXPECT_LE(err, tol) << what;
}

// ---------------------------------------------------------------------------------------------
// Compressor

struct CompressCase {
  int64_t dim, rate;
  bool overlap;
  int64_t block_size, rotary_dim;
  DType dtype;
};

std::ostream& operator<<(std::ostream& os, const CompressCase& c) {
  return os << "dim " << c.dim << " rate " << c.rate << (c.overlap ? " overlap" : "") << " block "
            << c.block_size << " " << DTypeName(c.dtype);
}

class V4CompressTest : public ::testing::TestWithParam<CompressCase> {};

TEST_P(V4CompressTest, MatchesCpuAcrossCalls) {
  SKIP_WITHOUT_GPU();
  const CompressCase tc = GetParam();
  const int64_t dim = tc.dim, rate = tc.rate, bs = tc.block_size;
  const int64_t width = dim * (tc.overlap ? 2 : 1), sw = cpu::CompressorStateWidth(dim, tc.overlap);
  const int64_t big = std::max(bs, rate);
  const float eps = 1e-6f;
  std::mt19937 rng(static_cast<uint32_t>(dim * 1000 + rate * 10 + bs + tc.overlap));
  // Sequence 0 starts at 0; sequence 1 is a prefix hit at 2 * big (block boundary; the CPU pooled
  // the tokens before it); sequence 2 replays from big with replay_end 3 * big (the CPU pooled
  // [0, 3 * big) first, storing no entries, so a stored replay entry shows as a written row).
  const int64_t num_seqs = 3;
  const std::vector<int64_t> start = {0, 2 * big, big};
  const std::vector<int64_t> pre = {0, 2 * big, 3 * big};  // positions pooled before, by the CPU
  const std::vector<int32_t> replay_end = {0, 0, static_cast<int32_t>(3 * big)};
  const std::vector<std::vector<int64_t>> chunks = {{1, 9, 3, 2 * big + 5, 1, 1, 6},
                                                    {5, 1, 11, 2, 0, 3, big + 1},
                                                    {big + 3, 1, 2 * big, 1, 4, 0, 5}};
  int64_t max_len = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t len = start[s] + std::accumulate(chunks[s].begin(), chunks[s].end(), int64_t{0});
    max_len = std::max({max_len, len, pre[s]});
  }
  // Per-sequence rows of kv and gate for every position.
  std::vector<std::vector<float>> kv(num_seqs), gate(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) {
    kv[s] = Random(max_len * width, rng);
    gate[s] = Random(max_len * width, rng);
  }
  const auto bias = Random(rate * width, rng, 0.5f);
  auto norm = Random(dim, rng, 0.1f);
  for (auto& w : norm) w += 1.0f;
  const auto inv_freq = InvFreq(tc.rotary_dim);

  // Window-group tables and entry-group tables (blocks of max(bs, rate) tokens), shuffled.
  const int64_t max_blocks = (max_len + bs - 1) / bs;
  std::vector<int32_t> tables(num_seqs * max_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  const int64_t entry_bs = rate * std::max<int64_t>(1, bs / rate);
  const int64_t rows_per_block = std::max<int64_t>(1, bs / rate);
  const int64_t entry_max_blocks = (max_len + entry_bs - 1) / entry_bs;
  std::vector<int32_t> entry_tables(num_seqs * entry_max_blocks);
  std::iota(entry_tables.begin(), entry_tables.end(), 0);
  std::shuffle(entry_tables.begin(), entry_tables.end(), rng);

  std::vector<float> state(tables.size() * sw, NAN);
  HostPlane plane(tc.dtype, entry_tables.size() * rows_per_block * dim);

  // One call of the CPU reference: Compressor, then RMSNorm, rotary and the store (the layer's
  // Compress()). store_seq[s] false: no entry of sequence s is stored (the pre-history).
  struct Batch {
    std::vector<float> kv, gate;
    std::vector<int32_t> token_seq, positions, seq_end;
  };
  auto make_batch = [&](const std::vector<int64_t>& from, const std::vector<int64_t>& count) {
    Batch b;
    for (int64_t s = 0; s < num_seqs; ++s) {
      for (int64_t i = 0; i < count[s]; ++i) {
        const int64_t pos = from[s] + i;
        b.kv.insert(b.kv.end(), kv[s].begin() + pos * width, kv[s].begin() + (pos + 1) * width);
        b.gate.insert(b.gate.end(), gate[s].begin() + pos * width,
                      gate[s].begin() + (pos + 1) * width);
        b.token_seq.push_back(static_cast<int32_t>(s));
        b.positions.push_back(static_cast<int32_t>(pos));
      }
      b.seq_end.push_back(static_cast<int32_t>(b.positions.size()));
    }
    return b;
  };
  auto cpu_call = [&](const Batch& b, const std::vector<bool>& store_seq, bool use_replay) {
    const int64_t n = static_cast<int64_t>(b.positions.size());
    std::vector<int32_t> entry_row(n, -1), entry_pos;
    for (int64_t t = 0; t < n; ++t) {
      if ((b.positions[t] + 1) % rate != 0) continue;
      entry_row[t] = static_cast<int32_t>(entry_pos.size());
      entry_pos.push_back(b.positions[t] + 1 - static_cast<int32_t>(rate));
    }
    const int64_t count = static_cast<int64_t>(entry_pos.size());
    std::vector<float> entries(std::max<int64_t>(count, 1) * dim);
    cpu::CompressorParams p;
    p.kv = b.kv.data();
    p.gate = b.gate.data();
    p.kv_stride = p.gate_stride = width;
    p.bias = bias.data();
    p.num_tokens = n;
    p.dim = dim;
    p.rate = rate;
    p.overlap = tc.overlap;
    p.token_seq = b.token_seq.data();
    p.positions = b.positions.data();
    p.block_tables = tables.data();
    p.max_blocks_per_seq = max_blocks;
    p.block_size = bs;
    p.state = state.data();
    p.entry_row = entry_row.data();
    p.entries = entries.data();
    cpu::Compressor(p);
    if (count == 0) return;
    cpu::RmsNormParams np;
    np.x = entries.data();
    np.weight = norm.data();
    np.out = entries.data();
    np.rows = count;
    np.dim = dim;
    np.eps = eps;
    cpu::RmsNorm(np);
    cpu::RopeParams rp;
    rp.x = entries.data();
    rp.rows = count;
    rp.num_heads = 1;
    rp.head_dim = dim;
    rp.rotary_dim = tc.rotary_dim;
    rp.rotary_offset = dim - tc.rotary_dim;
    rp.positions = entry_pos.data();
    rp.inv_freq = inv_freq.data();
    rp.interleaved = true;
    cpu::Rope(rp);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = b.token_seq[t];
      if (entry_row[t] < 0 || !store_seq[s]) continue;
      if (use_replay && b.positions[t] < replay_end[s]) continue;
      const int64_t w = (b.positions[t] + 1) / rate - 1;
      const int64_t slot = cpu::CompressedSlot(entry_tables.data() + s * entry_max_blocks, entry_bs,
                                               rate, rows_per_block, w);
      cpu::StoreKvRow(plane.data(), KvType(tc.dtype), slot, dim,
                      entries.data() + entry_row[t] * dim);
    }
  };

  // The pre-history on the CPU; the GPU starts from the CPU's planes.
  cpu_call(make_batch({0, 0, 0}, pre), {true, true, false}, false);
  auto d_state = UploadRaw(state);
  auto d_plane = UploadBytes(plane.data(), plane.bytes());
  auto d_bias = UploadRaw(bias), d_norm = UploadRaw(norm), d_inv = UploadRaw(inv_freq);
  auto d_tables = UploadRaw(tables), d_entry_tables = UploadRaw(entry_tables);
  auto d_replay = UploadRaw(replay_end);

  std::vector<int64_t> pos = start;
  for (size_t call = 0; call < chunks[0].size(); ++call) {
    std::vector<int64_t> count(num_seqs);
    for (int64_t s = 0; s < num_seqs; ++s) count[s] = chunks[s][call];
    const Batch b = make_batch(pos, count);
    for (int64_t s = 0; s < num_seqs; ++s) pos[s] += count[s];
    const int64_t n = static_cast<int64_t>(b.positions.size());
    if (n == 0) continue;
    cpu_call(b, {true, true, true}, true);
    auto d_kv = UploadRaw(b.kv), d_gate = UploadRaw(b.gate);
    auto d_seq = UploadRaw(b.token_seq), d_pos = UploadRaw(b.positions);
    auto d_end = UploadRaw(b.seq_end);
    kc::V4CompressParams p;
    p.kv = static_cast<const float*>(d_kv.data());
    p.kv_stride = width;
    p.gate = static_cast<const float*>(d_gate.data());
    p.gate_stride = width;
    p.bias = static_cast<const float*>(d_bias.data());
    p.num_tokens = n;
    p.num_seqs = num_seqs;
    p.dim = dim;
    p.rate = rate;
    p.overlap = tc.overlap;
    p.token_seq = static_cast<const int32_t*>(d_seq.data());
    p.positions = static_cast<const int32_t*>(d_pos.data());
    p.seq_token_end = static_cast<const int32_t*>(d_end.data());
    p.block_tables = static_cast<const int32_t*>(d_tables.data());
    p.max_blocks_per_seq = max_blocks;
    p.block_size = bs;
    p.state = static_cast<float*>(d_state.data());
    p.norm_weight = static_cast<const float*>(d_norm.data());
    p.eps = eps;
    p.inv_freq = static_cast<const float*>(d_inv.data());
    p.rotary_dim = tc.rotary_dim;
    p.entries = d_plane.data();
    p.entries_dtype = tc.dtype;
    p.entry_tables = static_cast<const int32_t*>(d_entry_tables.data());
    p.entry_max_blocks_per_seq = entry_max_blocks;
    p.entry_block_size = entry_bs;
    p.rows_per_block = rows_per_block;
    p.replay_end = static_cast<const int32_t*>(d_replay.data());
    ASSERT_CUDA_OK(kc::V4Compress(p, nullptr));
    const std::string when = "call " + std::to_string(call);
    ExpectPlanesMatch(Download(d_state, state.size(), DType::kF32), state, 2e-5, when + " state");
    ExpectPlanesMatch(Download(d_plane, plane.Values().size(), tc.dtype), plane.Values(),
                      Tolerance(tc.dtype), when + " entries");
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(V4CompressShapes, V4CompressTest,
                         ::testing::Values(CompressCase{64, 4, true, 16, 16, DType::kF32},
                                           CompressCase{64, 4, true, 4, 16, DType::kF32},
                                           CompressCase{64, 2, true, 8, 16, DType::kBF16},
                                           CompressCase{64, 8, false, 4, 16, DType::kF32},
                                           CompressCase{64, 16, true, 4, 16, DType::kF32},
                                           CompressCase{64, 16, false, 32, 64, DType::kBF16},
                                           CompressCase{64, 8, true, 32, 16, DType::kF32},
                                           CompressCase{64, 4, false, 8, 16, DType::kF32},
                                           CompressCase{64, 2, false, 16, 8, DType::kF32},
                                           CompressCase{128, 4, true, 16, 64, DType::kBF16},
                                           CompressCase{512, 4, true, 64, 64, DType::kF32},
                                           CompressCase{512, 128, false, 64, 64, DType::kF32}));

// ---------------------------------------------------------------------------------------------
// Indexer

struct IndexerSetup {
  int64_t heads, head_dim, rate, window_block, topk;
  DType dtype;
  std::vector<int32_t> token_seq, positions;  // tokens
  int64_t num_seqs;
};

struct IndexerData {
  int64_t entry_bs, rows_per_block, max_blocks, max_entries;
  std::vector<float> q, weights, keys;  // keys as the device holds them (rounded)
  std::vector<int32_t> tables;
  cuda::DeviceBuffer d_q, d_w, d_keys, d_tables, d_seq, d_pos, d_ws, d_sel;
  kc::V4IndexerParams p;
};

void Prepare(const IndexerSetup& s, std::mt19937& rng, IndexerData& d) {
  const int64_t n = static_cast<int64_t>(s.positions.size());
  d.entry_bs = s.rate * std::max<int64_t>(1, s.window_block / s.rate);
  d.rows_per_block = std::max<int64_t>(1, s.window_block / s.rate);
  const int64_t max_pos = *std::max_element(s.positions.begin(), s.positions.end());
  d.max_entries = (max_pos + 1) / s.rate;
  d.max_blocks = (max_pos + 1 + d.entry_bs - 1) / d.entry_bs;
  d.tables.resize(s.num_seqs * d.max_blocks);
  std::iota(d.tables.begin(), d.tables.end(), 0);
  std::shuffle(d.tables.begin(), d.tables.end(), rng);
  d.q = Random(n * s.heads * s.head_dim, rng);
  d.weights = Random(n * s.heads, rng);
  d.keys = RoundTo(s.dtype, Random(d.tables.size() * d.rows_per_block * s.head_dim, rng));
  d.d_q = UploadRaw(d.q);
  d.d_w = UploadRaw(d.weights);
  d.d_keys = Upload(d.keys, s.dtype);
  d.d_tables = UploadRaw(d.tables);
  d.d_seq = UploadRaw(s.token_seq);
  d.d_pos = UploadRaw(s.positions);
  d.d_ws = Poisoned(kc::V4IndexerWorkspaceFloats(n, d.max_entries), DType::kF32);
  d.d_sel = UploadRaw(std::vector<int32_t>(n * s.topk, 0x7f7f7f7f));  // not -1: must be written
  kc::V4IndexerParams& p = d.p;
  p.q = static_cast<const float*>(d.d_q.data());
  p.q_stride = s.heads * s.head_dim;
  p.weights = static_cast<const float*>(d.d_w.data());
  p.weights_stride = s.heads;
  p.weights_scale = 1.0f / std::sqrt(static_cast<float>(s.heads));
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  p.num_tokens = n;
  p.num_heads = s.heads;
  p.head_dim = s.head_dim;
  p.keys = d.d_keys.data();
  p.keys_dtype = s.dtype;
  p.rate = s.rate;
  p.rows_per_block = d.rows_per_block;
  p.token_seq = static_cast<const int32_t*>(d.d_seq.data());
  p.positions = static_cast<const int32_t*>(d.d_pos.data());
  p.block_tables = static_cast<const int32_t*>(d.d_tables.data());
  p.max_blocks_per_seq = d.max_blocks;
  p.block_size = d.entry_bs;
  p.topk = s.topk;
  p.max_entries = d.max_entries;
  p.workspace = static_cast<float*>(d.d_ws.data());
  p.selected = static_cast<int32_t*>(d.d_sel.data());
}

// Checks the GPU's selection of the listed tokens against IndexerTopKReference: the same sets,
// except entries whose score is within 1e-5 (relative) of the k-th best one.
void CheckSelection(const IndexerSetup& s, const IndexerData& d,
                    const std::vector<int64_t>& tokens) {
  const int64_t n = static_cast<int64_t>(s.positions.size()), k = s.topk;
  const auto got = DownloadRaw<int32_t>(d.d_sel, n * k);
  std::vector<float> weights(d.weights);
  for (auto& w : weights) w *= d.p.weights_scale;  // the layer scales them before the CPU op
  std::vector<uint16_t> keys_bf16;
  if (s.dtype == DType::kBF16) {
    keys_bf16.resize(d.keys.size());
    for (size_t i = 0; i < d.keys.size(); ++i) keys_bf16[i] = F32ToBf16(d.keys[i]);
  }
  int64_t mismatches = 0;
  for (int64_t t : tokens) {
    cpu::IndexerParams p;
    p.q = d.q.data() + t * s.heads * s.head_dim;
    p.q_stride = s.heads * s.head_dim;
    p.weights = weights.data() + t * s.heads;
    p.weights_stride = s.heads;
    p.num_tokens = 1;
    p.num_heads = s.heads;
    p.head_dim = s.head_dim;
    p.scale = d.p.scale;
    p.keys = s.dtype == DType::kBF16 ? static_cast<const void*>(keys_bf16.data())
                                     : static_cast<const void*>(d.keys.data());
    p.keys_dtype = KvType(s.dtype);
    p.rate = s.rate;
    p.rows_per_block = d.rows_per_block;
    p.token_seq = s.token_seq.data() + t;
    p.q_pos = s.positions.data() + t;
    p.block_tables = d.tables.data();
    p.max_blocks_per_seq = d.max_blocks;
    p.block_size = d.entry_bs;
    p.topk = k;
    std::vector<int32_t> want(k);
    p.selected = want.data();
    cpu::IndexerTopKReference(p);
    // Scores in double, as the reference computes them.
    const int64_t valid = (s.positions[t] + 1) / s.rate;
    const int32_t* table = d.tables.data() + s.token_seq[t] * d.max_blocks;
    auto score = [&](int64_t w) {
      const float* key =
          d.keys.data() +
          cpu::CompressedSlot(table, d.entry_bs, s.rate, d.rows_per_block, w) * s.head_dim;
      double sc = 0;
      for (int64_t h = 0; h < s.heads; ++h) {
        double dot = 0;
        for (int64_t i = 0; i < s.head_dim; ++i) dot += double{p.q[h * s.head_dim + i]} * key[i];
        sc += std::max(dot, 0.0) * p.scale * p.weights[h];
      }
      return sc;
    };
    const int32_t* g = got.data() + t * k;
    std::set<int32_t> gs, ws;
    for (int64_t i = 0; i < k; ++i) {
      if (i < std::min(valid, k)) {
        ASSERT_TRUE(g[i] >= 0 && g[i] < valid) << "token " << t << " slot " << i << ": " << g[i];
        gs.insert(g[i]);
        ws.insert(want[i]);
      } else {
        ASSERT_EQ(g[i], -1) << "token " << t << " slot " << i;
      }
    }
    ASSERT_EQ(static_cast<int64_t>(gs.size()), std::min(valid, k))
        << "token " << t << ": duplicates";
    if (valid <= k) {
      EXPECT_EQ(gs, ws) << "token " << t;
      continue;
    }
    double kth = INFINITY;
    for (int32_t w : ws) kth = std::min(kth, score(w));
    for (int32_t w : gs) {
      if (ws.count(w) != 0) continue;
      ++mismatches;
      EXPECT_LE(std::fabs(score(w) - kth), 1e-5 * std::fabs(kth))
          << "token " << t << ": entry " << w << " selected, score " << score(w) << ", k-th "
          << kth;
    }
  }
  if (mismatches > 0)
    std::printf("  %lld near-tie mismatches\n", static_cast<long long>(mismatches));
}

struct IndexerCase {
  int64_t heads, head_dim, rate, window_block, topk;
  DType dtype;
};

std::ostream& operator<<(std::ostream& os, const IndexerCase& c) {
  return os << c.heads << "x" << c.head_dim << " rate " << c.rate << " block " << c.window_block
            << " top " << c.topk << " " << DTypeName(c.dtype);
}

class V4IndexerTest : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(V4IndexerTest, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const IndexerCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.heads * 7 + c.head_dim + c.topk));
  IndexerSetup s{c.heads, c.head_dim, c.rate, c.window_block, c.topk, c.dtype, {}, {}, 4};
  // Sequence 0: a prefill chunk from 0 (entries from none to past topk); 1: decode far in;
  // 2: a chunk at an odd position; 3: decode with fewer entries than topk.
  auto add = [&](int32_t seq, int32_t from, int32_t count) {
    for (int32_t i = 0; i < count; ++i) {
      s.token_seq.push_back(seq);
      s.positions.push_back(from + i);
    }
  };
  const int32_t kr = static_cast<int32_t>(c.rate * c.topk);
  add(0, 0, std::min<int32_t>(2 * kr + 7, 300));
  add(1, 3 * kr + 5, 1);
  add(2, kr + 3, 13);
  add(3, kr / 2, 1);
  IndexerData d;
  Prepare(s, rng, d);
  ASSERT_CUDA_OK(kc::V4IndexerTopK(d.p, nullptr));
  std::vector<int64_t> all(s.positions.size());
  std::iota(all.begin(), all.end(), 0);
  CheckSelection(s, d, all);
}

INSTANTIATE_TEST_SUITE_P(V4IndexerShapes, V4IndexerTest,
                         ::testing::Values(IndexerCase{4, 32, 4, 16, 8, DType::kF32},
                                           IndexerCase{8, 64, 4, 4, 16, DType::kBF16},
                                           IndexerCase{3, 32, 2, 8, 5, DType::kF32},
                                           IndexerCase{70, 32, 8, 4, 24, DType::kBF16},
                                           IndexerCase{64, 128, 4, 64, 64, DType::kBF16},
                                           IndexerCase{64, 128, 4, 16, 40, DType::kF32},
                                           IndexerCase{70, 128, 4, 8, 24, DType::kBF16},
                                           IndexerCase{16, 128, 16, 8, 12, DType::kBF16},
                                           // Head dims that are not whole 32-dim slices (the
                                           // tiny model fixtures use 16).
                                           IndexerCase{8, 16, 4, 16, 5, DType::kBF16},
                                           IndexerCase{5, 40, 4, 8, 7, DType::kF32}));

// ---------------------------------------------------------------------------------------------
// Timings of the V4-Flash shapes (and a check of the indexer's selections at that size)

float TimeMs(const std::function<int()>& launch) {
  for (int i = 0; i < 3; ++i) EXPECT_EQ(launch(), 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  constexpr int kIters = 20;
  cudaEventRecord(a, nullptr);
  for (int i = 0; i < kIters; ++i) launch();
  cudaEventRecord(b, nullptr);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return ms / kIters;
}

TEST(V4IndexerTiming, FlashShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  struct Shape {
    const char* name;
    int64_t seqs, tokens_per_seq, last_pos;
  };
  for (const Shape& sh :
       {Shape{"1 token at 4K", 1, 1, 4095}, Shape{"64 tokens at 4K", 64, 1, 4095},
        Shape{"2048-token prefill to 4K", 1, 2048, 4095}, Shape{"1 token at 64K", 1, 1, 65535}}) {
    IndexerSetup s{64, 128, 4, 64, 512, DType::kBF16, {}, {}, sh.seqs};
    for (int64_t q = 0; q < sh.seqs; ++q) {
      for (int64_t i = 0; i < sh.tokens_per_seq; ++i) {
        s.token_seq.push_back(static_cast<int32_t>(q));
        s.positions.push_back(static_cast<int32_t>(sh.last_pos - (sh.tokens_per_seq - 1 - i) - q));
      }
    }
    IndexerData d;
    Prepare(s, rng, d);
    const float ms = TimeMs([&] { return kc::V4IndexerTopK(d.p, nullptr); });
    std::printf("V4 indexer 64x128 top-512 bf16, %s: %.1f us\n", sh.name, ms * 1000.0f);
    const int64_t n = static_cast<int64_t>(s.positions.size());
    std::vector<int64_t> check;
    for (int64_t t = 0; t < n; t += std::max<int64_t>(1, n / 6)) check.push_back(t);
    CheckSelection(s, d, check);
  }
}

TEST(V4CompressTiming, FlashShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  struct Config {
    int64_t dim, rate;
    bool overlap;
  };
  struct Shape {
    const char* name;
    int64_t seqs, tokens_per_seq, last_pos;
  };
  const int64_t bs = 64, max_len = 4096;
  for (const Config& cfg : {Config{512, 4, true}, Config{512, 128, false}, Config{128, 4, true}}) {
    const int64_t width = cfg.dim * (cfg.overlap ? 2 : 1);
    for (const Shape& sh :
         {Shape{"1 token at 4K", 1, 1, 4095}, Shape{"64 tokens at 4K", 64, 1, 4095},
          Shape{"8 x 2048-token prefill", 8, 2048, 2047}}) {
      const int64_t n = sh.seqs * sh.tokens_per_seq;
      std::vector<int32_t> token_seq, positions, seq_end;
      for (int64_t q = 0; q < sh.seqs; ++q) {
        for (int64_t i = 0; i < sh.tokens_per_seq; ++i) {
          token_seq.push_back(static_cast<int32_t>(q));
          positions.push_back(static_cast<int32_t>(sh.last_pos - (sh.tokens_per_seq - 1 - i)));
        }
        seq_end.push_back(static_cast<int32_t>(positions.size()));
      }
      const int64_t max_blocks = max_len / bs;
      const int64_t entry_bs = cfg.rate * std::max<int64_t>(1, bs / cfg.rate);
      const int64_t rows = std::max<int64_t>(1, bs / cfg.rate), entry_blocks = max_len / entry_bs;
      std::vector<int32_t> tables(sh.seqs * max_blocks), entry_tables(sh.seqs * entry_blocks);
      std::iota(tables.begin(), tables.end(), 0);
      std::iota(entry_tables.begin(), entry_tables.end(), 0);
      auto d_kv = UploadRaw(Random(n * width, rng)), d_gate = UploadRaw(Random(n * width, rng));
      auto d_bias = UploadRaw(Random(cfg.rate * width, rng)),
           d_norm = UploadRaw(Random(cfg.dim, rng));
      auto d_inv = UploadRaw(InvFreq(64));
      auto d_seq = UploadRaw(token_seq), d_pos = UploadRaw(positions), d_end = UploadRaw(seq_end);
      auto d_tables = UploadRaw(tables), d_entry_tables = UploadRaw(entry_tables);
      auto d_state = UploadRaw(std::vector<float>(
          tables.size() * cpu::CompressorStateWidth(cfg.dim, cfg.overlap), 0.0f));
      auto d_entries = Poisoned(entry_tables.size() * rows * cfg.dim, DType::kBF16);
      kc::V4CompressParams p;
      p.kv = static_cast<const float*>(d_kv.data());
      p.kv_stride = width;
      p.gate = static_cast<const float*>(d_gate.data());
      p.gate_stride = width;
      p.bias = static_cast<const float*>(d_bias.data());
      p.num_tokens = n;
      p.num_seqs = sh.seqs;
      p.dim = cfg.dim;
      p.rate = cfg.rate;
      p.overlap = cfg.overlap;
      p.token_seq = static_cast<const int32_t*>(d_seq.data());
      p.positions = static_cast<const int32_t*>(d_pos.data());
      p.seq_token_end = static_cast<const int32_t*>(d_end.data());
      p.block_tables = static_cast<const int32_t*>(d_tables.data());
      p.max_blocks_per_seq = max_blocks;
      p.block_size = bs;
      p.state = static_cast<float*>(d_state.data());
      p.norm_weight = static_cast<const float*>(d_norm.data());
      p.inv_freq = static_cast<const float*>(d_inv.data());
      p.rotary_dim = 64;
      p.entries = d_entries.data();
      p.entries_dtype = DType::kBF16;
      p.entry_tables = static_cast<const int32_t*>(d_entry_tables.data());
      p.entry_max_blocks_per_seq = entry_blocks;
      p.entry_block_size = entry_bs;
      p.rows_per_block = rows;
      const float ms = TimeMs([&] { return kc::V4Compress(p, nullptr); });
      std::printf("V4 compressor dim %lld rate %lld%s, %s: %.1f us\n",
                  static_cast<long long>(cfg.dim), static_cast<long long>(cfg.rate),
                  cfg.overlap ? " overlap" : "", sh.name, ms * 1000.0f);
    }
  }
}

}  // namespace
}  // namespace dinfer
