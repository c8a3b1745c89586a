// FlashInfer's paged decode attention beside ours (kernels/cuda AttentionRows) on the same GPU,
// the same KV cache and the same queries, in one run. Standalone: scripts/fetch-flashinfer puts
// FlashInfer's headers in third_party/flashinfer/include and the CMake target
// dinfer_flashinfer_bench exists only where they are (scripts/gpu stage "flashinfer").
//
// The cache is ours: pages of 16 tokens, K and V separately as [num_pages, 16, 8 * 128]
// (FlashInfer's NHD layout with separate k/v pointers), Llama-3.1-8B's heads (32 query, 8 KV,
// head_dim 128), the pages of all sequences in a shuffled order, one query token a sequence at the
// end of its context. Implementations (each timed with CUDA events around one call, after warm-up,
// the median of 20; and again as a CUDA graph of that one call, which takes the host's launch cost
// away):
//   dinfer          kc::AttentionRows with kc::ChooseAttentionSplits (as kernel_bench does)
//   fi-decode       FlashInfer's BatchDecodeWithPagedKVCacheDispatched (the CUDA-core decode,
//                   BatchDecodeWithPagedKVCacheWrapper without use_tensor_cores), planned by
//                   DecodePlan outside the timing; its split-KV merge kernel is inside the timing
//   fi-tc           FlashInfer's BatchPrefillWithPagedKVCacheDispatched (FA2 tensor-core template)
//                   planned by PrefillPlan with one query a sequence, which is what the wrapper
//                   runs with use_tensor_cores=True (backend "fa2")
// KV as bf16, and as e4m3 with bf16 queries (k_scale = v_scale = 1, so no scaling pass follows
// FlashInfer's kernel). Figures: milliseconds, GB/s of KV read (2 x seqs x ctx x 8 x 128 x bytes)
// and its fraction of the HBM read bandwidth measured here (bench/gpu/bandwidth.cu's streaming read
// over 4 GiB). Outputs: the relative L2 error of each FlashInfer output against ours, and the
// largest error of every implementation against a float64 reference on the host for the first
// and the last sequence (scaled by the reference's largest magnitude). FlashInfer keeps the
// partial outputs of split keys in bf16 (its tmp_v is the output type), so where its plan splits
// its error is about 1.5x that of an unsplit run.
// Usage: dinfer_flashinfer_bench [OUT.json]
//
// The FlashInfer parts compile as separate objects (DINFER_FI_PART 1-4: decode bf16, decode e4m3,
// tensor cores bf16, tensor cores e4m3; 0 the driver) so that a parallel build runs them at once;
// without DINFER_FI_PART everything is one translation unit.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef DINFER_FI_PART
#define DINFER_FI_ALL 1
#endif
#if defined(DINFER_FI_ALL) || DINFER_FI_PART != 0
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#endif
#if defined(DINFER_FI_ALL) || DINFER_FI_PART == 0
#include "kernels/cuda/attention.h"
#endif

namespace dinfer::bench {

int LaunchRead(const void* data, int64_t bytes, unsigned* sink, int multiprocessors, void* stream);

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 16;
[[maybe_unused]] constexpr int kKvDim = kKvHeads * kHeadDim;

}  // namespace

// What a FlashInfer runner needs: device pointers (the cache, the queries, its output, the page
// table in FlashInfer's CSR form) and the host copies of the index pointers its plan reads.
struct FiCase {
  int seqs = 0, ctx = 0;
  const void* q = nullptr;  // [seqs, 32, 128] bf16
  const void* k = nullptr;  // [pages, 16, 8 * 128] bf16 or e4m3
  const void* v = nullptr;
  void* out = nullptr;                 // [seqs, 32, 128] bf16
  const int32_t* indices = nullptr;    // [seqs * pages_per_seq]
  const int32_t* indptr = nullptr;     // [seqs + 1] pages
  const int32_t* last_len = nullptr;   // [seqs]
  const int32_t* qo_indptr = nullptr;  // [seqs + 1] = 0..seqs
  const int32_t* indptr_h = nullptr;   // host copies
  const int32_t* qo_indptr_h = nullptr;
  float sm_scale = 1.0f;
  bool pdl = true;
  cudaStream_t stream = nullptr;
};

class FiRunner {
 public:
  virtual ~FiRunner() {
    for (void* p : device_) cudaFree(p);
    for (void* p : host_) cudaFreeHost(p);
  }
  virtual cudaError_t Run() = 0;
  std::string plan;  // what the plan chose

 protected:
  void* Device(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) throw std::bad_alloc();
    device_.push_back(p);
    return p;
  }
  void* Host(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocHost(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) throw std::bad_alloc();
    host_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> device_, host_;
};

std::unique_ptr<FiRunner> MakeFiDecodeBf16(const FiCase& c);
std::unique_ptr<FiRunner> MakeFiDecodeFp8(const FiCase& c);
std::unique_ptr<FiRunner> MakeFiTcBf16(const FiCase& c);
std::unique_ptr<FiRunner> MakeFiTcFp8(const FiCase& c);

#if defined(DINFER_FI_ALL) || DINFER_FI_PART != 0
namespace {

namespace fi = flashinfer;
using Variant = fi::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                     /*soft_cap=*/false, /*alibi=*/false>;
constexpr size_t kFloatWorkspace = size_t{256} << 20, kIntWorkspace = size_t{16} << 20;

template <typename KV>
fi::paged_kv_t<KV, int32_t> PagedKv(const FiCase& c) {
  return fi::paged_kv_t<KV, int32_t>(
      kKvHeads, kPage, kHeadDim, c.seqs, fi::QKVLayout::kNHD,
      static_cast<KV*>(const_cast<void*>(c.k)), static_cast<KV*>(const_cast<void*>(c.v)),
      const_cast<int32_t*>(c.indices), const_cast<int32_t*>(c.indptr),
      const_cast<int32_t*>(c.last_len));
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// BatchDecodeWithPagedKVCacheWrapper.plan / .run without tensor cores (csrc/batch_decode.cu).
template <typename KV>
class FiDecode : public FiRunner {
 public:
  using Params = fi::BatchDecodeParams<__nv_bfloat16, KV, __nv_bfloat16, int32_t>;
  explicit FiDecode(const FiCase& c) : c_(c) {
    void* fbuf = Device(kFloatWorkspace);
    void* ibuf = Device(kIntWorkspace);
    void* pinned = Host(kIntWorkspace);
    fi::DecodePlanInfo info;
    auto estimate = fi::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<
        kHeads / kKvHeads, kHeadDim, fi::PosEncodingMode::kNone, Variant, Params>;
    Check(fi::DecodePlan<kHeadDim, fi::PosEncodingMode::kNone, Variant, Params>(
              fbuf, kFloatWorkspace, ibuf, pinned, kIntWorkspace, info,
              const_cast<int32_t*>(c.indptr_h), c.seqs, kHeads, kPage,
              /*enable_cuda_graph=*/false, c.stream, estimate),
          "DecodePlan");
    Check(cudaStreamSynchronize(c.stream), "DecodePlan copy");
    params_ = Params(static_cast<__nv_bfloat16*>(const_cast<void*>(c.q)), nullptr, PagedKv<KV>(c),
                     static_cast<__nv_bfloat16*>(c.out), nullptr, nullptr, kHeads,
                     kHeads * kHeadDim, kHeadDim, /*window_left=*/-1, /*soft_cap=*/0.0f, c.sm_scale,
                     /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
    params_.request_indices = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.request_indices_offset);
    params_.kv_tile_indices = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.kv_tile_indices_offset);
    params_.o_indptr = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.o_indptr_offset);
    params_.kv_chunk_size_ptr =
        fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.kv_chunk_size_ptr_offset);
    if (info.split_kv) {
      tmp_v_ = fi::GetPtrFromBaseOffset<__nv_bfloat16>(fbuf, info.v_offset);
      tmp_s_ = fi::GetPtrFromBaseOffset<float>(fbuf, info.s_offset);
    }
    params_.padded_batch_size = info.padded_batch_size;
    plan = "split_kv=" + std::to_string(info.split_kv) +
           " ctas=" + std::to_string(info.padded_batch_size) + "x" + std::to_string(kKvHeads);
  }
  cudaError_t Run() override {
    return fi::BatchDecodeWithPagedKVCacheDispatched<kHeadDim, fi::PosEncodingMode::kNone, Variant>(
        params_, tmp_v_, tmp_s_, c_.pdl, c_.stream);
  }

 private:
  FiCase c_;
  Params params_;
  __nv_bfloat16* tmp_v_ = nullptr;
  float* tmp_s_ = nullptr;
};

// The same wrapper with use_tensor_cores=True, backend "fa2": PrefillPlan with one query a
// sequence (uniform_q_len 1) and the paged prefill kernel without a mask
// (csrc/batch_prefill.cu, batch_prefill_paged.cuh).
template <typename KV>
class FiTc : public FiRunner {
 public:
  using Params = fi::BatchPrefillPagedParams<__nv_bfloat16, KV, __nv_bfloat16, int32_t>;
  explicit FiTc(const FiCase& c) : c_(c) {
    void* fbuf = Device(kFloatWorkspace);
    void* ibuf = Device(kIntWorkspace);
    void* pinned = Host(kIntWorkspace);
    fi::PrefillPlanInfo info;
    Check(fi::PrefillPlan<int32_t>(fbuf, kFloatWorkspace, ibuf, pinned, kIntWorkspace, info,
                                   const_cast<int32_t*>(c.qo_indptr_h),
                                   const_cast<int32_t*>(c.indptr_h), /*total_num_rows=*/c.seqs,
                                   c.seqs, kHeads, kKvHeads, kHeadDim, kHeadDim, kPage,
                                   /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2,
                                   /*window_left=*/-1, /*fixed_split_size=*/-1,
                                   /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
                                   /*uniform_q_len=*/1, /*fixed_uniform_q_len=*/true, c.stream,
                                   /*kv_dtype_bytes=*/sizeof(KV)),
          "PrefillPlan");
    Check(cudaStreamSynchronize(c.stream), "PrefillPlan copy");
    params_ = Params(static_cast<__nv_bfloat16*>(const_cast<void*>(c.q)), PagedKv<KV>(c), nullptr,
                     const_cast<int32_t*>(c.qo_indptr), nullptr, nullptr,
                     static_cast<__nv_bfloat16*>(c.out), nullptr, nullptr, kHeads,
                     kHeads * kHeadDim, kHeadDim, /*window_left=*/-1, /*soft_cap=*/0.0f, c.sm_scale,
                     /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
    params_.request_indices = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.request_indices_offset);
    params_.qo_tile_indices = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.qo_tile_indices_offset);
    params_.kv_tile_indices = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.kv_tile_indices_offset);
    params_.o_indptr = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.o_indptr_offset);
    params_.kv_chunk_size_ptr =
        fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.kv_chunk_size_ptr_offset);
    if (info.split_kv) {
      params_.merge_indptr = fi::GetPtrFromBaseOffset<int32_t>(ibuf, info.merge_indptr_offset);
      tmp_v_ = fi::GetPtrFromBaseOffset<__nv_bfloat16>(fbuf, info.v_offset);
      tmp_s_ = fi::GetPtrFromBaseOffset<float>(fbuf, info.s_offset);
    }
    params_.padded_batch_size = info.padded_batch_size;
    params_.max_total_num_rows = info.total_num_rows;
    cta_tile_q_ = info.cta_tile_q;
    if (cta_tile_q_ != 16 && cta_tile_q_ != 64) {
      throw std::runtime_error("plan chose cta_tile_q " + std::to_string(cta_tile_q_) +
                               " (only 16 and 64 are compiled)");
    }
    plan = "split_kv=" + std::to_string(info.split_kv) +
           " ctas=" + std::to_string(info.padded_batch_size) + "x" + std::to_string(kKvHeads) +
           " cta_tile_q=" + std::to_string(cta_tile_q_);
  }
  cudaError_t Run() override { return cta_tile_q_ == 16 ? Launch<16>() : Launch<64>(); }

 private:
  template <uint32_t kTileQ>
  cudaError_t Launch() {
    return fi::BatchPrefillWithPagedKVCacheDispatched<
        /*SAME_KV_STRIDES=*/true, kTileQ, kHeadDim, kHeadDim, fi::PosEncodingMode::kNone,
        /*USE_FP16_QK_REDUCTION=*/false, fi::MaskMode::kNone, /*USE_TOKEN_HEAD_SF=*/false, Variant,
        Params>(params_, tmp_v_, tmp_s_, c_.pdl, c_.stream);
  }
  FiCase c_;
  Params params_;
  __nv_bfloat16* tmp_v_ = nullptr;
  float* tmp_s_ = nullptr;
  int64_t cta_tile_q_ = 0;
};

}  // namespace
#endif

#if defined(DINFER_FI_ALL) || DINFER_FI_PART == 1
std::unique_ptr<FiRunner> MakeFiDecodeBf16(const FiCase& c) {
  return std::make_unique<FiDecode<__nv_bfloat16>>(c);
}
#endif
#if defined(DINFER_FI_ALL) || DINFER_FI_PART == 2
std::unique_ptr<FiRunner> MakeFiDecodeFp8(const FiCase& c) {
  return std::make_unique<FiDecode<__nv_fp8_e4m3>>(c);
}
#endif
#if defined(DINFER_FI_ALL) || DINFER_FI_PART == 3
std::unique_ptr<FiRunner> MakeFiTcBf16(const FiCase& c) {
  return std::make_unique<FiTc<__nv_bfloat16>>(c);
}
#endif
#if defined(DINFER_FI_ALL) || DINFER_FI_PART == 4
std::unique_ptr<FiRunner> MakeFiTcFp8(const FiCase& c) {
  return std::make_unique<FiTc<__nv_fp8_e4m3>>(c);
}
#endif

#if defined(DINFER_FI_ALL) || DINFER_FI_PART == 0
namespace {

namespace kc = dinfer::kernels::cuda;

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__device__ __forceinline__ float Uniform(uint64_t seed, uint64_t i) {  // in [-1, 1)
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void FillKernel(void* data, int64_t n, uint64_t seed, bool fp8, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = scale * Uniform(seed, i);
    if (fp8) {
      static_cast<__nv_fp8_e4m3*>(data)[i] = __nv_fp8_e4m3(v);
    } else {
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v);
    }
  }
}

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Buffer() { cudaFree(p); }
  Buffer(Buffer&& o) noexcept : p(o.p) { o.p = nullptr; }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p);
  }
};

Buffer Upload(const std::vector<int32_t>& v) {
  Buffer b(v.size() * 4);
  CHECK_CUDA(cudaMemcpy(b.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return b;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of one call of f, each timed with events, after warm-up.
template <typename F>
double TimeMs(cudaStream_t s, F&& f, int warmup = 5, int reps = 20) {
  for (int i = 0; i < warmup; ++i) CHECK_CUDA(f());
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(f());
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(ms);
}

// The same with the call captured in a CUDA graph (no host launch cost); -1 where the capture
// fails.
template <typename F>
double TimeGraphMs(cudaStream_t s, F&& f) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess) return -1;
  const cudaError_t call = f();
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (call != cudaSuccess || end != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    std::printf("  (graph capture failed: %s)\n",
                cudaGetErrorString(call != cudaSuccess ? call : end));
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1;
  }
  const double ms = TimeMs(s, [&] { return cudaGraphLaunch(exec, s); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms;
}

float ToFloat(uint16_t bf16) {
  const uint32_t u = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float E4m3ToFloat(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return static_cast<float>(v);
}

struct Impl {
  std::string name;
  double ms = -1, graph_ms = -1, rel_l2_vs_dinfer = -1, ref_err = -1;
  std::string plan, error;
};

struct Row {
  int seqs, ctx;
  bool fp8;
  double kv_bytes;
  std::vector<Impl> impls;
};

// The largest |out - reference| of sequences `check` over the reference's largest magnitude;
// the reference in float64 from the cache bytes copied back page by page.
double ReferenceError(const std::vector<std::vector<double>>& ref, const std::vector<int>& check,
                      const std::vector<uint16_t>& out) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < check.size(); ++i) {
    for (int j = 0; j < kHeads * kHeadDim; ++j) {
      const double r = ref[i][j];
      mag = std::max(mag, std::fabs(r));
      err = std::max(
          err, std::fabs(ToFloat(out[static_cast<size_t>(check[i]) * kHeads * kHeadDim + j]) - r));
    }
  }
  return mag > 0 ? err / mag : err;
}

Row RunCase(int seqs, int ctx, bool fp8, int multiprocessors, cudaStream_t s) {
  const int pages_per_seq = (ctx + kPage - 1) / kPage;
  const int64_t pages = static_cast<int64_t>(seqs) * pages_per_seq;
  const int elem = fp8 ? 1 : 2;
  const size_t cache_bytes = static_cast<size_t>(pages) * kPage * kKvDim * elem;
  Buffer k(cache_bytes), v(cache_bytes), q(static_cast<size_t>(seqs) * kHeads * kHeadDim * 2);
  const int fill_blocks = multiprocessors * 8;
  FillKernel<<<fill_blocks, 256, 0, s>>>(k.p, cache_bytes / elem, 11 + seqs, fp8, 1.0f);
  FillKernel<<<fill_blocks, 256, 0, s>>>(v.p, cache_bytes / elem, 12 + ctx, fp8, 1.0f);
  // Queries in [-6, 6): logits of a standard deviation near 2, so that the softmax is far from
  // uniform and a wrong scale or a lost key shows in the outputs.
  FillKernel<<<fill_blocks, 256, 0, s>>>(q.p, static_cast<int64_t>(seqs) * kHeads * kHeadDim, 13,
                                         false, 6.0f);
  CHECK_CUDA(cudaGetLastError());

  // Every sequence's pages in a shuffled order across the whole cache.
  std::vector<int32_t> tables(pages);
  std::iota(tables.begin(), tables.end(), 0);
  std::mt19937 rng(1234 + seqs);
  std::shuffle(tables.begin(), tables.end(), rng);
  std::vector<int32_t> indptr(seqs + 1), qo_indptr(seqs + 1), last_len(seqs), token_seq(seqs),
      positions(seqs), rows(seqs), seq_end(seqs);
  for (int i = 0; i <= seqs; ++i) {
    indptr[i] = i * pages_per_seq;
    qo_indptr[i] = i;
  }
  for (int i = 0; i < seqs; ++i) {
    last_len[i] = ctx - (pages_per_seq - 1) * kPage;
    token_seq[i] = i;
    positions[i] = ctx - 1;
    rows[i] = i;
    seq_end[i] = i + 1;
  }
  Buffer d_tables = Upload(tables), d_indptr = Upload(indptr), d_qo = Upload(qo_indptr),
         d_last = Upload(last_len), d_seq = Upload(token_seq), d_pos = Upload(positions),
         d_rows = Upload(rows), d_end = Upload(seq_end);
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const size_t out_bytes = static_cast<size_t>(seqs) * kHeads * kHeadDim * 2;

  Row row{seqs, ctx, fp8, 2.0 * seqs * ctx * kKvDim * elem, {}};

  // The float64 reference for the first and the last sequence.
  std::vector<int> check = {0};
  if (seqs > 1) check.push_back(seqs - 1);
  std::vector<uint16_t> q_h(static_cast<size_t>(seqs) * kHeads * kHeadDim);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(q_h.data(), q.p, out_bytes, cudaMemcpyDeviceToHost));
  std::vector<std::vector<double>> ref;
  {
    const size_t page_bytes = static_cast<size_t>(kPage) * kKvDim * elem;
    std::vector<uint8_t> kp(page_bytes * pages_per_seq), vp(page_bytes * pages_per_seq);
    for (int sq : check) {
      for (int j = 0; j < pages_per_seq; ++j) {
        const size_t at =
            static_cast<size_t>(tables[static_cast<size_t>(sq) * pages_per_seq + j]) * page_bytes;
        CHECK_CUDA(cudaMemcpy(kp.data() + j * page_bytes, k.get<uint8_t>() + at, page_bytes,
                              cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(vp.data() + j * page_bytes, v.get<uint8_t>() + at, page_bytes,
                              cudaMemcpyDeviceToHost));
      }
      auto value = [&](const std::vector<uint8_t>& c, int64_t t, int col) -> double {
        const size_t i = static_cast<size_t>(t) * kKvDim + col;
        if (fp8) return E4m3ToFloat(c[i]);
        uint16_t b;
        std::memcpy(&b, c.data() + 2 * i, 2);
        return ToFloat(b);
      };
      std::vector<double> o(kHeads * kHeadDim, 0.0), logits(ctx);
      for (int h = 0; h < kHeads; ++h) {
        const int g = h / (kHeads / kKvHeads);
        double mx = -1e300;
        for (int t = 0; t < ctx; ++t) {
          double d = 0;
          for (int x = 0; x < kHeadDim; ++x) {
            d += ToFloat(q_h[(static_cast<size_t>(sq) * kHeads + h) * kHeadDim + x]) *
                 value(kp, t, g * kHeadDim + x);
          }
          logits[t] = d * sm_scale;
          mx = std::max(mx, logits[t]);
        }
        double sum = 0;
        for (int t = 0; t < ctx; ++t) sum += (logits[t] = std::exp(logits[t] - mx));
        for (int t = 0; t < ctx; ++t) {
          for (int x = 0; x < kHeadDim; ++x) {
            o[h * kHeadDim + x] += logits[t] / sum * value(vp, t, g * kHeadDim + x);
          }
        }
      }
      ref.push_back(std::move(o));
    }
  }

  // Ours.
  Buffer out_ours(out_bytes);
  std::vector<uint16_t> ours_h(out_bytes / 2);
  {
    kc::AttentionParams p;
    p.q = q.p;
    p.q_stride = kHeads * kHeadDim;
    p.out = out_ours.p;
    p.out_stride = kHeads * kHeadDim;
    p.dtype = DType::kBF16;
    p.k_cache = k.p;
    p.v_cache = v.p;
    p.kv_fp8 = fp8;
    p.block_size = kPage;
    p.num_heads = kHeads;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.token_seq = d_seq.get<int32_t>();
    p.positions = d_pos.get<int32_t>();
    p.block_tables = d_tables.get<int32_t>();
    p.max_blocks_per_seq = pages_per_seq;
    p.scale = sm_scale;
    p.row_tokens = d_rows.get<int32_t>();
    p.num_rows = seqs;
    p.num_splits = kc::ChooseAttentionSplits(
        seqs, kc::AttentionRowsCtas(seqs, DType::kBF16, kHeadDim, fp8, kHeads, kKvHeads), ctx,
        multiprocessors);
    p.seq_token_end = d_end.get<int32_t>();
    const int64_t cells = static_cast<int64_t>(seqs) * kHeads * p.num_splits;
    Buffer split_out(cells * kHeadDim * 4), split_stats(cells * 8);
    p.split_out = split_out.get<float>();
    p.split_stats = split_stats.get<float>();
    auto call = [&] { return static_cast<cudaError_t>(kc::AttentionRows(p, s)); };
    Impl im;
    im.name = "dinfer";
    im.plan = "splits=" + std::to_string(p.num_splits);
    CHECK_CUDA(cudaMemsetAsync(out_ours.p, 0, out_bytes, s));
    CHECK_CUDA(call());
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(ours_h.data(), out_ours.p, out_bytes, cudaMemcpyDeviceToHost));
    im.ref_err = ReferenceError(ref, check, ours_h);
    im.rel_l2_vs_dinfer = 0;
    im.ms = TimeMs(s, call);
    im.graph_ms = TimeGraphMs(s, call);
    row.impls.push_back(im);
  }

  // FlashInfer's two paths.
  FiCase c;
  c.seqs = seqs;
  c.ctx = ctx;
  c.q = q.p;
  c.k = k.p;
  c.v = v.p;
  c.indices = d_tables.get<int32_t>();
  c.indptr = d_indptr.get<int32_t>();
  c.last_len = d_last.get<int32_t>();
  c.qo_indptr = d_qo.get<int32_t>();
  c.indptr_h = indptr.data();
  c.qo_indptr_h = qo_indptr.data();
  c.sm_scale = sm_scale;
  c.pdl = true;
  c.stream = s;
  for (int path = 0; path < 2; ++path) {
    Impl im;
    im.name = path == 0 ? "fi-decode" : "fi-tc";
    Buffer out(out_bytes);
    c.out = out.p;
    try {
      std::unique_ptr<FiRunner> r = path == 0 ? (fp8 ? MakeFiDecodeFp8(c) : MakeFiDecodeBf16(c))
                                              : (fp8 ? MakeFiTcFp8(c) : MakeFiTcBf16(c));
      im.plan = r->plan;
      CHECK_CUDA(cudaMemsetAsync(out.p, 0, out_bytes, s));
      cudaError_t e = r->Run();
      if (e == cudaSuccess) e = cudaStreamSynchronize(s);
      if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
      std::vector<uint16_t> h(out_bytes / 2);
      CHECK_CUDA(cudaMemcpy(h.data(), out.p, out_bytes, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < h.size(); ++i) {
        const double a = ToFloat(h[i]), b = ToFloat(ours_h[i]);
        num += (a - b) * (a - b);
        den += b * b;
      }
      im.rel_l2_vs_dinfer = std::sqrt(num / std::max(den, 1e-30));
      im.ref_err = ReferenceError(ref, check, h);
      im.ms = TimeMs(s, [&] { return r->Run(); });
      im.graph_ms = TimeGraphMs(s, [&] { return r->Run(); });
    } catch (const std::exception& e) {
      im.error = e.what();
      std::replace(im.error.begin(), im.error.end(), '"', '\'');
      std::replace(im.error.begin(), im.error.end(), '\n', ' ');
      cudaGetLastError();
    }
    row.impls.push_back(im);
  }
  return row;
}

double MeasureReadGbs(int multiprocessors, cudaStream_t s) {
  const int64_t bytes = int64_t{4} << 30;
  Buffer a(bytes), sink(16);
  CHECK_CUDA(cudaMemsetAsync(a.p, 1, bytes, s));
  const double ms = TimeMs(
      s,
      [&] {
        return static_cast<cudaError_t>(
            LaunchRead(a.p, bytes, sink.get<unsigned>(), multiprocessors, s));
      },
      2, 10);
  return bytes / ms / 1e6;
}

}  // namespace
}  // namespace dinfer::bench

int main(int argc, char** argv) {
  using namespace dinfer::bench;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int sms = prop.multiProcessorCount;
  const double read_gbs = MeasureReadGbs(sms, s);
  std::printf("%s, %d SMs; HBM read %.0f GB/s (4 GiB streaming read)\n", prop.name, sms, read_gbs);
  std::printf("paged decode, 32 q heads / 8 kv heads x 128, pages of 16 tokens, shuffled\n");
  std::printf("%-22s %-10s %9s %8s %6s %9s %6s %9s %9s  %s\n", "shape", "impl", "ms", "GB/s",
              "frac", "graph ms", "frac", "vs ours", "vs f64", "plan");
  const int shapes[][2] = {{256, 1536}, {64, 2048}, {1, 32768}, {1, 272}};
  std::vector<Row> rows;
  for (const bool fp8 : {false, true}) {
    for (const auto& sh : shapes) {
      Row r = RunCase(sh[0], sh[1], fp8, sms, s);
      const std::string name =
          std::to_string(sh[0]) + "x" + std::to_string(sh[1]) + (fp8 ? " e4m3" : " bf16");
      for (const Impl& im : r.impls) {
        if (!im.error.empty()) {
          std::printf("%-22s %-10s failed: %s\n", name.c_str(), im.name.c_str(), im.error.c_str());
          continue;
        }
        const double gbs = r.kv_bytes / im.ms / 1e6;
        const double ggbs = im.graph_ms > 0 ? r.kv_bytes / im.graph_ms / 1e6 : 0;
        std::printf("%-22s %-10s %9.4f %8.0f %6.3f %9.4f %6.3f %9.2e %9.2e  %s\n", name.c_str(),
                    im.name.c_str(), im.ms, gbs, gbs / read_gbs, im.graph_ms, ggbs / read_gbs,
                    im.rel_l2_vs_dinfer, im.ref_err, im.plan.c_str());
      }
      std::fflush(stdout);
      rows.push_back(std::move(r));
    }
  }
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (!f) {
      std::perror(argv[1]);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"multiprocessors\": %d, \"hbm_read_gbs\": %.1f,\n",
                 prop.name, sms, read_gbs);
    std::fprintf(f, " \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"page\": %d,\n", kHeads,
                 kKvHeads, kHeadDim, kPage);
    std::fprintf(f, " \"rows\": [");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "%s\n  {\"seqs\": %d, \"ctx\": %d, \"kv\": \"%s\", \"kv_bytes\": %.0f, "
                   "\"impls\": [",
                   i ? "," : "", r.seqs, r.ctx, r.fp8 ? "e4m3" : "bf16", r.kv_bytes);
      for (size_t j = 0; j < r.impls.size(); ++j) {
        const Impl& im = r.impls[j];
        const double gbs = im.ms > 0 ? r.kv_bytes / im.ms / 1e6 : 0;
        const double ggbs = im.graph_ms > 0 ? r.kv_bytes / im.graph_ms / 1e6 : 0;
        std::fprintf(f,
                     "%s\n    {\"name\": \"%s\", \"ms\": %.5f, \"gbs\": %.1f, "
                     "\"fraction_of_hbm_read\": %.4f, \"graph_ms\": %.5f, \"graph_gbs\": %.1f, "
                     "\"graph_fraction_of_hbm_read\": %.4f, \"rel_l2_vs_dinfer\": %.3e, "
                     "\"max_err_vs_f64\": %.3e, \"plan\": \"%s\", \"error\": \"%s\"}",
                     j ? "," : "", im.name.c_str(), im.ms, gbs, gbs / read_gbs, im.graph_ms, ggbs,
                     ggbs / read_gbs, im.rel_l2_vs_dinfer, im.ref_err, im.plan.c_str(),
                     im.error.c_str());
      }
      std::fprintf(f, "]}");
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  cudaStreamDestroy(s);
  return 0;
}
#else
}  // namespace dinfer::bench
#endif
