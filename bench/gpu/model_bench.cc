// Model benchmarks on a random-weight model of a real shape (bf16 weights made on the device):
// batch-1 decode against the read-bandwidth roofline, prefill of 8 × 2,048 tokens, the device's
// idle gap between decode steps at batch 64 (CUDA events), and 1,000 in / 1,000 out at 256
// concurrent sequences. Decode steps replay CUDA graphs and take their input tokens from the
// previous step's greedy choice on the device, so the host never waits for the device.
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>

#include "base/mapped_file.h"
#include "bench/gpu/bench_common.h"
#include "bench/gpu/trace_report.h"
#include "model/config.h"
#include "runner/cuda/gpu_decoder.h"
#include "runner/cuda/gpu_runner.h"

namespace dinfer::bench {
namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr int64_t kBlockSize = 16, kMaxSeqLen = 2048, kMaxSeqs = 256;
constexpr int64_t kBlocksPerSeq = kMaxSeqLen / kBlockSize;

struct Seqs {
  std::vector<std::vector<int32_t>> tables, prompts;
  std::vector<int32_t> last;  // each sequence's last sampled token
};

// Sequence i's blocks are [i * kBlocksPerSeq, (i + 1) * kBlocksPerSeq), in order, or with
// `shuffle` the same blocks of all n sequences dealt out in a random order.
Seqs MakeSeqs(int64_t n, int64_t prompt_len, int64_t vocab, uint32_t seed, bool shuffle) {
  Seqs s;
  std::mt19937 rng(seed);
  std::vector<int32_t> blocks(static_cast<size_t>(n * kBlocksPerSeq));
  std::iota(blocks.begin(), blocks.end(), 0);
  if (shuffle) std::shuffle(blocks.begin(), blocks.end(), rng);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> table(blocks.begin() + i * kBlocksPerSeq,
                               blocks.begin() + (i + 1) * kBlocksPerSeq);
    s.tables.push_back(std::move(table));
    std::vector<int32_t> p(prompt_len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
    s.prompts.push_back(std::move(p));
  }
  s.last.assign(n, 0);
  return s;
}

// Prefills every sequence (as many per step as fit in max_tokens) and keeps the greedy tokens.
Status Prefill(GpuRunner& r, Seqs& s, int64_t max_tokens) {
  const int64_t n = static_cast<int64_t>(s.prompts.size());
  int64_t i = 0;
  while (i < n) {
    std::vector<SeqChunk> chunks;
    int64_t tokens = 0, first = i;
    while (i < n && tokens + static_cast<int64_t>(s.prompts[i].size()) <= max_tokens) {
      chunks.push_back({s.prompts[i], 0, s.tables[i], SeqChunk::Logits::kLast});
      tokens += static_cast<int64_t>(s.prompts[i].size());
      ++i;
    }
    DINFER_RETURN_IF_ERROR(r.Launch(chunks, LaunchOptions{true, false}));
    DINFER_ASSIGN_OR_RETURN(auto tokens_out, r.GreedyTokens());
    std::copy(tokens_out.begin(), tokens_out.end(), s.last.begin() + first);
  }
  return OkStatus();
}

// One decode step of every sequence at position `pos`; tokens from the device after the first.
Status DecodeStep(GpuRunner& r, Seqs& s, int64_t pos, bool from_device) {
  std::vector<SeqChunk> chunks;
  for (size_t i = 0; i < s.tables.size(); ++i) {
    chunks.push_back({std::span(&s.last[i], 1), pos, s.tables[i], SeqChunk::Logits::kLast});
  }
  return r.Launch(chunks, LaunchOptions{true, from_device});
}

// FLOPs of a forward pass over `tokens` tokens whose attention covers `pairs` (query, key) pairs,
// with logits for `logits_rows` rows.
double ForwardFlops(const ModelConfig& c, double tokens, double pairs, double logits_rows) {
  const double h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const double per_layer = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size;
  return 2.0 * per_layer * c.num_layers * tokens + 2.0 * h * c.vocab_size * logits_rows +
         4.0 * c.head_dim * c.num_heads * c.num_layers * pairs;
}

double KvBytesPerToken(const ModelConfig& c, bool fp8) {
  return 2.0 * c.num_layers * c.num_kv_heads * c.head_dim * (fp8 ? 1 : 2);
}

// The hardware bound of `seqs` sequences of `in` prompt tokens and `out` output tokens on this GPU,
// in seconds: the prompts' linear layers and attention at the measured GEMM rate; each decode
// step's linear layers at that rate or reading the weights at the measured bandwidth, whichever
// takes longer, plus the step's KV cache read at that bandwidth; one after the other (as a
// forward pass runs them: compute-bound and memory-bound kernels do not overlap).
double ServingRooflineSeconds(const ModelConfig& c, double weight_bytes, double kv_bytes_per_token,
                              double linear_tflops, const Limits& limits, int64_t seqs, int64_t in,
                              int64_t out) {
  const double flop_s = linear_tflops * 1e12, byte_s = limits.read_gbs * 1e9;
  const double pairs = static_cast<double>(in) * (in + 1) / 2.0;
  double t = ForwardFlops(c, static_cast<double>(seqs * in), seqs * pairs, seqs) / flop_s;
  // Every decode step's linear layers: their FLOPs, or reading the weights, whichever is longer.
  const double linear = std::max(ForwardFlops(c, seqs, 0, seqs) / flop_s, weight_bytes / byte_s);
  for (int64_t i = 1; i < out; ++i) {
    const double keys = static_cast<double>(in + i);  // each sequence's keys at this step
    t += linear + seqs * keys * kv_bytes_per_token / byte_s;
  }
  return t;
}

}  // namespace

StatusOr<json::object> ModelBench(const ModelBenchOptions& o, const Limits& limits) {
  DINFER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(o.config_path));
  DINFER_ASSIGN_OR_RETURN(ModelConfig c, ParseHfConfig(text, o.config_path));
  json::object out;
  const auto t0 = Clock::now();
  DINFER_ASSIGN_OR_RETURN(auto model, GpuDecoder::Random(c, 7));
  if (o.fp8) DINFER_RETURN_IF_ERROR(model->QuantizeWeightsFp8());
  const int64_t weight_bytes = model->weight_bytes();
  GpuRunnerOptions ro;
  ro.block_size = kBlockSize;
  ro.max_seq_len = kMaxSeqLen;
  ro.num_blocks = kMaxSeqs * kBlocksPerSeq;
  ro.max_num_tokens = 16384;
  ro.max_num_seqs = kMaxSeqs;
  const bool kv_fp8 = o.fp8 || o.kv_fp8;
  if (kv_fp8) ro.kv_cache_dtype = DType::kF8E4M3;
  DINFER_ASSIGN_OR_RETURN(auto runner, GpuRunner::Create(std::move(model), ro));
  GpuRunner& r = *runner;
  const cuda::Stream& stream = r.stream();
  out["init_s"] = Seconds(t0, Clock::now());
  out["weight_bytes"] = weight_bytes;
  out["config"] = o.config_path;
  out["fp8"] = o.fp8;
  out["kv_fp8"] = kv_fp8;
  out["shuffled_blocks"] = o.shuffle_blocks;
  std::printf("model: %.2f GB of %s weights, ready in %.1f s\n", weight_bytes / 1e9,
              o.fp8 ? "fp8 (layers) + bf16" : "bf16", Seconds(t0, Clock::now()));
  if (kv_fp8) std::printf("FP8 (e4m3) KV cache\n");

  if (!o.throughput_only && !o.prefill_only) {  // Batch-1 decode.
    Seqs s = MakeSeqs(1, 128, c.vocab_size, 1, o.shuffle_blocks);
    DINFER_RETURN_IF_ERROR(Prefill(r, s, ro.max_num_tokens));
    int64_t pos = 128;
    for (int i = 0; i < 16; ++i) DINFER_RETURN_IF_ERROR(DecodeStep(r, s, pos++, i > 0));
    const int kSteps = o.decode_only ? 16 : 256;
    DINFER_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create(true));
    DINFER_ASSIGN_OR_RETURN(cuda::Event end, cuda::Event::Create(true));
    DINFER_RETURN_IF_ERROR(start.Record(stream));
    const int64_t first_pos = pos;
    for (int i = 0; i < kSteps; ++i) DINFER_RETURN_IF_ERROR(DecodeStep(r, s, pos++, true));
    DINFER_RETURN_IF_ERROR(end.Record(stream));
    DINFER_RETURN_IF_ERROR(end.Synchronize());
    DINFER_ASSIGN_OR_RETURN(float ms, cuda::Event::ElapsedMs(start, end));
    const double step_ms = ms / kSteps;
    const double avg_ctx = (first_pos + pos) / 2.0;
    const double bytes = weight_bytes + avg_ctx * KvBytesPerToken(c, kv_fp8);
    const double floor_ms = bytes / limits.read_gbs / 1e6;
    out["decode_b1"] = json::object{{"step_ms", step_ms},         {"tok_s", 1000.0 / step_ms},
                                    {"bytes_per_step", bytes},    {"roofline_step_ms", floor_ms},
                                    {"average_context", avg_ctx}, {"steps", kSteps}};
    out["decode_b1_roofline_fraction"] = floor_ms / step_ms;
    std::printf("decode b1: %.3f ms/step (%.1f tok/s), roofline %.3f ms: fraction %.3f\n", step_ms,
                1000.0 / step_ms, floor_ms, floor_ms / step_ms);
    if (!o.trace_path.empty()) {
      DINFER_ASSIGN_OR_RETURN(
          out["trace_b1"],
          TraceSteps(
              stream, [&] { return DecodeStep(r, s, pos++, true); }, o.trace_path));
      // And a step of 256 sequences at 1,000 tokens of context, as in the middle of the
      // 1,000/1,000 run (its products run on cuBLASLt, untraced: their time falls in the gap
      // before each traced launch).
      Seqs wide = MakeSeqs(256, 1000, c.vocab_size, 5, o.shuffle_blocks);
      DINFER_RETURN_IF_ERROR(Prefill(r, wide, ro.max_num_tokens));
      int64_t wide_pos = 1000;
      for (int i = 0; i < 4; ++i) DINFER_RETURN_IF_ERROR(DecodeStep(r, wide, wide_pos++, i > 0));
      std::string wide_path = o.trace_path;
      const size_t dot = wide_path.rfind(".csv");
      wide_path.insert(dot == std::string::npos ? wide_path.size() : dot, "_b256");
      DINFER_ASSIGN_OR_RETURN(
          out["trace_b256"],
          TraceSteps(
              stream, [&] { return DecodeStep(r, wide, wide_pos++, true); }, wide_path));
    }
  }

  if (o.decode_only) return out;

  // One step of `n` prompts of `len` tokens each, timed; its figures go to out[key].
  auto time_prompts = [&](int64_t n, int64_t len, const char* key) -> StatusOr<double> {
    Seqs s = MakeSeqs(n, len, c.vocab_size, 2, o.shuffle_blocks);
    std::vector<SeqChunk> chunks;
    for (int64_t i = 0; i < n; ++i)
      chunks.push_back({s.prompts[i], 0, s.tables[i], SeqChunk::Logits::kLast});
    DINFER_ASSIGN_OR_RETURN(double ms, TimeMs(stream, 1, 5, [&] { return r.Launch(chunks); }));
    const double tokens = static_cast<double>(n * len), pairs = n * len * (len + 1.0) / 2;
    const double flops = ForwardFlops(c, tokens, pairs, static_cast<double>(n));
    out[key] = json::object{
        {"ms", ms}, {"tok_s", tokens / ms * 1e3}, {"flops", flops}, {"tflops", flops / ms / 1e9}};
    std::printf("%s: %.1f ms, %.0f tok/s, %.0f TFLOP/s\n", key, ms, tokens / ms * 1e3,
                flops / ms / 1e9);
    return flops / ms / 1e9;
  };
  if (!o.throughput_only) {  // Prefill, 8 × 2,048 tokens in one step.
    DINFER_ASSIGN_OR_RETURN(out["prefill_tflops"], time_prompts(8, 2048, "prefill_8x2048"));
  }
  if (o.prefill_only) {  // And a prompt step of the 1,000 / 1,000 run.
    DINFER_RETURN_IF_ERROR(time_prompts(16, 1000, "prefill_16x1000").status());
    return out;
  }

  if (!o.throughput_only) {  // Idle gaps between decode steps at batch 64.
    Seqs s = MakeSeqs(64, 512, c.vocab_size, 3, o.shuffle_blocks);
    DINFER_RETURN_IF_ERROR(Prefill(r, s, ro.max_num_tokens));
    int64_t pos = 512;
    for (int i = 0; i < 8; ++i) DINFER_RETURN_IF_ERROR(DecodeStep(r, s, pos++, i > 0));
    constexpr int kSteps = 128;
    std::vector<cuda::Event> starts, ends;
    for (int i = 0; i < kSteps; ++i) {
      DINFER_ASSIGN_OR_RETURN(cuda::Event a, cuda::Event::Create(true));
      DINFER_ASSIGN_OR_RETURN(cuda::Event b, cuda::Event::Create(true));
      starts.push_back(std::move(a));
      ends.push_back(std::move(b));
    }
    for (int i = 0; i < kSteps; ++i) {
      DINFER_RETURN_IF_ERROR(starts[i].Record(stream));
      DINFER_RETURN_IF_ERROR(DecodeStep(r, s, pos++, true));
      DINFER_RETURN_IF_ERROR(ends[i].Record(stream));
    }
    DINFER_RETURN_IF_ERROR(stream.Synchronize());
    std::vector<double> steps, gaps;
    double gap_sum = 0, step_sum = 0;
    for (int i = 0; i < kSteps; ++i) {
      DINFER_ASSIGN_OR_RETURN(float st, cuda::Event::ElapsedMs(starts[i], ends[i]));
      steps.push_back(st);
      step_sum += st;
      if (i + 1 < kSteps) {
        DINFER_ASSIGN_OR_RETURN(float g, cuda::Event::ElapsedMs(ends[i], starts[i + 1]));
        gaps.push_back(g);
        gap_sum += g;
      }
    }
    out["gaps_b64"] = json::object{{"step_ms_median", Median(steps)},
                                   {"gap_ms_median", Median(gaps)},
                                   {"gap_ms_mean", gap_sum / gaps.size()},
                                   {"gap_fraction", gap_sum / step_sum},
                                   {"steps", kSteps}};
    out["idle_gap_fraction_b64"] = gap_sum / step_sum;
    std::printf("batch 64 decode: %.3f ms/step, idle gap %.4f ms mean (%.4f of step time)\n",
                Median(steps), gap_sum / gaps.size(), gap_sum / step_sum);
  }

  if (o.throughput) {  // 1,000 in / 1,000 out, 256 sequences at once.
    constexpr int64_t kIn = 1000, kOut = 1000;
    Seqs s = MakeSeqs(256, kIn, c.vocab_size, 4, o.shuffle_blocks);
    DINFER_RETURN_IF_ERROR(stream.Synchronize());
    const auto start = Clock::now();
    DINFER_RETURN_IF_ERROR(Prefill(r, s, ro.max_num_tokens));
    const auto prefilled = Clock::now();
    for (int64_t i = 1; i < kOut; ++i) {
      DINFER_RETURN_IF_ERROR(DecodeStep(r, s, kIn + i - 1, i > 1));
    }
    DINFER_ASSIGN_OR_RETURN(auto last, r.GreedyTokens());
    const auto done = Clock::now();
    const double total = Seconds(start, done);
    out["throughput_1000_1000_c256"] = json::object{{"seconds", total},
                                                    {"prefill_seconds", Seconds(start, prefilled)},
                                                    {"decode_seconds", Seconds(prefilled, done)},
                                                    {"output_tokens", 256 * kOut},
                                                    {"tok_s", 256.0 * kOut / total},
                                                    {"last_token_of_first_sequence", last[0]}};
    out["throughput_1000_1000_c256_tok_s"] = 256.0 * kOut / total;
    // The bound for this run's KV dtype and linear-layer rate (bf16: the measured bf16 GEMM rate;
    // FP8 weights: twice it, the tensor cores' FP8 rate).
    const double roofline_s =
        ServingRooflineSeconds(c, static_cast<double>(weight_bytes), KvBytesPerToken(c, kv_fp8),
                               limits.bf16_tflops * (o.fp8 ? 2 : 1), limits, 256, kIn, kOut);
    out["throughput_1000_1000_c256_roofline_tok_s"] = 256.0 * kOut / roofline_s;
    out["throughput_1000_1000_c256_roofline_fraction"] = roofline_s / total;
    std::printf(
        "1000/1000 at 256: %.1f s (prefill %.1f s), %.0f output tok/s; roofline %.0f tok/s\n",
        total, Seconds(start, prefilled), 256.0 * kOut / total, 256.0 * kOut / roofline_s);
  }
  out["graphs_captured"] = static_cast<int64_t>(r.graphs_captured());
  return out;
}

}  // namespace dinfer::bench
