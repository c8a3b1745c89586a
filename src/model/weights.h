// WeightSource: named weights of a checkpoint, looked up by their HF names whatever the file format
// (GGUF names are translated). Weights stay in the memory mapping where the kernels can read them
// as they are; the few that must be f32 (norms, biases) are converted into owned buffers.
// Built once at load time; read-only afterwards, safe to share between threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"

namespace dinfer {

class WeightSource {
 public:
  static std::unique_ptr<WeightSource> FromSafetensors(std::unique_ptr<SafetensorsCheckpoint> ckpt,
                                                       std::string where);
  static std::unique_ptr<WeightSource> FromGguf(std::shared_ptr<const GgufFile> gguf);

  bool Has(const std::string& hf_name) const;
  // The weight as stored; errors name the missing tensor and the file.
  StatusOr<TensorView> Get(const std::string& hf_name) const;
  // Like Get, and checks the shape.
  StatusOr<TensorView> Get(const std::string& hf_name, std::initializer_list<int64_t> shape) const;
  // The weight converted to f32 (norm weights, biases); the copy lives as long as the source.
  StatusOr<TensorView> GetF32(const std::string& hf_name, std::initializer_list<int64_t> shape);

  // A linear layer's weight [out, in] as ops::Linear takes it: f32 / f16 / bf16 as stored, or a
  // block-scaled one as DeepSeek-V4 checkpoints ship it, repacked without changing a value (the
  // copy lives as long as the source):
  //   FP8: e4m3fn [out, in] with scales [ceil(out / block_rows), ceil(in / block_cols)] (UE8M0 or
  //        f32) in "<name>.scale" or "<name>.weight_scale_inv" -> f8_e4m3_b32;
  //   FP4: int8 [out, in / 2] holding two e2m1 codes per byte, element 2j in the low nibble, with
  //        UE8M0 scales [out, in / 32] -> mxfp4.
  // `name` ends in ".weight"; the scale names replace that suffix.
  StatusOr<TensorView> GetLinear(const std::string& name, int64_t out, int64_t in,
                                 int64_t block_rows = 128, int64_t block_cols = 128);

  const std::string& where() const { return where_; }

  // A second name to look a weight up by when the checkpoint lacks the first (an architecture
  // whose checkpoints come with two naming schemes sets it before loading).
  void SetFallbackName(std::function<std::string(const std::string&)> fallback) {
    fallback_ = std::move(fallback);
  }

 private:
  WeightSource() = default;
  std::string Translate(const std::string& hf_name) const;

  std::unique_ptr<SafetensorsCheckpoint> ckpt_;
  std::shared_ptr<const GgufFile> gguf_;
  std::string where_;
  std::vector<Tensor> owned_;
  std::function<std::string(const std::string&)> fallback_;
};

}  // namespace dinfer
