// cuBLASLt's algorithms for the decode-step products of an 8B Llama at a few batch sizes: the
// heuristic's candidates in its order, each timed (weights rotated among copies larger than the
// L2 cache), and split-K variants of the best ones. Shows how far the heuristic's first choice,
// which GemmRunner takes, is from the best configuration cuBLASLt has for each shape.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/gpu/bench_common.h"

namespace dinfer::bench {
namespace {

namespace json = boost::json;

Status Lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return Internal("cuBLASLt {}: status {}", what, static_cast<int>(s));
}

template <typename T>
T Attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t a) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof(v), &written);
  return v;
}

}  // namespace

StatusOr<json::object> GemmAlgoBench(const cuda::Stream& s, const Limits& limits) {
  cublasLtHandle_t h = nullptr;
  DINFER_RETURN_IF_ERROR(Lt(cublasLtCreate(&h), "create"));
  const size_t ws_bytes = 32u << 20;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer ws, cuda::DeviceBuffer::Allocate(ws_bytes));
  const int64_t max_m = 256, max_k = 14336;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, RandomBuffer(max_m * max_k, DType::kBF16, 40));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer y, cuda::DeviceBuffer::Allocate(max_m * 128256 * 4));
  json::array rows;
  for (const ProductShape& sh : kLlama8bProducts) {
    const int64_t w_bytes = sh.n * sh.k * 2;
    const int64_t copies = std::max<int64_t>(1, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes);
    DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w,
                            RandomBuffer(copies * sh.n * sh.k, DType::kBF16, 41, 0.02f));
    const bool f32_out = sh.n == 128256;
    for (int64_t m : {int64_t{64}, int64_t{128}, int64_t{256}}) {
      cublasLtMatmulDesc_t desc = nullptr;
      cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
      DINFER_RETURN_IF_ERROR(
          Lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "d"));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
      cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.k, sh.n, sh.k);
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.k, m, sh.k);
      cublasLtMatrixLayoutCreate(&lc, f32_out ? CUDA_R_32F : CUDA_R_16BF, sh.n, m, sh.n);
      cublasLtMatmulPreference_t pref = nullptr;
      cublasLtMatmulPreferenceCreate(&pref);
      const uint64_t wsb = ws_bytes;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                           sizeof(wsb));
      constexpr int kMax = 16;
      cublasLtMatmulHeuristicResult_t res[kMax] = {};
      int found = 0;
      cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, kMax, res, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      const float alpha = 1.0f, beta = 0.0f;
      auto time = [&](const cublasLtMatmulAlgo_t& algo) -> double {
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(h, desc, la, lb, lc, lc, &algo, &check) !=
                CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > ws_bytes) {
          return -1.0;
        }
        int64_t i = 0;
        auto ms = TimeMs(s, 3, 30, [&] {
          const void* wp = static_cast<const char*>(w.data()) + (i++ % copies) * w_bytes;
          return Lt(cublasLtMatmul(h, desc, &alpha, wp, la, x.data(), lb, &beta, y.data(), lc,
                                   y.data(), lc, &algo, ws.data(), ws_bytes, s.get()),
                    "matmul");
        });
        if (!ms.ok()) {
          cudaGetLastError();
          return -1.0;
        }
        return *ms;
      };
      struct Timed {
        int index, tile, stages, splitk;
        double ms;
      };
      std::vector<Timed> timed;
      for (int i = 0; i < found; ++i) {
        const double ms = time(res[i].algo);
        timed.push_back(
            {i, static_cast<int>(Attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID)),
             static_cast<int>(Attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)),
             static_cast<int>(Attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)), ms});
      }
      // Split-K variants of the three fastest.
      std::vector<Timed> sorted;
      for (const Timed& t : timed) {
        if (t.ms > 0) sorted.push_back(t);
      }
      std::sort(sorted.begin(), sorted.end(),
                [](const Timed& a, const Timed& b) { return a.ms < b.ms; });
      std::vector<Timed> split;
      for (size_t r = 0; r < std::min<size_t>(3, sorted.size()); ++r) {
        for (uint32_t sk : {2u, 3u, 4u, 6u, 8u}) {
          cublasLtMatmulAlgo_t a = res[sorted[r].index].algo;
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                               sizeof(sk));
          for (uint32_t scheme : {static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE),
                                  static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                                  static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                 sizeof(scheme));
            const double ms = time(a);
            if (ms > 0) {
              split.push_back({sorted[r].index * 1000 + static_cast<int>(scheme), sorted[r].tile,
                               sorted[r].stages, static_cast<int>(sk), ms});
            }
          }
        }
      }
      std::sort(split.begin(), split.end(),
                [](const Timed& a, const Timed& b) { return a.ms < b.ms; });
      const double flops = 2.0 * m * sh.n * sh.k;
      json::array cands;
      std::printf("%s m=%ld: %d candidates\n", sh.name, static_cast<long>(m), found);
      for (const Timed& t : timed) {
        std::printf("  #%-2d tile %3d stages %3d splitk %d  %8.4f ms  %6.1f TFLOP/s\n", t.index,
                    t.tile, t.stages, t.splitk, t.ms, t.ms > 0 ? flops / t.ms / 1e9 : 0.0);
        cands.push_back(json::object{{"index", t.index},
                                     {"tile_id", t.tile},
                                     {"stages_id", t.stages},
                                     {"splitk", t.splitk},
                                     {"ms", t.ms}});
      }
      json::array splits;
      for (size_t i = 0; i < std::min<size_t>(5, split.size()); ++i) {
        const Timed& t = split[i];
        std::printf("  split: candidate #%d scheme %d splitk %d  %8.4f ms  %6.1f TFLOP/s\n",
                    t.index / 1000, t.index % 1000, t.splitk, t.ms, flops / t.ms / 1e9);
        splits.push_back(json::object{{"candidate", t.index / 1000},
                                      {"reduction_scheme", t.index % 1000},
                                      {"splitk", t.splitk},
                                      {"ms", t.ms}});
      }
      const double first = timed.empty() ? 0.0 : timed[0].ms;
      const double best =
          std::min(sorted.empty() ? first : sorted[0].ms, split.empty() ? first : split[0].ms);
      std::printf("  heuristic's first %.4f ms, best %.4f ms (%.2fx); GEMM peak %.0f TFLOP/s\n",
                  first, best, first / best, limits.bf16_tflops);
      rows.push_back(json::object{{"name", std::string(sh.name) + " m=" + std::to_string(m)},
                                  {"candidates", std::move(cands)},
                                  {"split_k_best", std::move(splits)},
                                  {"first_ms", first},
                                  {"best_ms", best}});
      cublasLtMatmulDescDestroy(desc);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
    }
  }
  cublasLtDestroy(h);
  return json::object{{"rows", std::move(rows)}};
}

}  // namespace dinfer::bench
