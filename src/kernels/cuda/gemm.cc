#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <utility>

namespace dinfer::kernels::cuda {
namespace {

Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return Internal("cuBLASLt {}: status {}", what, static_cast<int>(s));
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    default:
      return CUDA_R_16BF;
  }
}

}  // namespace

// Descriptors and the algorithm for one shape; the column-major view cuBLASLt sees is
// yᵀ[n, m] = op_T(w as [k, n]) · xᵀ[k, m].
struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
  }
};

StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(size_t workspace_bytes) {
  std::unique_ptr<GemmRunner> r(new GemmRunner());
  cublasLtHandle_t h = nullptr;
  DINFER_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&h), "create"));
  r->handle_ = h;
  if (cudaMalloc(&r->workspace_, workspace_bytes) != cudaSuccess) {
    cudaGetLastError();
    return Internal("cuBLASLt workspace of {} bytes", workspace_bytes);
  }
  r->workspace_bytes_ = workspace_bytes;
  const float one = 1.0f;
  if (cudaMalloc(&r->unit_scale_, sizeof(float)) != cudaSuccess ||
      cudaMemcpy(r->unit_scale_, &one, sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    return Internal("cuBLASLt unit scale");
  }
  return r;
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (unit_scale_ != nullptr) cudaFree(unit_scale_);
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

StatusOr<const GemmRunner::Plan*> GemmRunner::PlanFor(const GemmParams& p) {
  const bool fp8 = p.in_dtype == DType::kF8E4M3;
  const Key key{p.m,
                p.n,
                p.k,
                p.ldx,
                p.ldw,
                p.ldy,
                static_cast<int>(p.in_dtype),
                static_cast<int>(p.out_dtype)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                              sizeof(trans_a)),
               "transa"));
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                              sizeof(trans_b)),
               "transb"));
  if (fp8) {
    // One f32 scale per operand: kChannel's vectors are applied after the product (ScaleOuter).
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, b_mode = a_mode;
    DINFER_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                &a_mode, sizeof(a_mode)),
                 "a scale mode"));
    DINFER_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                &b_mode, sizeof(b_mode)),
                 "b scale mode"));
  }
  const cudaDataType_t in = CudaType(p.in_dtype), out = CudaType(p.out_dtype);
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->a, in, static_cast<uint64_t>(p.k),
                                          static_cast<uint64_t>(p.n), p.ldw),
               "layout a"));
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->b, in, static_cast<uint64_t>(p.k),
                                          static_cast<uint64_t>(p.m), p.ldx),
               "layout b"));
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&plan->c, out, static_cast<uint64_t>(p.n),
                                          static_cast<uint64_t>(p.m), p.ldy),
               "layout c"));
  cublasLtMatmulPreference_t pref = nullptr;
  DINFER_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  const uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a,
                                     plan->b, plan->c, plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  DINFER_RETURN_IF_ERROR(LtStatus(s, "heuristic"));
  if (found == 0) {
    return Unimplemented("cuBLASLt has no algorithm for [{}, {}] x [{}, {}]ᵀ ({} -> {})", p.m, p.k,
                         p.n, p.k, DTypeName(p.in_dtype), DTypeName(p.out_dtype));
  }
  plan->algo = result.algo;
  const Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

Status GemmRunner::Run(const GemmParams& p, void* stream, GemmImpl impl) {
  if (p.m == 0 || p.n == 0) return OkStatus();
  if ((p.in_dtype != DType::kF32 && p.in_dtype != DType::kBF16) ||
      (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16)) {
    return Unimplemented("GEMM of {} -> {}", DTypeName(p.in_dtype), DTypeName(p.out_dtype));
  }
  if (p.group_n > 0 && p.n % p.group_n != 0) {
    return InvalidArgument("grouped GEMM: n {} is not a multiple of group_n {}", p.n, p.group_n);
  }
  // The staged GEMV takes grouped products too (all groups in one launch).
  if (impl == GemmImpl::kAuto && p.m <= kGemvFusedMaxRows) {
    GemvFusedParams staged;
    staged.gemm = p;
    if (GemvFusedSupports(staged)) {
      const int e = GemvFused(staged, stream);
      if (e != 0) {
        return Internal("GEMV launch: {}", cudaGetErrorString(static_cast<cudaError_t>(e)));
      }
      return OkStatus();
    }
  }
  if (p.group_n > 0) {  // one product per group
    const int64_t in_bytes = p.in_dtype == DType::kF32 ? 4 : 2;
    const int64_t out_bytes = p.out_dtype == DType::kF32 ? 4 : 2;
    for (int64_t g = 0; g < p.n / p.group_n; ++g) {
      GemmParams one = p;
      one.group_n = 0;
      one.n = p.group_n;
      one.x = static_cast<const char*>(p.x) + g * p.k * in_bytes;
      one.w = static_cast<const char*>(p.w) + g * p.group_n * p.ldw * in_bytes;
      one.y = static_cast<char*>(p.y) + g * p.group_n * out_bytes;
      DINFER_RETURN_IF_ERROR(Run(one, stream, impl));
    }
    return OkStatus();
  }
  const bool gemv = impl == GemmImpl::kGemv ||
                    (impl == GemmImpl::kAuto && p.m <= kGemvAutoMaxRows && GemvSupports(p));
  if (gemv) {
    if (!GemvSupports(p)) return InvalidArgument("GEMV does not take m={} k={}", p.m, p.k);
    const int e = Gemv(p, stream);
    if (e != 0) return Internal("GEMV launch: {}", cudaGetErrorString(static_cast<cudaError_t>(e)));
    return OkStatus();
  }
  DINFER_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(p));
  const float alpha = 1.0f, beta = 0.0f;
  return LtStatus(
      cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->desc, &alpha, p.w, plan->a, p.x,
                     plan->b, &beta, p.y, plan->c, p.y, plan->c, &plan->algo, workspace_,
                     workspace_bytes_, static_cast<cudaStream_t>(stream)),
      "matmul");
}

Status GemmRunner::RunFp8(const Fp8GemmParams& p, void* stream) {
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16) {
    return Unimplemented("FP8 GEMM to {}", DTypeName(p.out_dtype));
  }
  if (p.ldx % 16 != 0 || p.ldw % 16 != 0 || p.k % 16 != 0 ||
      (p.scaling == Fp8Scaling::kBlock128 && p.k % 128 != 0)) {
    return InvalidArgument(
        "FP8 GEMM needs k and the row strides in multiples of 16 (k of 128 "
        "with block scales): k={} ldx={} ldw={}",
        p.k, p.ldx, p.ldw);
  }
  if (p.x_scale == nullptr || p.w_scale == nullptr) {
    return InvalidArgument("FP8 GEMM without scales");
  }
  if (p.scaling == Fp8Scaling::kBlock128) {
    // cuBLASLt 13.0 has no algorithm for block scales on the H200 (gemm.h): ours runs them.
    if (!Fp8BlockGemmSupports(p)) {
      return InvalidArgument("FP8 GEMM with block scales needs 16-byte aligned x and w");
    }
    const int e = Fp8BlockGemm(p, stream);
    if (e != 0) {
      return Internal("FP8 block GEMM: {}", cudaGetErrorString(static_cast<cudaError_t>(e)));
    }
    return OkStatus();
  }
  GemmParams g;
  g.x = p.x;
  g.w = p.w;
  g.y = p.y;
  g.ldx = p.ldx;
  g.ldw = p.ldw;
  g.ldy = p.ldy;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.in_dtype = DType::kF8E4M3;
  g.out_dtype = p.out_dtype;
  const bool after = p.scaling == Fp8Scaling::kChannel;
  DINFER_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(g));
  // The scale pointers change from call to call; the descriptor only carries them.
  const float* a_scale = after ? unit_scale_ : p.w_scale;
  const float* b_scale = after ? unit_scale_ : p.x_scale;
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &a_scale, sizeof(a_scale)),
               "a scale"));
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &b_scale, sizeof(b_scale)),
               "b scale"));
  const float alpha = 1.0f, beta = 0.0f;
  DINFER_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->desc, &alpha, p.w,
                              plan->a, p.x, plan->b, &beta, p.y, plan->c, p.y, plan->c, &plan->algo,
                              workspace_, workspace_bytes_, static_cast<cudaStream_t>(stream)),
               "fp8 matmul"));
  if (!after) return OkStatus();
  const int e = ScaleOuter(p.y, p.ldy, p.m, p.n, p.out_dtype, p.x_scale, p.w_scale, stream);
  if (e != 0) return Internal("FP8 scales: {}", cudaGetErrorString(static_cast<cudaError_t>(e)));
  return OkStatus();
}

}  // namespace dinfer::kernels::cuda
