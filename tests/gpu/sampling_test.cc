// Sampling on the device against the CPU sampler (sample::Sampler) on random logits: grammar
// masks and logit adjustments (bias, stop bans, penalties) exactly; greedy rows equal the CPU's
// argmax; sampled tokens always lie in the set the CPU's top-k / min-p / top-p keeps and, as
// both draw with the same counter-based uniform, agree with the CPU's tokens; the same seed and
// step give the same token in any batch; frequencies over many draws follow the CPU's
// probabilities (chi-square); logprobs match. Also prints the time of a 256 x 128k step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "backend/cuda/stream.h"
#include "engine/device_sample.h"
#include "gpu_test_util.h"
#include "kernels/cuda/sampling.h"
#include "sample/sampler.h"

namespace dinfer {
namespace {

namespace kc = kernels::cuda;
using gpu_test::DownloadRaw;
using gpu_test::UploadRaw;

// A batch's rows: the logits [rows, vocab], the samplers' state and masks.
struct Case {
  int64_t vocab = 0;
  std::vector<float> logits;
  std::vector<sample::SamplingParams> params;
  std::vector<std::vector<int32_t>> prompts, accepted;
  std::vector<uint64_t> steps;               // draws before this one
  std::vector<std::vector<uint32_t>> masks;  // empty: none
  std::vector<int32_t> mask_vocab;
  int64_t rows() const { return static_cast<int64_t>(params.size()); }
};

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // after masks and adjustments
  std::vector<float> logprob;
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
  double ms = 0;
};

sample::Sampler MakeSampler(const Case& c, int64_t r) {
  sample::Sampler s(c.params[r]);
  s.SetPrompt(c.prompts[r]);
  for (int32_t t : c.accepted[r]) s.Accept(t);
  for (uint64_t i = 0; i < c.steps[r]; ++i) s.AdvanceStep();
  return s;
}

// The rows' logits as the CPU sampler is given them: masked.
std::vector<float> MaskedRow(const Case& c, int64_t r) {
  std::vector<float> row(c.logits.begin() + r * c.vocab, c.logits.begin() + (r + 1) * c.vocab);
  if (!c.masks[r].empty()) {
    for (int64_t t = 0; t < c.vocab; ++t) {
      if (t >= c.mask_vocab[r] || !((c.masks[r][t >> 5] >> (t & 31)) & 1u)) row[t] = -INFINITY;
    }
  }
  return row;
}

Result RunDevice(const Case& c, int repeats = 1) {
  DeviceSampleBatch b;
  for (int64_t r = 0; r < c.rows(); ++r) {
    sample::Sampler s = MakeSampler(c, r);
    AppendDeviceSampleRow(s, b);
    if (!c.masks[r].empty()) {
      b.rows.back().mask_offset = static_cast<int64_t>(b.masks.size());
      b.rows.back().mask_vocab = c.mask_vocab[r];
      b.masks.insert(b.masks.end(), c.masks[r].begin(), c.masks[r].end());
    }
  }
  std::vector<kc::SamplingRow> rows;
  bool any_mask = false, any_logprobs = false;
  for (const DeviceSampleRow& r : b.rows) {
    kc::SamplingRow k;
    k.temperature = r.temperature;
    k.top_p = r.top_p;
    k.min_p = r.min_p;
    k.repetition_penalty = r.repetition_penalty;
    k.presence_penalty = r.presence_penalty;
    k.frequency_penalty = r.frequency_penalty;
    k.seed = r.seed;
    k.step = r.step;
    k.top_k = r.top_k;
    k.logprobs = r.logprobs;
    k.mask_offset = r.mask_offset;
    k.mask_vocab = r.mask_vocab;
    k.adjust_begin = r.adjust_begin;
    k.adjust_end = r.adjust_end;
    rows.push_back(k);
    any_mask |= r.mask_offset >= 0;
    any_logprobs |= r.logprobs >= 0;
  }
  std::vector<kc::TokenAdjustment> adjust;
  for (const DeviceTokenAdjust& a : b.adjustments) {
    adjust.push_back(kc::TokenAdjustment{a.token, a.count, a.bias_begin, a.bias_end,
                                         static_cast<uint8_t>(a.seen),
                                         static_cast<uint8_t>(a.ban)});
  }
  const auto n = static_cast<size_t>(c.rows());
  auto d_params = UploadRaw(rows);
  auto d_masks = UploadRaw(b.masks);
  auto d_adjust = UploadRaw(adjust);
  auto d_biases = UploadRaw(b.biases);
  auto d_saved = UploadRaw(std::vector<float>(adjust.size() + 1));
  auto d_tokens = UploadRaw(std::vector<int32_t>(n, -7));
  auto d_logprob = UploadRaw(std::vector<float>(n));
  auto d_top = UploadRaw(std::vector<int32_t>(n * kc::kMaxSampleLogprobs));
  auto d_top_lp = UploadRaw(std::vector<float>(n * kc::kMaxSampleLogprobs));
  auto d_norm = UploadRaw(std::vector<double>(n));
  kc::SampleRowsParams p;
  p.rows = c.rows();
  p.vocab = c.vocab;
  p.stride = c.vocab;
  p.params = static_cast<const kc::SamplingRow*>(d_params.data());
  p.masks = static_cast<const uint32_t*>(d_masks.data());
  p.adjustments = static_cast<const kc::TokenAdjustment*>(d_adjust.data());
  p.biases = static_cast<const float*>(d_biases.data());
  p.saved = static_cast<float*>(d_saved.data());
  p.tokens = static_cast<int32_t*>(d_tokens.data());
  p.logprob = static_cast<float*>(d_logprob.data());
  p.top_tokens = static_cast<int32_t*>(d_top.data());
  p.top_logprobs = static_cast<float*>(d_top_lp.data());
  p.log_norm = static_cast<double*>(d_norm.data());
  p.any_mask = any_mask;
  p.any_logprobs = any_logprobs;
  p.num_adjustments = static_cast<int64_t>(adjust.size());
  Result res;
  for (int i = 0; i < repeats; ++i) {
    auto d_logits = UploadRaw(c.logits);
    p.logits = static_cast<float*>(d_logits.data());
    EXPECT_TRUE(cuda::Synchronize().ok());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(kc::SampleRows(p, nullptr), 0);
    EXPECT_TRUE(cuda::Synchronize().ok());
    res.ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i + 1 == repeats) res.logits = DownloadRaw<float>(d_logits, c.logits.size());
  }
  res.tokens = DownloadRaw<int32_t>(d_tokens, n);
  res.logprob = DownloadRaw<float>(d_logprob, n);
  res.top_tokens = DownloadRaw<int32_t>(d_top, n * kc::kMaxSampleLogprobs);
  res.top_logprobs = DownloadRaw<float>(d_top_lp, n * kc::kMaxSampleLogprobs);
  return res;
}

std::vector<float> RandomLogits(int64_t rows, int64_t vocab, std::mt19937& rng, float scale) {
  std::vector<float> v = gpu_test::Random(static_cast<size_t>(rows * vocab), rng, scale);
  // Some exact ties, which the order (logit, then index) must settle as the CPU does.
  for (size_t i = 0; i < v.size(); i += 7) v[i] = std::round(v[i] * 4) / 4;
  return v;
}

Case MakeCase(int64_t rows, int64_t vocab, std::mt19937& rng, float scale = 3.0f) {
  Case c;
  c.vocab = vocab;
  c.logits = RandomLogits(rows, vocab, rng, scale);
  c.params.resize(rows);
  c.prompts.resize(rows);
  c.accepted.resize(rows);
  c.steps.assign(rows, 0);
  c.masks.resize(rows);
  c.mask_vocab.assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    c.params[r].seed = rng();
    c.steps[r] = rng() % 100;
  }
  return c;
}

void AddMask(Case& c, int64_t r, std::mt19937& rng, double density) {
  c.mask_vocab[r] = static_cast<int32_t>(c.vocab - (r % 3 == 0 ? 17 : 0));
  c.masks[r].assign(static_cast<size_t>((c.vocab + 31) / 32), 0);
  std::bernoulli_distribution allow(density);
  for (int64_t t = 0; t < c.vocab; ++t) {
    if (allow(rng)) c.masks[r][t >> 5] |= 1u << (t & 31);
  }
  c.masks[r][0] |= 2u;  // never empty
}

void AddPenalties(Case& c, int64_t r, std::mt19937& rng) {
  sample::SamplingParams& p = c.params[r];
  p.repetition_penalty = 1.0 + (rng() % 5) * 0.1;
  p.presence_penalty = (static_cast<int>(rng() % 5) - 2) * 0.5;
  p.frequency_penalty = (static_cast<int>(rng() % 5) - 2) * 0.3;
  for (int i = 0; i < 6; ++i) {
    p.logit_bias.emplace_back(static_cast<int32_t>(rng() % c.vocab), (rng() % 200) / 10.0f - 10);
  }
  p.logit_bias.push_back(p.logit_bias[0]);  // a duplicate adds twice
  p.min_tokens = static_cast<int32_t>(rng() % 3);
  p.stop_token_ids = {0, static_cast<int32_t>(rng() % c.vocab)};
  for (int i = 0; i < 40; ++i) c.prompts[r].push_back(static_cast<int32_t>(rng() % c.vocab));
  for (int i = 0; i < 12; ++i) c.accepted[r].push_back(static_cast<int32_t>(rng() % 50));
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(GpuSampling, UniformIsTheCpus) {
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
    for (uint64_t step = 0; step < 100; ++step) {
      EXPECT_EQ(kc::SamplingUniform(seed, step), sample::UniformDraw(seed, step));
    }
  }
}

// Masks and adjustments leave exactly the logits the CPU computes; greedy rows pick its argmax.
TEST(GpuSampling, MasksAndAdjustmentsExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  Case c = MakeCase(24, 5003, rng);
  for (int64_t r = 0; r < c.rows(); ++r) {
    c.params[r].temperature = r % 4 == 3 ? 1.0 : 0.0;
    c.params[r].top_k = r % 4 == 3 ? 1 : 0;  // greedy either way
    if (r % 2 == 0) AddMask(c, r, rng, 0.3);
    if (r % 3 != 2) AddPenalties(c, r, rng);
  }
  const Result got = RunDevice(c);
  for (int64_t r = 0; r < c.rows(); ++r) {
    std::vector<float> want = MaskedRow(c, r);
    const sample::Sampler s = MakeSampler(c, r);
    s.ProcessLogits(want);
    int bad = 0;
    for (int64_t t = 0; t < c.vocab; ++t) {
      bad += !SameFloat(got.logits[r * c.vocab + t], want[t]);
    }
    EXPECT_EQ(bad, 0) << "row " << r;
    EXPECT_EQ(got.tokens[r], sample::Argmax(want)) << "row " << r;
  }
}

// The tokens the CPU's truncation keeps, for a row already masked and adjusted.
std::set<int32_t> AllowedSet(const std::vector<float>& logits, const sample::SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> sorted;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) sorted.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const bool top_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < logits.size();
  if (top_k && sorted.size() > static_cast<size_t>(p.top_k)) sorted.resize(p.top_k);
  const double max = sorted[0].first;
  std::vector<double> w;
  double z = 0;
  for (const auto& [l, i] : sorted) {
    w.push_back(std::exp((l - max) / p.temperature));
    z += w.back();
  }
  size_t cut = 1;
  while (cut < w.size() && w[cut] >= p.min_p) ++cut;
  if (p.top_p < 1.0) {
    double cum = 0;
    size_t n = 0;
    while (n < cut) {
      cum += w[n++] / z;
      if (cum >= p.top_p) break;
    }
    cut = n;
  }
  std::set<int32_t> keep;
  // Slack for rounding at the edge: the next token in order is accepted too.
  for (size_t i = 0; i < std::min(cut + 1, sorted.size()); ++i) keep.insert(sorted[i].second);
  return keep;
}

void SetSampling(sample::SamplingParams& p, int64_t r) {
  static const double kTemps[] = {0.5, 1.0, 1.5};
  static const int kTopK[] = {0, 5, 50, 1000, 0, 0};
  static const double kTopP[] = {1.0, 0.9, 0.5, 1.0};
  static const double kMinP[] = {0.0, 0.05, 0.0};
  p.temperature = kTemps[r % 3];
  p.top_k = kTopK[r % 6];
  p.top_p = kTopP[(r / 2) % 4];
  p.min_p = kMinP[(r / 3) % 3];
}

TEST(GpuSampling, TokensInTheCpusSetAndEqualToTheCpus) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (int64_t vocab : {int64_t{97}, int64_t{32000}, int64_t{131072}}) {
    Case c = MakeCase(72, vocab, rng, vocab > 1000 ? 2.0f : 1.0f);
    for (int64_t r = 0; r < c.rows(); ++r) {
      SetSampling(c.params[r], r);
      if (r % 5 == 0) AddMask(c, r, rng, 0.5);
      if (r % 7 == 0) AddPenalties(c, r, rng);
    }
    const Result got = RunDevice(c);
    int same = 0;
    for (int64_t r = 0; r < c.rows(); ++r) {
      std::vector<float> row = MaskedRow(c, r);
      sample::Sampler s = MakeSampler(c, r);
      const int32_t want = s.Sample(row);
      s.ProcessLogits(row);
      const std::set<int32_t> allowed = AllowedSet(row, c.params[r]);
      EXPECT_TRUE(allowed.count(got.tokens[r]))
          << "vocab " << vocab << " row " << r << " token " << got.tokens[r];
      same += got.tokens[r] == want;
    }
    // Both walk the same order with the same uniform number; only rounding at a boundary
    // (weights in f32 and fixed point here, f64 there) can differ.
    EXPECT_GE(same, c.rows() - 2) << "vocab " << vocab;
    std::printf("[sampling] vocab %lld: %d of %lld tokens equal to the CPU's\n",
                static_cast<long long>(vocab), same, static_cast<long long>(c.rows()));
  }
}

TEST(GpuSampling, SameSeedSameTokenInAnyBatch) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  Case c = MakeCase(40, 20000, rng);
  for (int64_t r = 0; r < c.rows(); ++r) {
    SetSampling(c.params[r], r);
    if (r % 4 == 0) AddMask(c, r, rng, 0.5);
    if (r % 3 == 0) AddPenalties(c, r, rng);
  }
  const Result first = RunDevice(c);
  EXPECT_EQ(RunDevice(c).tokens, first.tokens);
  // The same rows reversed and with other rows between them.
  Case mixed = MakeCase(0, c.vocab, rng);
  Case other = MakeCase(c.rows(), c.vocab, rng);
  std::vector<int64_t> where;
  for (int64_t r = c.rows() - 1; r >= 0; --r) {
    for (const Case* from : {&other, &c}) {
      mixed.logits.insert(mixed.logits.end(), from->logits.begin() + r * c.vocab,
                          from->logits.begin() + (r + 1) * c.vocab);
      mixed.params.push_back(from->params[r]);
      mixed.prompts.push_back(from->prompts[r]);
      mixed.accepted.push_back(from->accepted[r]);
      mixed.steps.push_back(from->steps[r]);
      mixed.masks.push_back(from->masks[r]);
      mixed.mask_vocab.push_back(from->mask_vocab[r]);
    }
    where.push_back(mixed.rows() - 1);
  }
  const Result again = RunDevice(mixed);
  for (int64_t r = 0; r < c.rows(); ++r) {
    EXPECT_EQ(again.tokens[where[c.rows() - 1 - r]], first.tokens[r]) << "row " << r;
  }
}

// Over many draws (one row per step) the frequencies follow the CPU's probabilities.
TEST(GpuSampling, DistributionMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  // Peaked: 40 tokens. Wide: 40 tokens and 3,960 tied ones 5 below the top, more candidates
  // than the kernel keeps in shared memory, so the walks read the whole row.
  const std::vector<float> peaked = gpu_test::Random(40, rng, 1.5f);
  std::vector<float> wide = peaked;
  wide.resize(4000, *std::max_element(peaked.begin(), peaked.end()) - 5.0f);
  struct Setting {
    double temperature, top_p, min_p;
    int top_k;
    bool wide;
  };
  for (const Setting& set : {Setting{0.7, 1.0, 0.0, 0, false}, Setting{1.0, 0.8, 0.0, 0, false},
                             Setting{1.2, 1.0, 0.0, 10, false}, Setting{1.0, 1.0, 0.1, 0, false},
                             Setting{1.3, 0.9, 0.02, 20, false}, Setting{1.0, 0.9, 0.0, 0, true},
                             Setting{1.0, 1.0, 0.0, 3500, true}}) {
    const std::vector<float>& logits = set.wide ? wide : peaked;
    const auto kVocab = static_cast<int64_t>(logits.size());
    const int64_t kDraws = set.wide ? 20000 : 40000;
    Case c = MakeCase(0, kVocab, rng);
    for (int64_t i = 0; i < kDraws; ++i) {
      c.logits.insert(c.logits.end(), logits.begin(), logits.end());
      sample::SamplingParams p;
      p.temperature = set.temperature;
      p.top_p = set.top_p;
      p.min_p = set.min_p;
      p.top_k = set.top_k;
      p.seed = 77;
      c.params.push_back(p);
      c.prompts.emplace_back();
      c.accepted.emplace_back();
      c.steps.push_back(static_cast<uint64_t>(i));
      c.masks.emplace_back();
      c.mask_vocab.push_back(0);
    }
    const Result got = RunDevice(c);
    // The CPU's distribution: its truncation (without the rounding slack), then weights.
    std::vector<std::pair<float, int32_t>> sorted;
    for (int32_t i = 0; i < kVocab; ++i) sorted.emplace_back(logits[i], i);
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    if (set.top_k > 0) sorted.resize(set.top_k);
    std::vector<double> w;
    double z = 0;
    for (const auto& [l, i] : sorted) {
      w.push_back(std::exp((l - sorted[0].first) / set.temperature));
      z += w.back();
    }
    size_t cut = 1;
    while (cut < w.size() && w[cut] >= set.min_p) ++cut;
    if (set.top_p < 1.0) {
      double cum = 0;
      size_t n = 0;
      while (n < cut) {
        cum += w[n++] / z;
        if (cum >= set.top_p) break;
      }
      cut = n;
    }
    double total = 0;
    for (size_t i = 0; i < cut; ++i) total += w[i];
    std::map<int32_t, int64_t> counts;
    for (int32_t t : got.tokens) ++counts[t];
    double chi2 = 0;
    int64_t inside = 0;
    for (size_t i = 0; i < cut; ++i) {
      const double expected = kDraws * w[i] / total;
      const double o = static_cast<double>(counts[sorted[i].second]);
      chi2 += (o - expected) * (o - expected) / expected;
      inside += counts[sorted[i].second];
    }
    EXPECT_EQ(inside, kDraws) << "draws outside the CPU's set";
    const double df = static_cast<double>(cut) - 1;
    // Far beyond the 1e-4 tail of chi-square(df); a biased sampler lands far past it.
    EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df) + 10)
        << "temperature " << set.temperature << " top_p " << set.top_p << " top_k " << set.top_k
        << " min_p " << set.min_p;
    std::printf("[sampling] chi-square %.1f with %.0f degrees of freedom\n", chi2, df);
  }
}

TEST(GpuSampling, LogprobsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  Case c = MakeCase(16, 30011, rng);
  for (int64_t r = 0; r < c.rows(); ++r) {
    SetSampling(c.params[r], r);
    c.params[r].logprobs = static_cast<int>(r % 4 == 0 ? 0 : (r % 4) * 5);
    if (r % 2 == 0) AddMask(c, r, rng, r == 4 ? 0.0002 : 0.4);  // row 4: a handful allowed
    if (r % 3 == 0) AddPenalties(c, r, rng);
  }
  const Result got = RunDevice(c);
  for (int64_t r = 0; r < c.rows(); ++r) {
    const std::vector<float> row = MaskedRow(c, r);
    sample::Sampler s = MakeSampler(c, r);
    const sample::SampleResult want = s.SampleWithLogprobs(row);
    if (got.tokens[r] != want.token) continue;  // a rounding-edge draw (counted elsewhere)
    if (std::isinf(want.logprob)) {
      EXPECT_EQ(got.logprob[r], want.logprob) << "row " << r;
    } else {
      EXPECT_NEAR(got.logprob[r], want.logprob, 1e-4) << "row " << r;
    }
    std::map<int32_t, float> top, want_top;
    for (int j = 0; j < c.params[r].logprobs; ++j) {
      const int32_t t = got.top_tokens[r * kc::kMaxSampleLogprobs + j];
      if (t < 0) break;
      top[t] = got.top_logprobs[r * kc::kMaxSampleLogprobs + j];
    }
    for (const auto& [t, lp] : want.top) want_top[t] = lp;
    ASSERT_EQ(top.size(), want_top.size()) << "row " << r;
    for (const auto& [t, lp] : want_top) {
      ASSERT_TRUE(top.count(t)) << "row " << r << " token " << t;
      if (std::isinf(lp)) {
        EXPECT_EQ(top[t], lp) << "row " << r << " token " << t;
      } else {
        EXPECT_NEAR(top[t], lp, 1e-4) << "row " << r << " token " << t;
      }
    }
  }
}

// The cost of one engine step's sampling at 256 sequences x 128k vocabulary, on the device and
// with the CPU sampler (one thread), printed for the record: flat random logits (the truncations
// read the whole row) and peaked ones, as language models give (a few dozen tokens in reach).
TEST(GpuSampling, StepTime) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  for (bool peaked : {false, true}) {
    Case c = MakeCase(256, 128256, rng, 2.0f);
    for (int64_t r = 0; r < c.rows(); ++r) {
      c.params[r].temperature = 0.8;
      c.params[r].top_p = r % 2 == 0 ? 0.95 : 1.0;
      c.params[r].top_k = r % 4 == 1 ? 50 : 0;
      if (!peaked) continue;
      for (int i = 0; i < 30; ++i) c.logits[r * c.vocab + rng() % c.vocab] += 12.0f + i % 7;
    }
    const Result got = RunDevice(c, 3);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < c.rows(); ++r) {
      sample::Sampler s = MakeSampler(c, r);
      std::vector<float> row = MaskedRow(c, r);
      (void)s.Sample(row);
    }
    const double cpu_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("[sampling] 256 x 128256 %s: device %.3f ms, CPU (one thread) %.3f ms\n",
                peaked ? "peaked" : "flat", got.ms, cpu_ms);
  }
}

}  // namespace
}  // namespace dinfer
