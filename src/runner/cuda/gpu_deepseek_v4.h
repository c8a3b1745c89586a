// GpuDeepseekV4: the forward pass of DeepSeek-V4 (archs/deepseek_v4.h) on one CUDA device, with
// bf16 weights (FP8 / FP4 checkpoint weights are dequantised on the way) and the paged KV planes
// of layers::DeepseekV4LayerPlanes (window keys and compressed entries bf16, compressor states
// f32) in the KV groups of layers::DeepseekV4KvGroups. A layer:
//   HcPre (mixes, Sinkhorn, collapse, RMSNorm) → one GEMM for every projection of the normed
//   input (wq_a, wkv, both compressors' wkv / wgate, the indexer's weights_proj; f32 out) →
//   q_norm → one GEMM for wq_b and the indexer's wq_b → per-head norm and rotary of q, norm and
//   rotary of the key → compressors (pool, norm, rotate, store entries) → indexer top-k →
//   sparse attention over window + compressed entries with sinks, inverse rotary → grouped wo_a
//   → wo_b → HcPost → HcPre → router GEMM and routing (scores or hash) → permute → grouped
//   expert GEMMs with the clamped SwiGLU → shared expert → combine → HcPost.
// The residual is hc_mult f32 streams per token. The MTP layer (ForwardDraft) drafts from the
// final streams of the step before. Activation buffers have fixed addresses (graph replay).
// Thread-safety: Forward enqueues on one stream; one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/device_tensor.h"
#include "kernels/cuda/gemm.h"
#include "runner/cuda/gpu_model.h"

namespace dinfer {

class DeepseekV4Model;

class GpuDeepseekV4 final : public GpuModel {
 public:
  // Copies a DeepSeek-V4 model's weights (the main layers) to the current device as bf16.
  static StatusOr<std::unique_ptr<GpuDeepseekV4>> Upload(const DeepseekV4Model& model);
  // bf16 weights of a config's shapes, random, made on the device (speed benchmarks).
  static StatusOr<std::unique_ptr<GpuDeepseekV4>> Random(const ModelConfig& config, uint64_t seed);

  KvLayout KvLayoutFor(int64_t block_size, DType kv_dtype) const override;
  std::vector<KvGroup> KvGroupsFor(int64_t block_size) const override;
  bool dense_attention() const override { return false; }
  Status Reserve(int64_t max_tokens, int64_t max_logits, int64_t max_split_cells,
                 int64_t max_seq_len) override;
  Status Forward(const GpuStep& step, const GpuKvCache& kv, float* logits, void* stream) override;
  // The MTP layer (the first, when the checkpoint has several; its KV planes are layer
  // num_layers): reads the final streams the last Forward left in place.
  bool has_draft_layer() const override { return mtp_ != nullptr; }
  Status ForwardDraft(const GpuStep& step, const GpuKvCache& kv, float* logits,
                      void* stream) override;

  // Bytes of weights one token reads at batch 1: every matrix but the routed experts, plus
  // experts_per_token of them per layer (the v4_decode_b1 roofline).
  int64_t token_weight_bytes() const { return token_weight_bytes_; }

 private:
  struct HcWeights {
    cuda::DeviceTensor fn, base, scale;  // f32
  };
  struct Compressor {
    cuda::DeviceTensor ape, norm;  // f32 [rate, width], [dim]
    int64_t dim = 0, rate = 0, width = 0;
    bool overlap = false;
    int64_t col = 0;  // its kv columns in the projection output; the gate's follow
  };
  struct Layer {
    V4Attention kind = V4Attention::kSliding;
    cuda::DeviceTensor attn_norm, ffn_norm, q_norm, kv_norm, sinks;  // f32
    HcWeights hc_attn, hc_ffn;
    // [wq_a; wkv; compressor wkv, wgate; indexer compressor wkv, wgate; indexer weights_proj]
    cuda::DeviceTensor x_proj;
    cuda::DeviceTensor q_proj;  // [wq_b; indexer wq_b]
    cuda::DeviceTensor wo_a, wo_b;
    std::optional<Compressor> comp, index_comp;
    int64_t x_cols = 0, q_cols = 0, index_weights_col = 0;
    // MoE: router, experts [E, 2 * inter, hidden] (w1 rows, then w3 rows) and [E, hidden, inter],
    // the shared expert likewise without the expert dimension.
    cuda::DeviceTensor gate;
    std::optional<cuda::DeviceTensor> gate_bias;  // f32
    cuda::DeviceBuffer tid2eid;                   // i32 [vocab, top_k]; empty: score routing
    cuda::DeviceTensor w13, w2;
    std::optional<cuda::DeviceTensor> shared_w13, shared_w2;
  };

  struct Mtp {
    Layer block;
    cuda::DeviceTensor e_proj, h_proj;      // bf16
    cuda::DeviceTensor enorm, hnorm, norm;  // f32
    HcWeights head;
  };

  explicit GpuDeepseekV4(const ModelConfig& config) : GpuModel(config, DType::kBF16) {}
  // Column layout of a layer's projections, and its byte counts (`main`: a layer every token
  // reads, not the draft layer).
  void Finish(Layer& l, bool main);
  StatusOr<Layer> UploadBlock(const DeepseekV4Model& model, size_t index, bool mtp);
  // y[m, n] = x[m, k] · wᵀ (bf16 in), `out` f32 or bf16; ld* in elements.
  Status Gemm(const void* x, int64_t ldx, const void* w, int64_t n, int64_t k, void* y, int64_t ldy,
              int64_t m, DType out, void* stream);
  // A step within what Reserve sized the buffers for.
  Status CheckStep(const GpuStep& step) const;
  // out[t, c * hidden ...] = the embedding of step token t, for each of `copies` copies.
  Status Embed(const GpuStep& step, float* out, int64_t copies, void* stream);
  Status RunLayer(const Layer& l, int64_t layer, const GpuStep& step, const GpuKvCache& kv,
                  void* stream);
  Status RunMoe(const Layer& l, const GpuStep& step, void* stream);
  // Logits of the step's logits rows of the final streams (streams_a_).
  Status Head(const HcWeights& hc_head, const cuda::DeviceTensor& norm, const GpuStep& step,
              float* logits, void* stream);

  std::vector<Layer> layers_;
  std::unique_ptr<Mtp> mtp_;
  cuda::DeviceTensor embed_, lm_head_, final_norm_;
  HcWeights hc_head_;
  cuda::DeviceTensor inv_freq_main_, inv_freq_compress_;
  std::unique_ptr<kernels::cuda::GemmRunner> gemm_;
  int64_t token_weight_bytes_ = 0;
  int64_t x_cols_max_ = 0, q_cols_max_ = 0;

  cuda::DeviceArena arena_;
  int64_t max_seq_len_ = 0, max_entries_ = 0;
  float *streams_a_ = nullptr, *streams_b_ = nullptr, *post_ = nullptr, *comb_ = nullptr;
  void* normed_ = nullptr;       // bf16 [tokens, hidden]
  float* x_out_ = nullptr;       // [tokens, x_cols_max_]
  void* qr_ = nullptr;           // bf16 [tokens, q_lora_rank]
  float* q_out_ = nullptr;       // [tokens, q_cols_max_]
  int32_t* selected_ = nullptr;  // [tokens, index_topk]
  float* index_ws_ = nullptr;
  float* attn_ws_ = nullptr;
  void* attn_ = nullptr;     // bf16 [tokens, heads * head_dim]
  void* grouped_ = nullptr;  // bf16 [tokens, o_groups * o_lora_rank]
  float* branch_ = nullptr;  // [tokens, hidden]
  float* router_ = nullptr;  // [tokens, experts]
  int32_t* experts_ = nullptr;
  float* expert_weights_ = nullptr;
  int32_t *offsets_ = nullptr, *row_token_ = nullptr, *pair_row_ = nullptr, *plan_ws_ = nullptr;
  int32_t* active_ = nullptr;    // the experts with rows, then their count (MoePlan)
  float* gate_up_ = nullptr;     // [tokens * top_k, 2 * inter]
  void* act_ = nullptr;          // bf16 [tokens * top_k, inter]
  float* expert_out_ = nullptr;  // [tokens * top_k, hidden]
  float* shared_gate_up_ = nullptr;
  void* shared_act_ = nullptr;
  float* shared_out_ = nullptr;
  void* head_rows_ = nullptr;  // bf16 [logits, hidden]
  // The draft layer: e_proj's output, the hnorm'd streams, and HcPost's weights that add the
  // former to each stream (post 1, comb the identity).
  float* mtp_e_ = nullptr;    // [tokens, hidden]
  void* mtp_rows_ = nullptr;  // bf16 [tokens * hc, hidden]
  cuda::DeviceTensor ones_, eye_;
  float* hc_ws_ = nullptr;  // HcPre / HcHead partials at decode (kc::HcWorkspaceFloats)
};

}  // namespace dinfer
