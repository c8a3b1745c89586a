// CUTLASS's Hopper GEMMs beside cuBLASLt (GemmRunner, which the runner uses) on the bf16 products
// of an 8B Llama, in one run: y[m, n] = x[m, k] · w[n, k]ᵀ for the q/k/v, o, gate/up and down
// weights at m = 64, 128 and 256 rows (the decode steps of a batch that size) and 16,384 (prefill).
// Standalone: scripts/fetch-cutlass puts CUTLASS 4.2's headers in third_party/cutlass and the CMake
// target dinfer_cutlass_bench exists only where they are (scripts/gpu stage "cutlass").
//
// CUTLASS computes the transposed product, yᵀ[n, m] = w · xᵀ, so that the weights' rows are the
// tiles' M (128 or 64 a tile) and the tokens their N: TMA loads, warp-specialized wgmma kernels
// (persistent; one with stream-K), the epilogue storing yᵀ column-major, which is y row-major.
// Configurations (one translation unit each, DINFER_CUTLASS_PART 1-4, so that a parallel build
// compiles them at once; 0 is the driver):
//   1 coop-128x128     tile 128 x 128 x 64, cooperative (two consumer warpgroups), persistent
//   2 pingpong-64x128  tile 64 x 128 x 64, ping-pong (consumer warpgroups alternate), persistent
//   3 pingpong-128x64  tile 128 x 64 x 64, ping-pong, persistent
//   4 coop-128x256     tile 128 x 256 x 64, cooperative, persistent
// (Stream-K is left out: its workspace holds tile counters that each launch would have to reset.)
// Timing: CUDA events around 30 launches after 3 of warm-up, the weights rotated among copies that
// together exceed the L2 cache (each configuration initialised once a copy, so that a launch does
// no host-side set-up). Each output is compared with cuBLASLt's (largest difference over the
// largest magnitude). Figures: ms and TFLOP/s against the measured bf16 rate of cuBLASLt on an
// 8192³ product.
// Usage: dinfer_cutlass_bench [OUT.json]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>

namespace dinfer::bench::cutlass_parts {

// One configuration ready for one problem: Run(c, s) computes with weight copy c.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual cudaError_t Run(int copy, cudaStream_t stream) = 0;
};

// nullptr when the configuration cannot run the problem. y[m, n] row-major; x [m, k] and each
// w[i] [n, k] row-major, all bf16.
using MakeFn = std::unique_ptr<Runner> (*)(const void* x, const void* const* w, int copies, void* y,
                                           int m, int n, int k);

}  // namespace dinfer::bench::cutlass_parts

#if DINFER_CUTLASS_PART != 0
// ---- One CUTLASS configuration. ----
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <vector>

namespace dinfer::bench::cutlass_parts {
namespace {

using namespace cute;

template <class TileShape, class KernelSchedule, class EpilogueSchedule, class Scheduler>
struct Config {
  using ElementIn = cutlass::bfloat16_t;
  using ElementOut = cutlass::bfloat16_t;
  static constexpr int kAlign = 8;  // 16 bytes
  using ClusterShape = Shape<_1, _1, _1>;
  // A = w [n, k] (row-major: k contiguous), B = xᵀ [k, m] (column-major: k contiguous), D = yᵀ
  // [n, m] column-major (y row-major); no C.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::ColumnMajor, kAlign, ElementOut, cutlass::layout::ColumnMajor, kAlign,
      EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementIn, cutlass::layout::RowMajor,
      kAlign, ElementIn, cutlass::layout::ColumnMajor, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Cfg>
class RunnerImpl : public Runner {
 public:
  using Gemm = typename Cfg::Gemm;
  ~RunnerImpl() override {
    if (workspace_ != nullptr) cudaFree(workspace_);
  }
  bool Init(const void* x, const void* const* w, int copies, void* y, int m, int n, int k) {
    using Kernel = typename Gemm::GemmKernel;
    const auto stride_a =
        cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(n, k, 1));
    const auto stride_b =
        cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(m, k, 1));
    const auto stride_d =
        cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(n, m, 1));
    const auto stride_c =
        cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, make_shape(n, m, 1));
    gemms_.resize(copies);
    std::vector<typename Gemm::Arguments> args(copies);
    size_t ws = 0;
    for (int c = 0; c < copies; ++c) {
      typename Gemm::Arguments a{
          cutlass::gemm::GemmUniversalMode::kGemm,
          {n, m, k, 1},
          {static_cast<const cutlass::bfloat16_t*>(w[c]), stride_a,
           static_cast<const cutlass::bfloat16_t*>(x), stride_b},
          {{1.0f, 0.0f}, nullptr, stride_c, static_cast<cutlass::bfloat16_t*>(y), stride_d}};
      if (gemms_[c].can_implement(a) != cutlass::Status::kSuccess) return false;
      ws = std::max(ws, Gemm::get_workspace_size(a));
      args[c] = a;
    }
    if (ws > 0 && cudaMalloc(&workspace_, ws) != cudaSuccess) return false;
    for (int c = 0; c < copies; ++c) {
      if (gemms_[c].initialize(args[c], workspace_) != cutlass::Status::kSuccess) return false;
    }
    return true;
  }
  cudaError_t Run(int copy, cudaStream_t stream) override {
    const cutlass::Status s = gemms_[copy].run(stream);
    if (s != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    return cudaGetLastError();
  }

 private:
  std::vector<Gemm> gemms_;
  void* workspace_ = nullptr;
};

#if DINFER_CUTLASS_PART == 1
using Chosen =
    Config<Shape<_128, _128, _64>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
           cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::PersistentScheduler>;
#elif DINFER_CUTLASS_PART == 2
using Chosen = Config<Shape<_64, _128, _64>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                      cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::PersistentScheduler>;
#elif DINFER_CUTLASS_PART == 3
using Chosen = Config<Shape<_128, _64, _64>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                      cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::PersistentScheduler>;
#else
using Chosen =
    Config<Shape<_128, _256, _64>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
           cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::gemm::PersistentScheduler>;
#endif

}  // namespace

#define DINFER_CUTLASS_CAT2(a, b) a##b
#define DINFER_CUTLASS_CAT(a, b) DINFER_CUTLASS_CAT2(a, b)
std::unique_ptr<Runner> DINFER_CUTLASS_CAT(Make, DINFER_CUTLASS_PART)(const void* x,
                                                                      const void* const* w,
                                                                      int copies, void* y, int m,
                                                                      int n, int k) {
  auto r = std::make_unique<RunnerImpl<Chosen>>();
  if (!r->Init(x, w, copies, y, m, n, k)) return nullptr;
  return r;
}

}  // namespace dinfer::bench::cutlass_parts

#else
// ---- The driver. ----
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/gemm.h"

namespace dinfer::bench::cutlass_parts {
std::unique_ptr<Runner> Make1(const void*, const void* const*, int, void*, int, int, int);
std::unique_ptr<Runner> Make2(const void*, const void* const*, int, void*, int, int, int);
std::unique_ptr<Runner> Make3(const void*, const void* const*, int, void*, int, int, int);
std::unique_ptr<Runner> Make4(const void*, const void* const*, int, void*, int, int, int);
}  // namespace dinfer::bench::cutlass_parts

namespace {

namespace cp = dinfer::bench::cutlass_parts;
namespace kc = dinfer::kernels::cuda;

#define CHECK_CUDA(e)                                                                    \
  do {                                                                                   \
    const cudaError_t err_ = (e);                                                        \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void FillKernel(__nv_bfloat16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffffff) / 8388608.0f - 1.0f) * scale);
  }
}

void* Random(int64_t n, uint32_t seed, float scale) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * 2));
  FillKernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale);
  CHECK_CUDA(cudaGetLastError());
  return p;
}

template <typename F>
double TimeMs(cudaStream_t s, int copies, F&& launch) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  int c = 0;
  for (int i = 0; i < 3; ++i) CHECK_CUDA(launch(c++ % copies));
  CHECK_CUDA(cudaEventRecord(a, s));
  constexpr int kReps = 30;
  for (int i = 0; i < kReps; ++i) CHECK_CUDA(launch(c++ % copies));
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / kReps;
}

// out[0] = max |a - b|, out[1] = max |b| over n bf16 values (non-negative floats order as their
// bits, so atomicMax on the bits is a float max).
__global__ void DiffKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n,
                           unsigned* out) {
  float diff = 0.0f, mag = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    diff = fmaxf(diff, fabsf(x - y));
    mag = fmaxf(mag, fabsf(y));
  }
  atomicMax(&out[0], __float_as_uint(diff));
  atomicMax(&out[1], __float_as_uint(mag));
}

// Largest |a - b| over the largest |b|, of n bf16 values.
double RelDiff(const void* a, const void* b, int64_t n) {
  unsigned* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, 8));
  CHECK_CUDA(cudaMemset(d, 0, 8));
  DiffKernel<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(a),
                            static_cast<const __nv_bfloat16*>(b), n, d);
  unsigned h[2];
  CHECK_CUDA(cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d));
  float diff, mag;
  std::memcpy(&diff, &h[0], 4);
  std::memcpy(&mag, &h[1], 4);
  return mag > 0 ? diff / mag : diff;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it is measured
  const char* out_path = argc > 1 ? argv[1] : nullptr;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  auto gemm = kc::GemmRunner::Create();
  if (!gemm.ok()) {
    std::fprintf(stderr, "GemmRunner: %s\n", gemm.status().ToString().c_str());
    return 1;
  }
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {
      {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  const struct {
    const char* name;
    cp::MakeFn make;
  } configs[] = {{"coop-128x128", cp::Make1},
                 {"pingpong-64x128", cp::Make2},
                 {"pingpong-128x64", cp::Make3},
                 {"coop-128x256", cp::Make4}};
  const int64_t max_m = 16384, max_k = 14336, max_n = 28672;
  void* x = Random(max_m * max_k, 1, 1.0f);
  void *y_ref = nullptr, *y = nullptr;
  CHECK_CUDA(cudaMalloc(&y_ref, max_m * max_n * 2));
  CHECK_CUDA(cudaMalloc(&y, max_m * max_n * 2));

  // The bf16 rate on an 8192³ product through cuBLASLt, as dinfer_gpu_bench measures it.
  double peak = 0;
  {
    const int64_t d = 8192;
    void* a = Random(d * d, 2, 1.0f);
    void* b = Random(d * d, 3, 1.0f);
    kc::GemmParams p;
    p.x = a;
    p.w = b;
    p.y = y;
    p.m = p.n = p.k = d;
    p.ldx = p.ldw = p.ldy = d;
    const double ms = TimeMs(s, 1, [&](int) {
      return (*gemm)->Run(p, s, kc::GemmImpl::kCublasLt).ok() ? cudaSuccess : cudaErrorUnknown;
    });
    peak = 2.0 * d * d * d / ms / 1e9;
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
  }
  std::printf("bf16 GEMM 8192^3 (cuBLASLt): %.0f TFLOP/s\n", peak);

  std::string json = "{\"bf16_gemm_tflops\": " + std::to_string(peak) + ", \"rows\": [";
  bool first_row = true;
  for (const Shape& sh : shapes) {
    const int64_t w_bytes = int64_t{sh.n} * sh.k * 2;
    const int copies =
        static_cast<int>(std::max<int64_t>(1, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes));
    std::vector<void*> w(copies);
    for (int c = 0; c < copies; ++c) w[c] = Random(int64_t{sh.n} * sh.k, 10 + c, 0.02f);
    for (int m : {64, 128, 256, 16384}) {
      const double flops = 2.0 * m * sh.n * sh.k;
      kc::GemmParams p;
      p.x = x;
      p.y = y_ref;
      p.m = m;
      p.n = sh.n;
      p.k = sh.k;
      p.ldx = p.ldw = sh.k;
      p.ldy = sh.n;
      const double ref_ms = TimeMs(s, copies, [&](int c) {
        p.w = w[c];
        return (*gemm)->Run(p, s, kc::GemmImpl::kCublasLt).ok() ? cudaSuccess : cudaErrorUnknown;
      });
      p.w = w[0];
      if (!(*gemm)->Run(p, s, kc::GemmImpl::kCublasLt).ok()) return 1;
      CHECK_CUDA(cudaStreamSynchronize(s));
      std::printf("%-8s m=%-5d cublaslt          %8.4f ms %6.1f TFLOP/s (%.3f)\n", sh.name, m,
                  ref_ms, flops / ref_ms / 1e9, flops / ref_ms / 1e9 / peak);
      std::string row = std::string(first_row ? "" : ",") + "\n {\"shape\": \"" + sh.name +
                        "\", \"m\": " + std::to_string(m) + ", \"n\": " + std::to_string(sh.n) +
                        ", \"k\": " + std::to_string(sh.k) +
                        ", \"cublaslt_ms\": " + std::to_string(ref_ms) + ", \"cutlass\": {";
      first_row = false;
      bool first_cfg = true;
      for (const auto& cfg : configs) {
        auto r = cfg.make(x, w.data(), copies, y, m, sh.n, sh.k);
        if (r == nullptr) {
          std::printf("%-8s m=%-5d %-17s cannot run it\n", sh.name, m, cfg.name);
          continue;
        }
        const double ms = TimeMs(s, copies, [&](int c) { return r->Run(c, s); });
        CHECK_CUDA(r->Run(0, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        const double err = RelDiff(y, y_ref, int64_t{m} * sh.n);
        std::printf("%-8s m=%-5d %-17s %8.4f ms %6.1f TFLOP/s (%.3f)  %.2fx cuBLASLt, diff %.1e\n",
                    sh.name, m, cfg.name, ms, flops / ms / 1e9, flops / ms / 1e9 / peak,
                    ref_ms / ms, err);
        row += std::string(first_cfg ? "" : ", ") + "\"" + cfg.name +
               "\": {\"ms\": " + std::to_string(ms) +
               ", \"rel_diff_vs_cublaslt\": " + std::to_string(err) + "}";
        first_cfg = false;
      }
      row += "}}";
      json += row;
    }
    for (void* p : w) CHECK_CUDA(cudaFree(p));
  }
  json += "\n]}\n";
  if (out_path != nullptr) {
    FILE* f = std::fopen(out_path, "w");
    if (f == nullptr) return 1;
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
#endif
