// Shared pieces of the GPU benchmark driver: event timing (medians), the device limits measured
// in the same run, random device buffers, and JSON output.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "backend/cuda/device.h"
#include "backend/cuda/memory.h"
#include "backend/cuda/stream.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"

namespace dinfer::bench {

int LaunchRead(const void* data, int64_t bytes, unsigned* sink, int multiprocessors, void* stream);

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median milliseconds of `reps` runs of f (which enqueues work on `stream`), after `warmup` runs;
// each run is timed with events around it.
template <typename F>
StatusOr<double> TimeMs(const cuda::Stream& stream, int warmup, int reps, F&& f) {
  for (int i = 0; i < warmup; ++i) DINFER_RETURN_IF_ERROR(f());
  DINFER_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create(true));
  DINFER_ASSIGN_OR_RETURN(cuda::Event end, cuda::Event::Create(true));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    DINFER_RETURN_IF_ERROR(start.Record(stream));
    DINFER_RETURN_IF_ERROR(f());
    DINFER_RETURN_IF_ERROR(end.Record(stream));
    DINFER_RETURN_IF_ERROR(end.Synchronize());
    DINFER_ASSIGN_OR_RETURN(float t, cuda::Event::ElapsedMs(start, end));
    ms.push_back(t);
  }
  return Median(ms);
}

inline StatusOr<cuda::DeviceBuffer> RandomBuffer(int64_t n, DType dtype, uint64_t seed,
                                                 float scale = 1.0f) {
  DINFER_ASSIGN_OR_RETURN(
      cuda::DeviceBuffer b,
      cuda::DeviceBuffer::Allocate(static_cast<size_t>(n) * (dtype == DType::kF32 ? 4 : 2)));
  DINFER_RETURN_IF_ERROR(cuda::CudaStatus(
      kernels::cuda::FillRandom(b.data(), dtype, n, seed, scale, nullptr), "random fill"));
  return b;
}

struct Limits {
  double read_gbs = 0, copy_gbs = 0, bf16_tflops = 0;
  boost::json::object ToJson() const {
    return {
        {"hbm_read_gbs", read_gbs}, {"d2d_copy_gbs", copy_gbs}, {"bf16_gemm_tflops", bf16_tflops}};
  }
};

// HBM read bandwidth (a reduction over 4 GiB), copy bandwidth (read + write counted) and the
// bf16 matrix rate of cuBLASLt on 8192³, all on random data.
StatusOr<Limits> MeasureLimits(const cuda::Stream& stream, int multiprocessors);

// The kernel speed table (bench mode "kernels") and the model benchmarks (mode "model").
// only: run the sections whose name ("gemm", "fp8 gemm", "attention", "elementwise") contains
// it.
StatusOr<boost::json::object> KernelBench(const cuda::Stream& stream, const Limits& limits,
                                          int multiprocessors, const std::string& only);
// The weight products of an 8B Llama (hidden 4096, 32 query / 8 KV heads of 128, MLP 14336,
// vocabulary 128256): y[m, n] = x[m, k] · w[n, k]ᵀ.
struct ProductShape {
  const char* name;
  int64_t n, k;
};
inline constexpr ProductShape kLlama8bProducts[] = {{"qkv", 4096 + 2 * 8 * 128, 4096},
                                                    {"o", 4096, 4096},
                                                    {"gate_up", 2 * 14336, 4096},
                                                    {"down", 4096, 14336},
                                                    {"lm_head", 128256, 4096}};
// cuBLASLt's candidate algorithms and split-K variants for decode-step products (gemm_algos.cc).
StatusOr<boost::json::object> GemmAlgoBench(const cuda::Stream& stream, const Limits& limits);
struct ModelBenchOptions {
  std::string config_path;
  bool throughput = true;        // the 1,000 / 1,000 at 256 concurrent run (the longest part)
  bool decode_only = false;      // 16 batch-1 decode steps and nothing else (for a profiler)
  bool throughput_only = false;  // the 1,000 / 1,000 run alone (A/B runs of the batched path)
  // The prompt steps alone: 8 × 2,048 tokens, then 16 × 1,000 (a prompt step of the 1,000 / 1,000
  // run), each once to warm up and 5 times timed (for A/B runs and a profiler).
  bool prefill_only = false;
  // FP8: layer weights as e4m3 with per-channel scales (FP8 GEMMs) and an FP8 KV cache.
  bool fp8 = false;
  bool kv_fp8 = false;  // an FP8 KV cache with bf16 weights (the KV read halves, nothing else)
  // Each sequence's KV blocks dealt out from the pool in a random order instead of one
  // consecutive run a sequence (the decode attention reads the two layouts at different rates).
  bool shuffle_blocks = false;
  // Where the kernel timelines of a batch-1 decode step (this path) and of a step of 256
  // sequences (the path with "_b256" before ".csv") go; needs a DINFER_KERNEL_TRACE build.
  std::string trace_path;
};
StatusOr<boost::json::object> ModelBench(const ModelBenchOptions& options, const Limits& limits);
// DeepSeek-V4 (mode "v4"): the first `layers` layers of CONFIG at full width.
struct V4BenchOptions {
  std::string config_path;
  int64_t layers = 8;
  bool decode_only = false;  // 16 batch-1 decode steps of the `layers` model (for a profiler)
};
StatusOr<boost::json::object> V4Bench(const V4BenchOptions& options, const Limits& limits);
// Mode "v4-check": the checkpoint bench/gpu/v4_full_width.py wrote into DIR, on the GPU, against
// transformers' float32 logits there; "pass" says whether the median row is within 8 * 2^-8 of
// them and at most twice as far as transformers' own bf16 run.
StatusOr<boost::json::object> V4Check(const std::string& dir);

}  // namespace dinfer::bench
