// GpuDecoder: the forward pass of layers::DecoderModel (Llama, Qwen2/3, Mistral, SmolLM2) on one
// CUDA device. Weights are copied to the device as f32 or bf16, with q/k/v and gate/up fused into
// one matrix each; activations are the weights' dtype except the residual stream (f32). A layer is
// RMSNorm(+residual) → qkv GEMM → bias/qk-norm/rope/KV write → paged attention → o GEMM →
// RMSNorm(+residual) → gate/up GEMM → SiLU·mul → down GEMM. Steps of one or two tokens in bf16
// (bf16 or e4m3 layer weights) run each RMSNorm and the SiLU·mul inside the GEMV that reads their
// output (GemvFused), and
// (without per-head q/k norms) the rope and KV-cache write in the q/k/v GEMV's epilogue.
// The step's metadata (GpuStep) is device memory built by the runner once per step (the plan);
// every layer reads it (the run). Activation buffers have fixed addresses (graph replay).
// Thread-safety: Forward enqueues on one stream; one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/device_tensor.h"
#include "kernels/cuda/gemm.h"
#include "runner/cuda/gpu_model.h"

namespace dinfer::layers {
class DecoderModel;
}

namespace dinfer {

class GpuDecoder final : public GpuModel {
 public:
  // Copies a DecoderModel's weights to the current device as `dtype` (f32 or bf16); quantized
  // weights are dequantised on the way.
  static StatusOr<std::unique_ptr<GpuDecoder>> Upload(const layers::DecoderModel& model,
                                                      DType dtype);
  // bf16 weights of a config's shapes, uniform random, made on the device (speed benchmarks).
  static StatusOr<std::unique_ptr<GpuDecoder>> Random(const ModelConfig& config, uint64_t seed);

  // Replaces the layers' bf16 matrices (q/k/v, o, gate/up, down) by e4m3 with one f32 scale per
  // output channel (amax / 448); the embedding and the LM head stay bf16. Fused decode steps read
  // them in the staged GEMVs (bf16 inputs, the scale applied to each row's sum); other steps
  // quantize the activations per token and run FP8 GEMMs (cuBLASLt). Before Reserve.
  Status QuantizeWeightsFp8();
  bool fp8_weights() const { return fp8_weights_; }

  Status Reserve(int64_t max_tokens, int64_t max_logits, int64_t max_split_cells,
                 int64_t max_seq_len) override;
  Status Forward(const GpuStep& step, const GpuKvCache& kv, float* logits, void* stream) override;

  int64_t kv_dim() const { return config_.num_kv_heads * config_.head_dim; }

 private:
  struct Layer {
    cuda::DeviceTensor input_norm, post_norm;  // f32
    cuda::DeviceTensor qkv, o, gate_up, down;
    std::optional<cuda::DeviceTensor> qkv_bias, o_bias, q_norm, k_norm;  // f32
    // FP8 weights: per-output-channel scales of qkv, o, gate_up, down (f32 [rows]).
    std::optional<cuda::DeviceTensor> qkv_scale, o_scale, gate_up_scale, down_scale;
    int64_t sliding_window = 0;
    // An FP8 KV cache's scales calibrated in the checkpoint (0: the runner's scale).
    float k_scale = 0.0f, v_scale = 0.0f;
  };
  GpuDecoder(ModelConfig config, DType dtype) : GpuModel(std::move(config), dtype) {}
  // y = x · wᵀ; e4m3 weights (with their scales) quantize x per row into act8_ first.
  Status Gemm(const void* x, const cuda::DeviceTensor& w, void* y, int64_t m, DType out,
              void* stream, const std::optional<cuda::DeviceTensor>& w_scale = std::nullopt);
  // Decode steps of a few tokens fuse each RMSNorm (and the SiLU·mul) into the GEMV after it.
  bool FusedDecode(int64_t num_tokens) const;
  // RMSNorm(residual + add) fused into y = norm · wᵀ; `residual` moves to the buffer that
  // received the sums. With `qkv`, the GEMV also does the q/k/v epilogue (rope, KV-cache write).
  // e4m3 weights come with their per-row scales (w_scale).
  Status NormGemv(float*& residual, const void* add, const float* add_bias,
                  const cuda::DeviceTensor& norm_weight, const cuda::DeviceTensor& w, void* y,
                  int64_t m, DType out, const int32_t* rows_index, void* stream,
                  const kernels::cuda::GemvQkvEpilogue* qkv = nullptr,
                  const std::optional<cuda::DeviceTensor>& w_scale = std::nullopt,
                  bool silu_pairs = false);
  // The staged GEMV y = f(x) · wᵀ, f and x as set in `f`; e4m3 weights with their scales.
  Status StagedGemv(kernels::cuda::GemvFusedParams f, const cuda::DeviceTensor& w, void* y,
                    int64_t m, DType out, void* stream,
                    const std::optional<cuda::DeviceTensor>& w_scale = std::nullopt);

  float norm_weight_offset_ = 0.0f;
  float embed_scale_ = 1.0f;
  float attn_scale_ = 1.0f, softcap_ = 0.0f;
  cuda::DeviceTensor embed_, final_norm_, inv_freq_;
  std::optional<cuda::DeviceTensor> lm_head_;  // absent: tied to embed_
  std::vector<Layer> layers_;
  std::unique_ptr<kernels::cuda::GemmRunner> gemm_;

  cuda::DeviceArena arena_;
  int64_t max_split_cells_ = 0;
  float* hidden_ = nullptr;  // [max_tokens, hidden] f32 residual stream
  // Fused decode steps alternate the residual stream between hidden_ and this
  // ([kGemvFusedMaxRows, hidden]).
  float* hidden_alt_ = nullptr;
  void *normed_ = nullptr, *qkv_buf_ = nullptr, *attn_ = nullptr, *branch_ = nullptr;
  void *gate_up_ = nullptr, *act_ = nullptr, *last_ = nullptr;
  float *split_out_ = nullptr, *split_stats_ = nullptr;
  bool fp8_weights_ = false;
  void* act8_ = nullptr;        // FP8 weights: e4m3 activations [max_tokens, widest k]
  float* act_scale_ = nullptr;  // and their per-row scales [max_tokens]
};

}  // namespace dinfer
