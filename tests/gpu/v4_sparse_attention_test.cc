// The CUDA DeepSeek-V4 sparse attention against kernels/cpu SparseAttention run the way
// ops::SparseAttention runs it (the step's keys stored into the window plane first, rounded to its
// dtype) followed by the inverse rotary of the output (kernels/cpu Rope): tiny and V4 shapes,
// window only / every compressed entry / selected entries (with -1 padding and duplicates),
// several sequences with different positions in one batch (decode, prefill, chunks over cached
// context), chunked continuation across calls, f32 and bf16 queries, planes and outputs, with and
// without key splits and the inverse rotary. Also the write of the window keys, invalid params,
// and timings of V4 decode shapes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "backend/cuda/stream.h"
#include "gpu_test_util.h"
#include "kernels/cpu/deepseek_v4.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/v4_sparse_attention.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;
namespace cpu = kernels::cpu;

enum class Mode { kWindow, kAll, kSelected };

struct SparseCase {
  const char* name;
  int64_t heads, dim, rotary;
  DType q, plane, out;
  Mode mode;
  int64_t rate, num_selected, window, block_size;
  int64_t max_splits;  // 0: no workspace
  int kernel = 0;      // V4SparseAttentionParams::kernel (1: never the wgmma kernel)
};

std::ostream& operator<<(std::ostream& os, const SparseCase& c) { return os << c.name; }

// Bit-for-bit equality of two downloads. (Not operator==: the poisoned columns past the heads
// hold NaN, which never compares equal to itself.)
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A sequence's tokens of one step: positions [start, start + count).
struct SeqChunk {
  int32_t seq;
  int32_t start, count;
};

// The planes and tables of a few sequences, on the host (values as the planes' dtype holds
// them, kept as f32) and on the device.
class SparseSetup {
 public:
  SparseSetup(const SparseCase& c, int64_t num_seqs, int64_t max_len, std::mt19937& rng)
      : c_(c), num_seqs_(num_seqs) {
    const int64_t d = c.dim;
    max_blocks_ = (max_len + c.block_size - 1) / c.block_size;
    const int64_t blocks = num_seqs * max_blocks_;
    tables_.resize(blocks);
    std::iota(tables_.begin(), tables_.end(), 0);
    std::shuffle(tables_.begin(), tables_.end(), rng);
    window_ = RoundTo(c.plane, Random(blocks * c.block_size * d, rng));
    if (c.mode != Mode::kWindow) {
      cbs_ = std::max(c.block_size, c.rate);
      rows_per_block_ = cbs_ / c.rate;
      cmax_ = (max_len + cbs_ - 1) / cbs_;
      ctables_.resize(num_seqs * cmax_);
      std::iota(ctables_.begin(), ctables_.end(), 0);
      std::shuffle(ctables_.begin(), ctables_.end(), rng);
      compressed_ = RoundTo(c.plane, Random(ctables_.size() * rows_per_block_ * d, rng));
      d_compressed_ = Upload(compressed_, c.plane);
      d_ctables_ = UploadRaw(ctables_);
    }
    sinks_ = Random(c.heads, rng);
    inv_freq_.resize(c.rotary / 2);
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      inv_freq_[i] = 1.0f / std::pow(10000.0f, 2.0f * i / std::max<int64_t>(c.rotary, 1));
    }
    d_window_ = Upload(window_, c.plane);
    d_tables_ = UploadRaw(tables_);
    d_sinks_ = Upload(sinks_, DType::kF32);
    d_inv_freq_ = Upload(inv_freq_, DType::kF32);
    if (c.max_splits > 0) {
      // Poisoned, so that a split that is merged but never written shows.
      d_workspace_ = Poisoned(
          kc::V4SparseAttentionWorkspaceFloats(kMaxTokens, c.heads, d, c.max_splits), DType::kF32);
    }
  }

  // Runs one step on both sides; returns the relative error of the GPU output (and checks the
  // window plane that the GPU wrote). With `repeat` the GPU runs the step a second time and must
  // give bit-identical output (deterministic merge; nothing left over from the first launch).
  double Step(const std::vector<SeqChunk>& chunks, std::mt19937& rng, bool repeat = false) {
    const int64_t d = c_.dim, hd = c_.heads * d;
    std::vector<int32_t> token_seq, positions;
    for (const SeqChunk& ch : chunks) {
      for (int32_t i = 0; i < ch.count; ++i) {
        token_seq.push_back(ch.seq);
        positions.push_back(ch.start + i);
      }
    }
    const int64_t tokens = static_cast<int64_t>(token_seq.size());
    EXPECT_LE(tokens, kMaxTokens);
    // q with a wider stride than its heads, to exercise strides.
    const int64_t q_stride = hd + 8;
    auto q = RoundTo(c_.q, Random(tokens * q_stride, rng));
    auto kv = Random(tokens * d, rng);
    std::vector<int32_t> selected;
    if (c_.mode == Mode::kSelected) {
      selected.resize(tokens * c_.num_selected);
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t avail = (positions[t] + 1) / c_.rate;
        for (int64_t i = 0; i < c_.num_selected; ++i) {
          const bool pad = avail == 0 || rng() % 8 == 0;
          // Random draws repeat ids (duplicates count twice); -1 pads.
          selected[t * c_.num_selected + i] = pad ? -1 : static_cast<int32_t>(rng() % avail);
        }
      }
    }

    // CPU: store the keys rounded to the plane's dtype, attend, undo the rotary.
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t pos = positions[t];
      const int64_t slot =
          int64_t{tables_[token_seq[t] * max_blocks_ + pos / c_.block_size]} * c_.block_size +
          pos % c_.block_size;
      for (int64_t i = 0; i < d; ++i) {
        window_[slot * d + i] = RoundTo(c_.plane, {kv[t * d + i]})[0];
      }
    }
    std::vector<float> want(tokens * hd);
    cpu::SparseAttentionParams sp;
    sp.q = q.data();
    sp.q_stride = q_stride;
    sp.out = want.data();
    sp.out_stride = hd;
    sp.num_tokens = tokens;
    sp.num_heads = c_.heads;
    sp.head_dim = d;
    sp.scale = 1.0f / std::sqrt(static_cast<float>(d));
    sp.sinks = sinks_.data();
    sp.token_seq = token_seq.data();
    sp.q_pos = positions.data();
    sp.block_tables = tables_.data();
    sp.max_blocks_per_seq = max_blocks_;
    sp.block_size = c_.block_size;
    sp.window_kv = window_.data();
    sp.window_dtype = cpu::KvDType::kF32;
    sp.window = c_.window;
    if (c_.mode != Mode::kWindow) {
      sp.compressed = compressed_.data();
      sp.compressed_dtype = cpu::KvDType::kF32;
      sp.rate = c_.rate;
      sp.rows_per_block = rows_per_block_;
      sp.compressed_block_tables = ctables_.data();
      sp.compressed_max_blocks_per_seq = cmax_;
      sp.compressed_block_size = cbs_;
      if (c_.mode == Mode::kSelected) {
        sp.selected = selected.data();
        sp.num_selected = c_.num_selected;
      }
    }
    cpu::SparseAttention(sp);
    if (c_.rotary > 0) {
      cpu::RopeParams rp;
      rp.x = want.data();
      rp.rows = tokens;
      rp.num_heads = c_.heads;
      rp.head_dim = d;
      rp.rotary_dim = c_.rotary;
      rp.rotary_offset = d - c_.rotary;
      rp.row_stride = hd;
      rp.positions = positions.data();
      rp.inv_freq = inv_freq_.data();
      rp.interleaved = true;
      rp.inverse = true;
      cpu::Rope(rp);
    }

    // GPU.
    auto d_q = Upload(q, c_.q);
    auto d_kv = Upload(kv, DType::kF32);
    auto d_seq = UploadRaw(token_seq);
    auto d_pos = UploadRaw(positions);
    auto d_sel = UploadRaw(selected.empty() ? std::vector<int32_t>{0} : selected);
    const int64_t out_stride = hd + 4;
    auto d_out = Poisoned(tokens * out_stride, c_.out);
    kc::V4SparseAttentionParams p = Params();
    p.q = d_q.data();
    p.q_dtype = c_.q;
    p.q_stride = q_stride;
    p.kv = static_cast<const float*>(d_kv.data());
    p.kv_stride = d;
    p.out = d_out.data();
    p.out_dtype = c_.out;
    p.out_stride = out_stride;
    p.num_tokens = tokens;
    p.token_seq = static_cast<const int32_t*>(d_seq.data());
    p.positions = static_cast<const int32_t*>(d_pos.data());
    if (c_.mode == Mode::kSelected) {
      p.selected = static_cast<const int32_t*>(d_sel.data());
      p.num_selected = c_.num_selected;
    }
    EXPECT_EQ(kc::V4SparseAttention(p, nullptr), 0);
    auto got_all = Download(d_out, tokens * out_stride, c_.out);
    if (repeat) {
      auto d_out2 = Poisoned(tokens * out_stride, c_.out);
      p.out = d_out2.data();
      EXPECT_EQ(kc::V4SparseAttention(p, nullptr), 0);
      const auto again = Download(d_out2, tokens * out_stride, c_.out);
      EXPECT_TRUE(SameBits(again, got_all)) << "a second launch differs";
    }
    std::vector<float> got(tokens * hd);
    int64_t written_past = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy_n(got_all.begin() + t * out_stride, hd, got.begin() + t * hd);
      for (int64_t i = hd; i < out_stride; ++i)
        written_past += !std::isnan(got_all[t * out_stride + i]);
    }
    EXPECT_EQ(written_past, 0) << "columns past the heads written";
    const auto plane = Download(d_window_, window_.size(), c_.plane);
    EXPECT_EQ(plane, window_) << "window plane after the key write";
    return RelError(got, want);
  }

  // The params that stay fixed across steps.
  kc::V4SparseAttentionParams Params() const {
    kc::V4SparseAttentionParams p;
    p.num_seqs = num_seqs_;
    p.num_heads = c_.heads;
    p.head_dim = c_.dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c_.dim));
    p.sinks = static_cast<const float*>(d_sinks_.data());
    p.block_tables = static_cast<const int32_t*>(d_tables_.data());
    p.max_blocks_per_seq = max_blocks_;
    p.block_size = c_.block_size;
    p.window_kv = d_window_.data();
    p.window_dtype = c_.plane;
    p.window = c_.window;
    if (c_.mode != Mode::kWindow) {
      p.compressed = d_compressed_.data();
      p.compressed_dtype = c_.plane;
      p.rate = c_.rate;
      p.rows_per_block = rows_per_block_;
      p.compressed_tables = static_cast<const int32_t*>(d_ctables_.data());
      p.compressed_max_blocks_per_seq = cmax_;
      p.compressed_block_size = cbs_;
    }
    if (c_.rotary > 0) {
      p.inv_freq = static_cast<const float*>(d_inv_freq_.data());
      p.rotary_dim = c_.rotary;
    }
    if (c_.max_splits > 0) {
      p.workspace = static_cast<float*>(d_workspace_.data());
      p.max_splits = c_.max_splits;
    }
    p.kernel = c_.kernel;
    return p;
  }

  static constexpr int64_t kMaxTokens = 64;

 private:
  SparseCase c_;
  int64_t num_seqs_ = 0, max_blocks_ = 0, cbs_ = 0, rows_per_block_ = 0, cmax_ = 0;
  std::vector<int32_t> tables_, ctables_;
  std::vector<float> window_, compressed_, sinks_, inv_freq_;
  cuda::DeviceBuffer d_window_, d_compressed_, d_tables_, d_ctables_, d_sinks_, d_inv_freq_,
      d_workspace_;
};

// The tensor-core path (bf16 planes, head_dim 64..512 a power of two) rounds q and the softmax
// weights to bf16: errors of a few 1e-3. The f32 path sees the CPU's exact inputs: only f32
// summation order differs, unless the output itself is bf16.
double SparseTolerance(const SparseCase& c) {
  const bool tc =
      c.plane == DType::kBF16 && (c.dim == 64 || c.dim == 128 || c.dim == 256 || c.dim == 512);
  return tc || c.out == DType::kBF16 ? 1e-2 : 1e-4;
}

class V4SparseAttentionTest : public ::testing::TestWithParam<SparseCase> {};

TEST_P(V4SparseAttentionTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const SparseCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.heads * 131 + c.dim * 7 + c.rotary + c.max_splits +
                                         static_cast<int>(c.mode) * 1000));
  const bool big = c.dim >= 512;
  // Sequences: a decode token deep in its context, a prefill from 0, a chunk over cached context,
  // and (small shapes) another decode token.
  const int32_t deep = c.mode == Mode::kAll && c.rate >= 128 ? 1900 : 700;
  std::vector<SeqChunk> step1 = {{0, deep, 1}, {1, 0, big ? 21 : 37}, {2, 300, big ? 7 : 13}};
  if (!big) step1.push_back({3, 95, 1});
  const int64_t num_seqs = static_cast<int64_t>(step1.size());
  SparseSetup setup(c, num_seqs, 2048, rng);
  const double tol = SparseTolerance(c);
  const double e1 = setup.Step(step1, rng);
  EXPECT_LT(e1, tol) << "step 1";
  // The next step continues each sequence: keys written by step 1 are now cached context.
  std::vector<SeqChunk> step2;
  for (const SeqChunk& ch : step1) step2.push_back({ch.seq, ch.start + ch.count, big ? 3 : 5});
  const double e2 = setup.Step(step2, rng);
  EXPECT_LT(e2, tol) << "step 2";
  std::printf("[%s] rel error %.3g, %.3g (tolerance %.0e)\n", c.name, e1, e2, tol);
}

constexpr DType F = DType::kF32, B = DType::kBF16;

INSTANTIATE_TEST_SUITE_P(
    Shapes, V4SparseAttentionTest,
    ::testing::Values(
        // Tiny: heads 4, dim 64, rotary 16, window 20, blocks of 16.
        SparseCase{"tiny window bf16", 4, 64, 16, B, B, B, Mode::kWindow, 0, 0, 20, 16, 0},
        SparseCase{"tiny window f32 split", 4, 64, 16, F, F, F, Mode::kWindow, 0, 0, 20, 16, 8},
        SparseCase{"tiny all bf16 split", 4, 64, 16, B, B, B, Mode::kAll, 4, 0, 20, 16, 8},
        SparseCase{"tiny all f32", 4, 64, 16, F, F, F, Mode::kAll, 4, 0, 20, 16, 0},
        SparseCase{"tiny selected f32-planes bf16-q split", 4, 64, 0, B, F, F, Mode::kSelected, 4,
                   12, 20, 16, 8},
        SparseCase{"tiny selected bf16-planes f32-q", 4, 64, 16, F, B, F, Mode::kSelected, 4, 12,
                   20, 16, 0},
        SparseCase{"tiny selected bf16-planes f32-q split", 4, 64, 16, F, B, F, Mode::kSelected, 4,
                   12, 20, 16, 8},
        // Odd shapes: 5 heads of 48 dims (the f32 kernel even with bf16 planes), block size 12.
        SparseCase{"odd selected bf16 split", 5, 48, 16, B, B, B, Mode::kSelected, 4, 9, 17, 12, 8},
        SparseCase{"odd all f32 no-rope", 5, 48, 0, F, F, F, Mode::kAll, 8, 0, 17, 12, 0},
        // Two head groups of the tensor-core kernel (72 heads), dim 128.
        SparseCase{"72x128 selected bf16 split", 72, 128, 64, B, B, B, Mode::kSelected, 4, 40, 64,
                   16, 4},
        // V4: 64 heads of 512, rotary 64, window 128, blocks of 64.
        SparseCase{"v4 selected bf16 split", 64, 512, 64, B, B, B, Mode::kSelected, 4, 512, 128, 64,
                   16},
        SparseCase{"v4 selected bf16", 64, 512, 64, B, B, B, Mode::kSelected, 4, 512, 128, 64, 0},
        // The mma.sync kernel at V4's shape (head_dim 512 otherwise takes the wgmma kernel).
        SparseCase{"v4 selected bf16 split mma", 64, 512, 64, B, B, B, Mode::kSelected, 4, 512, 128,
                   64, 16, 1},
        // Two head groups of the wgmma kernel, the second of 8 heads; bf16 q.
        SparseCase{"72x512 selected bf16 split", 72, 512, 64, B, B, B, Mode::kSelected, 4, 300, 100,
                   64, 16},
        SparseCase{"v4 all rate128 f32-q f32-out", 64, 512, 64, F, B, F, Mode::kAll, 128, 0, 128,
                   64, 16},
        SparseCase{"v4 window f32", 64, 512, 64, F, F, F, Mode::kWindow, 0, 0, 128, 64, 16}),
    [](const ::testing::TestParamInfo<SparseCase>& info) {
      std::string s = info.param.name;
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

// Decode steps: every sequence has one token (num_tokens == num_seqs), so the tensor-core kernel
// writes the window keys itself and reads each token's own key from kv; with splits, up to 16
// splits of a token are merged inside a cluster. A batch of sequences at different depths
// (position 0 included), then a single sequence (one token: the most splits), each continued by
// a second step over the keys the first wrote; the single sequence's steps run twice.
class V4SparseAttentionDecodeTest : public ::testing::TestWithParam<SparseCase> {};

TEST_P(V4SparseAttentionDecodeTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const SparseCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.heads * 37 + c.dim * 5 + c.max_splits +
                                         static_cast<int>(c.mode) * 100 + 9));
  const double tol = SparseTolerance(c);
  const int32_t deep = c.mode == Mode::kAll && c.rate >= 128 ? 1900 : 700;
  {
    std::vector<SeqChunk> step1 = {{0, deep, 1}, {1, 0, 1},   {2, 5, 1},
                                   {3, 129, 1},  {4, 300, 1}, {5, 1000, 1}};
    SparseSetup setup(c, static_cast<int64_t>(step1.size()), 2048, rng);
    const double e1 = setup.Step(step1, rng);
    EXPECT_LT(e1, tol) << "batch step 1";
    for (SeqChunk& ch : step1) ch.start += 1;
    const double e2 = setup.Step(step1, rng);
    EXPECT_LT(e2, tol) << "batch step 2";
    std::printf("[%s] batch: rel error %.3g, %.3g (tolerance %.0e)\n", c.name, e1, e2, tol);
  }
  {
    SparseSetup setup(c, 1, 2048, rng);
    const double e1 = setup.Step({{0, deep, 1}}, rng, /*repeat=*/true);
    EXPECT_LT(e1, tol) << "single step 1";
    const double e2 = setup.Step({{0, deep + 1, 1}}, rng, /*repeat=*/true);
    EXPECT_LT(e2, tol) << "single step 2";
    std::printf("[%s] single: rel error %.3g, %.3g (tolerance %.0e)\n", c.name, e1, e2, tol);
  }
}

INSTANTIATE_TEST_SUITE_P(
    DecodeShapes, V4SparseAttentionDecodeTest,
    ::testing::Values(SparseCase{"tiny decode all bf16 split", 4, 64, 16, B, B, B, Mode::kAll, 4, 0,
                                 20, 16, 8},
                      SparseCase{"tiny decode selected bf16-planes f32-q", 4, 64, 16, F, B, F,
                                 Mode::kSelected, 4, 12, 20, 16, 0},
                      SparseCase{"tiny decode window f32 split", 4, 64, 16, F, F, F, Mode::kWindow,
                                 0, 0, 20, 16, 8},
                      SparseCase{"72x128 decode selected bf16 split", 72, 128, 64, B, B, B,
                                 Mode::kSelected, 4, 40, 64, 16, 8},
                      SparseCase{"256 decode window bf16 split", 8, 256, 32, B, B, B, Mode::kWindow,
                                 0, 0, 300, 32, 16},
                      SparseCase{"v4 decode selected bf16 split", 64, 512, 64, B, B, B,
                                 Mode::kSelected, 4, 512, 128, 64, 8},
                      SparseCase{"v4 decode selected bf16", 64, 512, 64, B, B, B, Mode::kSelected,
                                 4, 512, 128, 64, 0},
                      // max_splits 16 (the GPU runner's): 1020 keys give 16 splits, a cluster of
                      // 16 (more splits than heads); V4's 640 keys give 10.
                      SparseCase{"tiny decode selected bf16 split16", 4, 64, 16, B, B, B,
                                 Mode::kSelected, 4, 1000, 20, 16, 16},
                      SparseCase{"v4 decode selected bf16 split16", 64, 512, 64, B, B, B,
                                 Mode::kSelected, 4, 512, 128, 64, 16},
                      SparseCase{"v4 decode selected bf16 split16 mma", 64, 512, 64, B, B, B,
                                 Mode::kSelected, 4, 512, 128, 64, 16, 1},
                      SparseCase{"72x512 decode selected f32-q split16", 72, 512, 64, F, B, B,
                                 Mode::kSelected, 4, 200, 128, 64, 16},
                      SparseCase{"v4 decode window bf16 f32-out split16", 64, 512, 64, F, B, F,
                                 Mode::kWindow, 0, 0, 128, 64, 16},
                      SparseCase{"v4 decode all rate128 f32-q f32-out split", 64, 512, 64, F, B, F,
                                 Mode::kAll, 128, 0, 128, 64, 16}),
    [](const ::testing::TestParamInfo<SparseCase>& info) {
      std::string s = info.param.name;
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

TEST(V4SparseAttentionParamsTest, RejectsInvalid) {
  SKIP_WITHOUT_GPU();
  kc::V4SparseAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.head_dim = 2048;  // over the limit
  EXPECT_NE(kc::V4SparseAttention(p, nullptr), 0);
  p.head_dim = 64;  // null pointers
  EXPECT_NE(kc::V4SparseAttention(p, nullptr), 0);
  p.num_tokens = 0;  // nothing to do
  EXPECT_EQ(kc::V4SparseAttention(p, nullptr), 0);
}

// Timings at V4 shapes: window 128 + 512 selected entries (rate 4), and window 128 + all 512
// entries of a 64K context (rate 128). Decode: 1 and 64 tokens, each its own sequence, with no
// splits, max_splits 8 and 16 (the GPU runner's), and at 16 also with the window-key write as a
// kernel of its own (num_seqs 0 turns the fused write off). Prefill: one sequence of 512 tokens
// (the runner passes no workspace for steps over 256 tokens). Each configuration runs eagerly and
// as a CUDA graph of kChain launches (no host launch cost: the time of the op in a chain of
// kernels, as in a decode step); the graph's output equals the eager one bit for bit.
TEST(V4SparseAttentionTiming, V4Decode) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kHeads = 64, kDim = 512, kRot = 64, kBlock = 64, kWindow = 128;
  constexpr int64_t kPhysBlocks = 1024;  // tables alias a pool of blocks (content is irrelevant)
  constexpr int64_t kPrefill = 512;
  std::mt19937 rng(7);
  auto d_window = Upload(Random(kPhysBlocks * kBlock * kDim, rng, 0.5f), DType::kBF16);
  auto d_comp = Upload(Random(kPhysBlocks * kBlock * kDim / 4, rng, 0.5f), DType::kBF16);
  struct Config {
    int64_t splits;
    bool fused;
  };
  for (const bool all : {false, true}) {
    const int64_t rate = all ? 128 : 4, cbs = std::max(kBlock, rate), rpb = cbs / rate;
    const int32_t pos = all ? 65535 : 8191;  // the last token's position
    const int64_t max_blocks = pos / kBlock + 1, cmax = pos / cbs + 1;
    for (const int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{64}, kPrefill}) {
      const bool prefill = tokens == kPrefill;
      const int64_t seqs = prefill ? 1 : tokens;
      std::vector<int32_t> tables(seqs * max_blocks), ctables(seqs * cmax);
      // The blocks the step writes keys to are the step's alone (ids below `own`), so that the
      // output does not depend on the order of the writes (the graph replay compares bits).
      const int64_t own = prefill ? kPrefill / kBlock : tokens;
      for (auto& b : tables) b = static_cast<int32_t>(own + rng() % (kPhysBlocks - own));
      for (int64_t s = 0; s < seqs; ++s) {
        const int64_t first = prefill ? (pos - kPrefill + 1) / kBlock : pos / kBlock;
        for (int64_t b = first; b <= pos / kBlock; ++b) {
          tables[s * max_blocks + b] = static_cast<int32_t>(prefill ? b - first : s);
        }
      }
      for (auto& b : ctables) b = static_cast<int32_t>(rng() % kPhysBlocks);
      std::vector<int32_t> seq(tokens), positions(tokens), selected(tokens * 512);
      for (int64_t t = 0; t < tokens; ++t) {
        seq[t] = static_cast<int32_t>(prefill ? 0 : t);
        positions[t] = static_cast<int32_t>(prefill ? pos - kPrefill + 1 + t : pos);
      }
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < 512; ++i) {
          selected[t * 512 + i] = static_cast<int32_t>(rng() % ((positions[t] + 1) / rate));
        }
      }
      // q in f32, as the GPU runner passes it.
      auto d_q = Upload(Random(tokens * kHeads * kDim, rng), DType::kF32);
      auto d_kv = Upload(Random(tokens * kDim, rng), DType::kF32);
      auto d_out = Poisoned(tokens * kHeads * kDim, DType::kBF16);
      auto d_tables = UploadRaw(tables), d_ctables = UploadRaw(ctables);
      auto d_seq = UploadRaw(seq), d_pos = UploadRaw(positions), d_sel = UploadRaw(selected);
      auto d_sinks = Upload(Random(kHeads, rng), DType::kF32);
      std::vector<float> inv_freq(kRot / 2);
      for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(1e-4f, 2.0f * i / kRot);
      auto d_inv = Upload(inv_freq, DType::kF32);
      constexpr int64_t kMaxSplits = 16;
      auto d_ws = Poisoned(kc::V4SparseAttentionWorkspaceFloats(tokens, kHeads, kDim, kMaxSplits),
                           DType::kF32);
      kc::V4SparseAttentionParams p;
      p.q = d_q.data();
      p.q_dtype = DType::kF32;
      p.q_stride = kHeads * kDim;
      p.kv = static_cast<const float*>(d_kv.data());
      p.kv_stride = kDim;
      p.out = d_out.data();
      p.out_dtype = DType::kBF16;
      p.out_stride = kHeads * kDim;
      p.num_tokens = tokens;
      p.num_heads = kHeads;
      p.head_dim = kDim;
      p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
      p.sinks = static_cast<const float*>(d_sinks.data());
      p.token_seq = static_cast<const int32_t*>(d_seq.data());
      p.positions = static_cast<const int32_t*>(d_pos.data());
      p.block_tables = static_cast<const int32_t*>(d_tables.data());
      p.max_blocks_per_seq = max_blocks;
      p.block_size = kBlock;
      p.window_kv = d_window.data();
      p.window_dtype = DType::kBF16;
      p.window = kWindow;
      p.compressed = d_comp.data();
      p.compressed_dtype = DType::kBF16;
      p.rate = rate;
      p.rows_per_block = rpb;
      p.compressed_tables = static_cast<const int32_t*>(d_ctables.data());
      p.compressed_max_blocks_per_seq = cmax;
      p.compressed_block_size = cbs;
      if (!all) {
        p.selected = static_cast<const int32_t*>(d_sel.data());
        p.num_selected = 512;
      }
      p.inv_freq = static_cast<const float*>(d_inv.data());
      p.rotary_dim = kRot;
      std::vector<Config> configs = {{0, false}};  // prefill: the write is separate anyway
      if (!prefill) configs = {{0, true}, {8, true}, {kMaxSplits, true}, {kMaxSplits, false}};
      // Each configuration on the mma.sync kernel (kernel 1), then on the wgmma kernel, whose
      // output must match the mma.sync one's within bf16-class error.
      std::vector<float> mma_out;
      for (const int kernel : {1, 0})
        for (const Config& cf : configs) {
          p.kernel = kernel;
          p.workspace = cf.splits > 0 ? static_cast<float*>(d_ws.data()) : nullptr;
          p.max_splits = cf.splits;
          p.num_seqs = cf.fused ? seqs : 0;
          auto stream = cuda::Stream::Create();
          ASSERT_TRUE(stream.ok());
          auto e0 = cuda::Event::Create(true), e1 = cuda::Event::Create(true);
          ASSERT_TRUE(e0.ok() && e1.ok());
          for (int i = 0; i < 3; ++i) ASSERT_CUDA_OK(kc::V4SparseAttention(p, stream->get()));
          constexpr int kIters = 20;
          ASSERT_TRUE(e0->Record(*stream).ok());
          for (int i = 0; i < kIters; ++i) ASSERT_CUDA_OK(kc::V4SparseAttention(p, stream->get()));
          ASSERT_TRUE(e1->Record(*stream).ok());
          ASSERT_TRUE(e1->Synchronize().ok());
          auto ms = cuda::Event::ElapsedMs(*e0, *e1);
          ASSERT_TRUE(ms.ok());
          const double us = *ms * 1000.0 / kIters;
          const auto out = Download(d_out, tokens * kHeads * kDim, DType::kBF16);
          for (const float v : out) ASSERT_TRUE(std::isfinite(v));
          if (kernel == 1 && mma_out.empty()) mma_out = out;
          const double vs_mma = RelError(out, mma_out);
          EXPECT_LT(vs_mma, 2e-2) << "wgmma vs mma.sync kernel";
          // A graph of kChain launches, replayed: the time of one launch without host cost, and
          // the same output as the eager launches.
          constexpr int kChain = 20, kReplays = 5;
          auto d_out_graph = Poisoned(tokens * kHeads * kDim, DType::kBF16);
          kc::V4SparseAttentionParams pg = p;
          pg.out = d_out_graph.data();
          ASSERT_TRUE(cuda::Graph::BeginCapture(*stream).ok());
          int captured = 0;
          for (int i = 0; i < kChain && captured == 0; ++i) {
            captured = kc::V4SparseAttention(pg, stream->get());
          }
          auto graph = cuda::Graph::EndCapture(*stream);
          ASSERT_CUDA_OK(captured);
          ASSERT_TRUE(graph.ok());
          ASSERT_TRUE(graph->Launch(*stream).ok());  // warm
          ASSERT_TRUE(e0->Record(*stream).ok());
          for (int i = 0; i < kReplays; ++i) ASSERT_TRUE(graph->Launch(*stream).ok());
          ASSERT_TRUE(e1->Record(*stream).ok());
          ASSERT_TRUE(e1->Synchronize().ok());
          auto graph_ms = cuda::Event::ElapsedMs(*e0, *e1);
          ASSERT_TRUE(graph_ms.ok());
          const double graph_us = *graph_ms * 1000.0 / (kReplays * kChain);
          // Bytes that must move: each token's 640 key rows, its q (f32) and its output (bf16).
          const double bytes = tokens * (640.0 * kDim * 2 + 6.0 * kHeads * kDim);
          std::printf(
              "[v4 %s %s %s] tokens %ld, max_splits %ld, %s write: %.1f us eager, %.1f us in a "
              "graph (%.0f GB/s), rel diff to mma.sync %.2g\n",
              kernel == 1 ? "mma.sync" : "wgmma", prefill ? "prefill" : "decode",
              all ? "window128+all512(rate128)" : "window128+sel512(rate4)",
              static_cast<long>(tokens), static_cast<long>(cf.splits),
              cf.fused ? "fused" : "separate", us, graph_us, bytes / graph_us * 1e-3, vs_mma);
          EXPECT_TRUE(SameBits(Download(d_out_graph, tokens * kHeads * kDim, DType::kBF16), out))
              << "graph replay differs from the eager launch";
        }
    }
  }
}

}  // namespace
}  // namespace dinfer
