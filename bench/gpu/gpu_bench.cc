// dinfer_gpu_bench: GPU benchmarks for scripts/gpu. Modes:
//   dinfer_gpu_bench kernels OUT.json [SECTION] device limits and each kernel's speed (SECTION:
//                                              gemm, attention or elementwise only)
//   dinfer_gpu_bench model CONFIG OUT.json [--no-throughput | --decode-only | --throughput-only
//                                              | --prefill-only] [--fp8 | --kv-fp8]
//                                              [--trace CSV] [--shuffle-blocks]
//                                              a random-weight model of CONFIG's shape: batch-1
//                                              decode, prefill, idle gaps, 1,000/1,000 at 256
//   dinfer_gpu_bench gemm-algos OUT.json          cuBLASLt's candidate algorithms (and split-K
//                                              variants) for the decode-step products of an 8B
//                                              Llama at 64-256 rows, each timed
//   dinfer_gpu_bench v4 CONFIG OUT.json [--layers N] [--decode-only]
//                                              DeepSeek-V4 at CONFIG's widths, its first N layers
//                                              (default 8): decode at batch 1/16/64, prefill,
//                                              per-layer times extrapolated to the full model
//   dinfer_gpu_bench v4-check DIR OUT.json    the full-width V4 checkpoint
//   bench/gpu/v4_full_width.py
//                                              wrote into DIR against transformers' logits there
// Every figure is a median of event-timed runs on random data; limits are measured in the run.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "bench/gpu/bench_common.h"
#include "kernels/cuda/gemm.h"

namespace dinfer::bench {

StatusOr<Limits> MeasureLimits(const cuda::Stream& stream, int multiprocessors) {
  Limits l;
  const int64_t bytes = int64_t{4} << 30;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer a, RandomBuffer(bytes / 2, DType::kBF16, 1));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(bytes));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer sink, cuda::DeviceBuffer::Allocate(16));
  DINFER_ASSIGN_OR_RETURN(double read_ms, TimeMs(stream, 2, 10, [&] {
                            return cuda::CudaStatus(
                                LaunchRead(a.data(), bytes, static_cast<unsigned*>(sink.data()),
                                           multiprocessors, stream.get()),
                                "read");
                          }));
  l.read_gbs = bytes / read_ms / 1e6;
  DINFER_ASSIGN_OR_RETURN(double copy_ms, TimeMs(stream, 2, 10, [&] {
                            return cuda::CopyOnDeviceAsync(b.data(), a.data(), bytes, stream);
                          }));
  l.copy_gbs = 2.0 * bytes / copy_ms / 1e6;

  const int64_t n = 8192;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, RandomBuffer(n * n, DType::kBF16, 2));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w, RandomBuffer(n * n, DType::kBF16, 3));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer y, cuda::DeviceBuffer::Allocate(n * n * 2));
  DINFER_ASSIGN_OR_RETURN(auto gemm, kernels::cuda::GemmRunner::Create());
  kernels::cuda::GemmParams p;
  p.x = x.data();
  p.w = w.data();
  p.y = y.data();
  p.m = p.n = p.k = p.ldx = p.ldw = p.ldy = n;
  DINFER_ASSIGN_OR_RETURN(double gemm_ms,
                          TimeMs(stream, 3, 10, [&] { return gemm->Run(p, stream.get()); }));
  l.bf16_tflops = 2.0 * n * n * n / gemm_ms / 1e9;
  return l;
}

namespace {

Status WriteJson(const std::string& path, const boost::json::object& o) {
  std::ofstream f(path);
  f << boost::json::serialize(o) << "\n";
  if (!f) return IoError("cannot write '{}'", path);
  return OkStatus();
}

Status Main(int argc, char** argv) {
  if (argc < 3) {
    return InvalidArgument(
        "usage: dinfer_gpu_bench kernels OUT.json [SECTION] | model CONFIG OUT.json "
        "[--no-throughput | --decode-only | --throughput-only | --prefill-only] [--fp8 | --kv-fp8] "
        "[--trace CSV] "
        "[--shuffle-blocks] | gemm-algos OUT.json | "
        "v4 CONFIG OUT.json [--layers N] | v4-check DIR OUT.json");
  }
  if (cuda::DeviceCount() == 0) return MakeError(StatusCode::kFailedPrecondition, "no CUDA device");
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(0));
  DINFER_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  DINFER_ASSIGN_OR_RETURN(Limits limits, MeasureLimits(stream, info.multiprocessors));
  std::printf("limits: HBM read %.0f GB/s, copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n",
              limits.read_gbs, limits.copy_gbs, limits.bf16_tflops);
  boost::json::object out;
  out["device"] = info.name;
  out["multiprocessors"] = info.multiprocessors;
  out["memory_bytes"] = info.total_memory;
  out["limits"] = limits.ToJson();
  const std::string mode = argv[1];
  std::string path;
  if (mode == "kernels") {
    path = argv[2];
    DINFER_ASSIGN_OR_RETURN(
        out["kernels"], KernelBench(stream, limits, info.multiprocessors, argc > 3 ? argv[3] : ""));
  } else if (mode == "gemm-algos") {
    path = argv[2];
    DINFER_ASSIGN_OR_RETURN(out["gemm_algos"], GemmAlgoBench(stream, limits));
  } else if (mode == "model" && argc >= 4) {
    ModelBenchOptions o;
    o.config_path = argv[2];
    path = argv[3];
    for (int i = 4; i < argc; ++i) {
      if (std::strcmp(argv[i], "--no-throughput") == 0) o.throughput = false;
      if (std::strcmp(argv[i], "--decode-only") == 0) o.decode_only = true;
      if (std::strcmp(argv[i], "--throughput-only") == 0) o.throughput_only = true;
      if (std::strcmp(argv[i], "--prefill-only") == 0) o.prefill_only = true;
      if (std::strcmp(argv[i], "--fp8") == 0) o.fp8 = true;
      if (std::strcmp(argv[i], "--kv-fp8") == 0) o.kv_fp8 = true;
      if (std::strcmp(argv[i], "--trace") == 0 && i + 1 < argc) o.trace_path = argv[++i];
      if (std::strcmp(argv[i], "--shuffle-blocks") == 0) o.shuffle_blocks = true;
    }
    DINFER_ASSIGN_OR_RETURN(out["model"], ModelBench(o, limits));
  } else if (mode == "v4-check" && argc >= 4) {
    path = argv[3];
    DINFER_ASSIGN_OR_RETURN(out["v4_check"], V4Check(argv[2]));
  } else if (mode == "v4" && argc >= 4) {
    V4BenchOptions o;
    o.config_path = argv[2];
    path = argv[3];
    for (int i = 4; i < argc; ++i) {
      if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc) o.layers = std::atoi(argv[++i]);
      if (std::strcmp(argv[i], "--decode-only") == 0) o.decode_only = true;
    }
    if (o.layers < 3) return InvalidArgument("--layers: at least 3");
    DINFER_ASSIGN_OR_RETURN(out["v4"], V4Bench(o, limits));
  } else {
    return InvalidArgument("unknown mode '{}'", mode);
  }
  DINFER_RETURN_IF_ERROR(WriteJson(path, out));
  if (mode == "v4-check" && !out["v4_check"].as_object()["pass"].as_bool()) {
    return InvalidArgument("the full-width DeepSeek-V4 check failed (see {})", path);
  }
  return OkStatus();
}

}  // namespace
}  // namespace dinfer::bench

int main(int argc, char** argv) {
  const dinfer::Status s = dinfer::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "dinfer_gpu_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
