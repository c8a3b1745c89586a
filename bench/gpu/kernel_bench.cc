// The kernel speed table: each CUDA kernel on the shapes of an 8B Llama (hidden 4096, 32 query /
// 8 KV heads of 128, MLP 14336, vocabulary 128256), as GB/s against the measured read bandwidth
// or TFLOP/s against the measured bf16 matrix rate (FP8 products: against twice that, the
// datasheet's FP8 : bf16 ratio, and against the 8192³ FP8 product measured here). Inputs larger
// than the L2 cache, or rotated among copies that together are, so that timings are of HBM.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>

#include "bench/gpu/bench_common.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/qkv.h"

namespace dinfer::bench {
namespace {

namespace kc = kernels::cuda;
namespace json = boost::json;

constexpr int64_t kHidden = 4096, kInter = 14336, kVocab = 128256, kHeads = 32, kKvHeads = 8,
                  kHeadDim = 128;
constexpr int64_t kRotateBytes = int64_t{256} << 20;  // several times the 60 MB L2

struct Table {
  const Limits& limits;
  json::array rows;
  void Add(const std::string& name, double ms, double bytes, double flops, bool fp8 = false) {
    const double peak = fp8 ? 2 * limits.bf16_tflops : limits.bf16_tflops;
    json::object o{{"name", name}, {"ms", ms}};
    if (bytes > 0) {
      const double gbs = bytes / ms / 1e6;
      o["gbs"] = gbs;
      o["fraction_of_read_bw"] = gbs / limits.read_gbs;
    }
    if (flops > 0) {
      const double tflops = flops / ms / 1e9;
      o["tflops"] = tflops;
      o[fp8 ? "fraction_of_2x_bf16_peak" : "fraction_of_gemm_peak"] = tflops / peak;
    }
    std::printf("%-44s %9.4f ms", name.c_str(), ms);
    if (bytes > 0)
      std::printf("  %7.0f GB/s (%.3f of read)", bytes / ms / 1e6,
                  bytes / ms / 1e6 / limits.read_gbs);
    if (flops > 0)
      std::printf("  %6.1f TFLOP/s (%.3f of %s)", flops / ms / 1e9, flops / ms / 1e9 / peak,
                  fp8 ? "2x bf16 GEMM" : "GEMM");
    std::printf("\n");
    rows.push_back(std::move(o));
  }
};

Status GemmRows(const cuda::Stream& s, Table& t) {
  DINFER_ASSIGN_OR_RETURN(auto gemm, kc::GemmRunner::Create());
  const int64_t max_m = 16384;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, RandomBuffer(max_m * kInter, DType::kBF16, 10));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer y,
                          cuda::DeviceBuffer::Allocate(max_m * 2 * kInter * 2));
  for (const ProductShape& sh : kLlama8bProducts) {
    const int64_t w_bytes = sh.n * sh.k * 2;
    const int64_t copies = std::max<int64_t>(1, (kRotateBytes + w_bytes - 1) / w_bytes);
    DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w,
                            RandomBuffer(copies * sh.n * sh.k, DType::kBF16, 11, 0.02f));
    // m = 64 and 256: the products of decode steps at those batch sizes (1,000/1,000 at 256).
    for (int64_t m : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{64}, int64_t{256}, max_m}) {
      for (kc::GemmImpl impl : {kc::GemmImpl::kGemv, kc::GemmImpl::kCublasLt}) {
        if (m > kc::kGemvMaxRows && impl == kc::GemmImpl::kGemv) continue;
        if (m == max_m && sh.n == kVocab) continue;  // prefill computes logits of last tokens only
        int64_t i = 0;
        kc::GemmParams p;
        p.x = x.data();
        p.y = y.data();
        p.m = m;
        p.n = sh.n;
        p.k = sh.k;
        p.ldx = p.ldw = sh.k;
        p.ldy = sh.n;
        p.out_dtype = sh.n == kVocab ? DType::kF32 : DType::kBF16;
        DINFER_ASSIGN_OR_RETURN(double ms, TimeMs(s, 3, 20, [&] {
                                  p.w = static_cast<char*>(w.data()) + (i++ % copies) * w_bytes;
                                  return gemm->Run(p, s.get(), impl);
                                }));
        const std::string name = std::string("gemm ") + sh.name + " m=" + std::to_string(m) +
                                 (impl == kc::GemmImpl::kGemv ? " gemv" : " cublaslt");
        t.Add(name, ms, m <= 8 ? static_cast<double>(w_bytes) : 0.0,
              m <= 8 ? 0.0 : 2.0 * m * sh.n * sh.k);
        if (m > kc::kGemvFusedMaxRows || impl != kc::GemmImpl::kGemv) continue;
        // The staged GEMV (plain input) at a few CTAs per multiprocessor.
        for (int per_sm : {1, 2, 3, 4}) {
          kc::GemvFusedParams f;
          f.gemm = p;
          f.blocks_per_sm = per_sm;
          if (!kc::GemvFusedSupports(f)) break;
          DINFER_ASSIGN_OR_RETURN(double sms, TimeMs(s, 3, 20, [&] {
                                    f.gemm.w =
                                        static_cast<char*>(w.data()) + (i++ % copies) * w_bytes;
                                    return cuda::CudaStatus(kc::GemvFused(f, s.get()), "staged");
                                  }));
          t.Add(std::string("gemm ") + sh.name + " m=" + std::to_string(m) +
                    " staged ctas/sm=" + std::to_string(per_sm),
                sms, static_cast<double>(w_bytes), 0.0);
        }
        if (m != 1) continue;
        // The other GEMV tilings, against the default above.
        for (kc::GemvTiling tiling : {kc::GemvTiling{2, 4, 1}, kc::GemvTiling{2, 4, 2},
                                      kc::GemvTiling{2, 4, 4}, kc::GemvTiling{1, 8, 4}}) {
          DINFER_ASSIGN_OR_RETURN(double tms, TimeMs(s, 3, 20, [&] {
                                    p.w = static_cast<char*>(w.data()) + (i++ % copies) * w_bytes;
                                    return cuda::CudaStatus(kc::Gemv(p, s.get(), tiling), "gemv");
                                  }));
          t.Add(name + " cols=" + std::to_string(tiling.cols) + " unroll=" +
                    std::to_string(tiling.unroll) + " split=" + std::to_string(tiling.split),
                tms, static_cast<double>(w_bytes), 0.0);
        }
      }
    }
  }
  // DeepSeek-V4-Flash's batch-1 decode products (the x projection, router, grouped wo_a, wo_b,
  // shared expert, q_proj) at one and two rows, as GemmRunner runs them (the staged GEMV).
  struct V4Shape {
    const char* name;
    int64_t n, k, group_n;
    DType out;
  };
  const V4Shape v4[] = {
      {"x_proj", 3072, 4096, 0, DType::kF32},     {"router", 256, 4096, 0, DType::kF32},
      {"wo_a", 8192, 4096, 1024, DType::kBF16},   {"wo_b", 4096, 8192, 0, DType::kF32},
      {"shared_w13", 4096, 4096, 0, DType::kF32}, {"shared_w2", 4096, 2048, 0, DType::kF32},
      {"q_proj", 40960, 1024, 0, DType::kF32}};
  for (const V4Shape& sh : v4) {
    const int64_t w_bytes = sh.n * sh.k * 2;
    const int64_t copies = std::max<int64_t>(1, (kRotateBytes + w_bytes - 1) / w_bytes);
    DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w,
                            RandomBuffer(copies * sh.n * sh.k, DType::kBF16, 12, 0.02f));
    for (int64_t m : {int64_t{1}, int64_t{2}}) {
      int64_t i = 0;
      kc::GemmParams p;
      p.x = x.data();
      p.y = y.data();
      p.m = m;
      p.n = sh.n;
      p.k = sh.k;
      p.ldx = sh.group_n > 0 ? sh.n / sh.group_n * sh.k : sh.k;
      p.ldw = sh.k;
      p.ldy = sh.n;
      p.out_dtype = sh.out;
      p.group_n = sh.group_n;
      DINFER_ASSIGN_OR_RETURN(double ms, TimeMs(s, 3, 20, [&] {
                                p.w = static_cast<char*>(w.data()) + (i++ % copies) * w_bytes;
                                return gemm->Run(p, s.get());
                              }));
      t.Add(std::string("gemm v4 ") + sh.name + " m=" + std::to_string(m), ms,
            static_cast<double>(w_bytes), 0.0);
    }
  }
  return OkStatus();
}

// FP8 products (e4m3 x and w, bf16 out) with each kind of scales, on the 8B shapes from decode
// (m = 1) to prefill (m = 16384) and on 8192³ (the FP8 rate this GPU reaches through cuBLASLt):
// per-tensor and per-channel scales through cuBLASLt, 128 x 128 block scales through our kernel
// (its paths side by side at m = 16 and 256); also the activation quantization.
Status Fp8GemmRows(const cuda::Stream& s, Table& t) {
  DINFER_ASSIGN_OR_RETURN(auto gemm, kc::GemmRunner::Create());
  struct Shape {
    const char* name;
    int64_t m, n, k;
  };
  const int64_t max_m = 16384, big = 8192;
  std::vector<Shape> shapes;
  for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{256}, int64_t{2048}, max_m}) {
    shapes.push_back({"qkv", m, kHidden + 2 * kKvHeads * kHeadDim, kHidden});
    shapes.push_back({"o", m, kHidden, kHidden});
    shapes.push_back({"gate_up", m, 2 * kInter, kHidden});
    shapes.push_back({"down", m, kHidden, kInter});
  }
  shapes.push_back({"square", big, big, big});
  const int64_t max_k = kInter;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, RandomBuffer(max_m * max_k, DType::kBF16, 20));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer x8, cuda::DeviceBuffer::Allocate(max_m * max_k));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer y,
                          cuda::DeviceBuffer::Allocate(max_m * 2 * kInter * 2));
  // Scales of 1/64 everywhere: the timings do not depend on their values.
  const int64_t max_scales = std::max(max_m * (max_k / 128), int64_t{2} * kInter);
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer x_scale,
                          cuda::DeviceBuffer::Allocate(max_scales * sizeof(float)));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w_scale,
                          cuda::DeviceBuffer::Allocate(max_scales * sizeof(float)));
  const std::vector<float> ones(max_scales, 1.0f / 64);
  DINFER_RETURN_IF_ERROR(x_scale.CopyFromHost(ones.data(), ones.size() * sizeof(float)));
  DINFER_RETURN_IF_ERROR(w_scale.CopyFromHost(ones.data(), ones.size() * sizeof(float)));
  for (auto [scaling, label] : {std::pair{kc::Fp8Scaling::kTensor, "tensor"},
                                std::pair{kc::Fp8Scaling::kChannel, "channel"},
                                std::pair{kc::Fp8Scaling::kBlock128, "block128"}}) {
    kc::Fp8QuantizeParams q;
    q.x = x.data();
    q.ldx = q.k = kHidden;
    q.m = max_m;
    q.out = x8.data();
    q.scaling = scaling;
    q.scale = static_cast<float*>(x_scale.data());
    DINFER_ASSIGN_OR_RETURN(double qms, TimeMs(s, 2, 10, [&] {
                              return cuda::CudaStatus(kc::QuantizeFp8(q, s.get()), "quantize");
                            }));
    t.Add(std::string("fp8 quantize ") + label + " 16384x4096", qms, max_m * kHidden * 3.0, 0);
    DINFER_RETURN_IF_ERROR(x_scale.CopyFromHost(ones.data(), ones.size() * sizeof(float)));
  }
  for (const Shape& sh : shapes) {
    const int64_t w_bytes = sh.n * sh.k;
    const int64_t copies = std::max<int64_t>(1, (kRotateBytes + w_bytes - 1) / w_bytes);
    DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w, cuda::DeviceBuffer::Allocate(copies * w_bytes));
    // The e4m3 bytes of the bf16 random inputs, quantized by a tensor scale of 1/64.
    DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer w16, RandomBuffer(sh.n * sh.k, DType::kBF16, 21));
    for (int64_t c = 0; c < copies; ++c) {
      kc::Fp8QuantizeParams q;
      q.x = w16.data();
      q.ldx = q.k = sh.k;
      q.m = sh.n;
      q.out = static_cast<char*>(w.data()) + c * w_bytes;
      q.scaling = kc::Fp8Scaling::kTensor;
      q.scale = static_cast<float*>(w_scale.data());
      DINFER_RETURN_IF_ERROR(cuda::CudaStatus(kc::QuantizeFp8(q, s.get()), "quantize"));
    }
    {
      kc::Fp8QuantizeParams q;
      q.x = x.data();
      q.ldx = q.k = sh.k;
      q.m = sh.m;
      q.out = x8.data();
      q.scaling = kc::Fp8Scaling::kTensor;
      q.scale = static_cast<float*>(x_scale.data());
      DINFER_RETURN_IF_ERROR(cuda::CudaStatus(kc::QuantizeFp8(q, s.get()), "quantize"));
    }
    // Weights once, activations once, bf16 out.
    const double bytes = double(w_bytes) + sh.m * sh.k + 2.0 * sh.m * sh.n;
    const double flops = 2.0 * sh.m * sh.n * sh.k;
    // The product of this shape with `scaling` (the weights' copy is set per run).
    auto params = [&](kc::Fp8Scaling scaling) {
      kc::Fp8GemmParams p;
      p.x = x8.data();
      p.y = y.data();
      p.m = sh.m;
      p.n = sh.n;
      p.k = sh.k;
      p.ldx = p.ldw = sh.k;
      p.ldy = sh.n;
      p.scaling = scaling;
      p.x_scale = static_cast<const float*>(x_scale.data());
      p.w_scale = static_cast<const float*>(w_scale.data());
      return p;
    };
    for (auto [scaling, label] : {std::pair{kc::Fp8Scaling::kTensor, "tensor"},
                                  std::pair{kc::Fp8Scaling::kChannel, "channel"},
                                  std::pair{kc::Fp8Scaling::kBlock128, "block128"}}) {
      if (sh.n == big && scaling != kc::Fp8Scaling::kTensor) continue;
      int64_t i = 0;
      kc::Fp8GemmParams p = params(scaling);
      auto timed = TimeMs(s, 3, 20, [&] {
        p.w = static_cast<char*>(w.data()) + (i++ % copies) * w_bytes;
        return gemm->RunFp8(p, s.get());
      });
      const std::string name =
          std::string("fp8 gemm ") + sh.name + " m=" + std::to_string(sh.m) + " " + label;
      if (!timed.ok()) {  // a scaling cuBLASLt does not offer for this shape: say so, go on
        std::printf("%-44s %s\n", name.c_str(), timed.status().ToString().c_str());
        continue;
      }
      t.Add(name, *timed, bytes, flops, true);
    }
    // The block-scaled kernel's paths side by side where the automatic choice changes.
    if (sh.n == big || (sh.m != 16 && sh.m != 256)) continue;
    for (auto [path, label] : {std::pair{kc::Fp8BlockPath::kSkinny, "skinny"},
                               std::pair{kc::Fp8BlockPath::kTiled64, "tiled64"},
                               std::pair{kc::Fp8BlockPath::kTiled128, "tiled128"},
                               std::pair{kc::Fp8BlockPath::kWgmma64, "wgmma64"},
                               std::pair{kc::Fp8BlockPath::kWgmma128, "wgmma128"}}) {
      int64_t i = 0;
      kc::Fp8GemmParams p = params(kc::Fp8Scaling::kBlock128);
      DINFER_ASSIGN_OR_RETURN(double ms, TimeMs(s, 3, 20, [&] {
                                p.w = static_cast<char*>(w.data()) + (i++ % copies) * w_bytes;
                                return cuda::CudaStatus(kc::Fp8BlockGemm(p, s.get(), path),
                                                        "fp8 block gemm");
                              }));
      t.Add(
          std::string("fp8 gemm ") + sh.name + " m=" + std::to_string(sh.m) + " block128 " + label,
          ms, bytes, flops, true);
    }
  }
  return OkStatus();
}

// Attention over `seqs` sequences of `ctx` cached keys each: decode (one query each, the rows
// kernel) or a whole causal prompt (the prefill kernel); fp8: an e4m3 cache (its bytes are
// those of the random bf16 cache: the timings do not depend on the values). Each sequence's
// blocks follow one another in the cache (as a prompt's do when it is written into a fresh
// pool), or with `shuffled` lie anywhere in it (as in a pool that has served many requests).
Status AttentionRows(const cuda::Stream& s, Table& t, int64_t seqs, int64_t ctx, bool prefill,
                     int multiprocessors, bool fp8 = false, bool shuffled = false) {
  const int64_t bs = 16, blocks_per_seq = (ctx + bs - 1) / bs, kv_dim = kKvHeads * kHeadDim;
  const int64_t tokens = prefill ? seqs * ctx : seqs;
  const int64_t q_stride = kHeads * kHeadDim + 2 * kv_dim;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer kc_,
                          RandomBuffer(seqs * blocks_per_seq * bs * kv_dim, DType::kBF16, 20));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer vc_,
                          RandomBuffer(seqs * blocks_per_seq * bs * kv_dim, DType::kBF16, 21));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer q, RandomBuffer(tokens * q_stride, DType::kBF16, 22));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer out,
                          cuda::DeviceBuffer::Allocate(tokens * kHeads * kHeadDim * 2));
  std::vector<int32_t> tables(seqs * blocks_per_seq), token_seq, positions, seq_end, rows, tile_seq,
      tile_token;
  std::iota(tables.begin(), tables.end(), 0);
  if (shuffled) std::shuffle(tables.begin(), tables.end(), std::mt19937(7));
  for (int64_t sq = 0; sq < seqs; ++sq) {
    const int64_t first = static_cast<int64_t>(token_seq.size());
    const int64_t n = prefill ? ctx : 1;
    for (int64_t i = 0; i < n; ++i) {
      token_seq.push_back(static_cast<int32_t>(sq));
      positions.push_back(static_cast<int32_t>(prefill ? i : ctx - 1));
      if (!prefill) rows.push_back(static_cast<int32_t>(first + i));
    }
    seq_end.push_back(static_cast<int32_t>(token_seq.size()));
  }
  // Longest tiles first (as the runner orders them): the last tile of every sequence, then the
  // one before, ...
  for (int64_t i = prefill ? (ctx - 1) / kc::kPrefillTileTokens : -1; i >= 0; --i) {
    for (int64_t sq = 0; sq < seqs; ++sq) {
      tile_seq.push_back(static_cast<int32_t>(sq));
      tile_token.push_back(static_cast<int32_t>(sq * ctx + i * kc::kPrefillTileTokens));
    }
  }
  auto upload = [](const std::vector<int32_t>& v) -> StatusOr<cuda::DeviceBuffer> {
    DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer b,
                            cuda::DeviceBuffer::Allocate(std::max<size_t>(v.size(), 1) * 4));
    DINFER_RETURN_IF_ERROR(b.CopyFromHost(v.data(), v.size() * 4));
    return b;
  };
  DINFER_ASSIGN_OR_RETURN(auto d_tables, upload(tables));
  DINFER_ASSIGN_OR_RETURN(auto d_seq, upload(token_seq));
  DINFER_ASSIGN_OR_RETURN(auto d_pos, upload(positions));
  DINFER_ASSIGN_OR_RETURN(auto d_end, upload(seq_end));
  DINFER_ASSIGN_OR_RETURN(auto d_rows, upload(rows));
  DINFER_ASSIGN_OR_RETURN(auto d_tile_seq, upload(tile_seq));
  DINFER_ASSIGN_OR_RETURN(auto d_tile_token, upload(tile_token));
  kc::AttentionParams p;
  p.q = q.data();
  p.q_stride = q_stride;
  p.out = out.data();
  p.out_stride = kHeads * kHeadDim;
  p.k_cache = kc_.data();
  p.v_cache = vc_.data();
  p.kv_fp8 = fp8;
  p.block_size = bs;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.token_seq = static_cast<const int32_t*>(d_seq.data());
  p.positions = static_cast<const int32_t*>(d_pos.data());
  p.block_tables = static_cast<const int32_t*>(d_tables.data());
  p.max_blocks_per_seq = blocks_per_seq;
  p.scale = 0.088f;
  p.row_tokens = static_cast<const int32_t*>(d_rows.data());
  p.num_rows = static_cast<int64_t>(rows.size());
  p.num_splits =
      prefill ? 1
              : kc::ChooseAttentionSplits(p.num_rows,
                                          kc::AttentionRowsCtas(p.num_rows, DType::kBF16, kHeadDim,
                                                                fp8, kHeads, kKvHeads),
                                          ctx, multiprocessors);
  const int64_t cells = p.num_rows * kHeads * p.num_splits;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer split_out,
                          cuda::DeviceBuffer::Allocate(std::max<int64_t>(cells, 1) * kHeadDim * 4));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer split_stats,
                          cuda::DeviceBuffer::Allocate(std::max<int64_t>(cells, 1) * 8));
  p.split_out = static_cast<float*>(split_out.data());
  p.split_stats = static_cast<float*>(split_stats.data());
  p.tile_seq = static_cast<const int32_t*>(d_tile_seq.data());
  p.tile_token = static_cast<const int32_t*>(d_tile_token.data());
  p.seq_token_end = static_cast<const int32_t*>(d_end.data());
  p.num_tiles = static_cast<int64_t>(tile_seq.size());
  DINFER_ASSIGN_OR_RETURN(double ms, TimeMs(s, 2, 10, [&] {
                            const int e = prefill ? kc::AttentionPrefill(p, s.get())
                                                  : kc::AttentionRows(p, s.get());
                            return cuda::CudaStatus(e, "attention");
                          }));
  const std::string name = std::string(prefill ? "attention prefill " : "attention decode ") +
                           std::to_string(seqs) + "x" + std::to_string(ctx) +
                           (prefill ? "" : " splits=" + std::to_string(p.num_splits)) +
                           (fp8 ? " fp8 kv" : "") + (shuffled ? " shuffled" : "");
  const double kv_bytes = 2.0 * seqs * ctx * kv_dim * (fp8 ? 1 : 2);
  const double flops = 4.0 * kHeadDim * kHeads * seqs * (ctx * (ctx + 1) / 2.0);
  t.Add(name, ms, prefill ? 0.0 : kv_bytes, prefill ? flops : 0.0);
  return OkStatus();
}

Status ElementwiseRows(const cuda::Stream& s, Table& t) {
  const int64_t n = 16384;
  const int64_t qkv_width = kHeads * kHeadDim + 2 * kKvHeads * kHeadDim;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer residual, RandomBuffer(n * kHidden, DType::kF32, 30));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer add, RandomBuffer(n * kHidden, DType::kBF16, 31));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer weight, RandomBuffer(kHidden, DType::kF32, 32));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer normed, cuda::DeviceBuffer::Allocate(n * kHidden * 2));
  kc::RmsNormParams rn;
  rn.residual = static_cast<float*>(residual.data());
  rn.add = add.data();
  rn.weight = static_cast<const float*>(weight.data());
  rn.out = normed.data();
  rn.rows = n;
  rn.dim = kHidden;
  DINFER_ASSIGN_OR_RETURN(double ms, TimeMs(s, 2, 10, [&] {
                            return cuda::CudaStatus(kc::RmsNorm(rn, s.get()), "rmsnorm");
                          }));
  t.Add("rmsnorm+residual 16384x4096", ms, n * kHidden * (4.0 + 2 + 4 + 2), 0);

  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer gu, RandomBuffer(n * 2 * kInter, DType::kBF16, 33));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer act, cuda::DeviceBuffer::Allocate(n * kInter * 2));
  kc::SiluMulParams sm;
  sm.gate = gu.data();
  sm.up = static_cast<char*>(gu.data()) + kInter * 2;
  sm.out = act.data();
  sm.rows = n;
  sm.dim = kInter;
  sm.in_stride = 2 * kInter;
  DINFER_ASSIGN_OR_RETURN(
      ms, TimeMs(s, 2, 10, [&] { return cuda::CudaStatus(kc::SiluMul(sm, s.get()), "silu"); }));
  t.Add("silu*mul 16384x14336", ms, n * kInter * 6.0, 0);

  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer qkv, RandomBuffer(n * qkv_width, DType::kBF16, 34));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer cache_k,
                          cuda::DeviceBuffer::Allocate(n * kKvHeads * kHeadDim * 2));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer cache_v,
                          cuda::DeviceBuffer::Allocate(n * kKvHeads * kHeadDim * 2));
  std::vector<int32_t> pos(n);
  std::vector<int64_t> slots(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<float> inv_freq(kHeadDim / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(500000.0f, -2.0f * i / kHeadDim);
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_pos, cuda::DeviceBuffer::Allocate(n * 4));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_slots, cuda::DeviceBuffer::Allocate(n * 8));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_freq, cuda::DeviceBuffer::Allocate(kHeadDim * 2));
  DINFER_RETURN_IF_ERROR(d_pos.CopyFromHost(pos.data(), n * 4));
  DINFER_RETURN_IF_ERROR(d_slots.CopyFromHost(slots.data(), n * 8));
  DINFER_RETURN_IF_ERROR(d_freq.CopyFromHost(inv_freq.data(), inv_freq.size() * 4));
  kc::QkvParams qp;
  qp.qkv = qkv.data();
  qp.qkv_stride = qkv_width;
  qp.num_tokens = n;
  qp.num_heads = kHeads;
  qp.num_kv_heads = kKvHeads;
  qp.head_dim = kHeadDim;
  qp.positions = static_cast<const int32_t*>(d_pos.data());
  qp.inv_freq = static_cast<const float*>(d_freq.data());
  qp.rotary_dim = kHeadDim;
  qp.k_cache = cache_k.data();
  qp.v_cache = cache_v.data();
  qp.slot_mapping = static_cast<const int64_t*>(d_slots.data());
  DINFER_ASSIGN_OR_RETURN(ms, TimeMs(s, 2, 10, [&] {
                            return cuda::CudaStatus(kc::QkvRopeKvWrite(qp, s.get()), "qkv");
                          }));
  t.Add("qkv rope + kv write 16384 tokens", ms,
        n * (qkv_width * 2.0 + kHeads * kHeadDim * 2 + 2 * kKvHeads * kHeadDim * 2), 0);
  return OkStatus();
}

}  // namespace

StatusOr<json::object> KernelBench(const cuda::Stream& stream, const Limits& limits,
                                   int multiprocessors, const std::string& only) {
  Table t{limits, {}};
  auto want = [&](const char* section) {
    return std::string(section).find(only) != std::string::npos;
  };
  if (want("gemm")) DINFER_RETURN_IF_ERROR(GemmRows(stream, t));
  if (want("fp8 gemm")) DINFER_RETURN_IF_ERROR(Fp8GemmRows(stream, t));
  if (want("attention")) {
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 64, 2048, false, multiprocessors));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 256, 1536, false, multiprocessors));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 1, 32768, false, multiprocessors));
    // Batch-1 decode at the model benchmark's context and a longer one (latency, not bytes).
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 1, 272, false, multiprocessors));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 1, 4096, false, multiprocessors));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 8, 2048, true, multiprocessors));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 64, 2048, false, multiprocessors, true));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 256, 1536, false, multiprocessors, true));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 1, 32768, false, multiprocessors, true));
    DINFER_RETURN_IF_ERROR(AttentionRows(stream, t, 8, 2048, true, multiprocessors, true));
    // The same caches with the blocks in a shuffled order.
    for (bool fp8 : {false, true}) {
      DINFER_RETURN_IF_ERROR(
          AttentionRows(stream, t, 256, 1536, false, multiprocessors, fp8, /*shuffled=*/true));
      DINFER_RETURN_IF_ERROR(
          AttentionRows(stream, t, 64, 2048, false, multiprocessors, fp8, /*shuffled=*/true));
    }
  }
  if (want("elementwise")) DINFER_RETURN_IF_ERROR(ElementwiseRows(stream, t));
  return json::object{{"rows", std::move(t.rows)}};
}

}  // namespace dinfer::bench
