// DeviceTensor: an owning device allocation with a TensorView (device kCuda) over it; weights and
// long-lived buffers of the CUDA path. Upload converts host tensors to the device dtype.
// Thread-safety: a movable value; uploads are synchronous.
#pragma once

#include <vector>

#include "backend/cuda/memory.h"
#include "tensor/tensor.h"

namespace dinfer::cuda {

class DeviceTensor {
 public:
  DeviceTensor() = default;
  static StatusOr<DeviceTensor> Empty(DType dtype, const std::vector<int64_t>& shape);
  // Copies a contiguous host tensor of f32, f16 or bf16 to the device as `dtype` (f32 or bf16).
  static StatusOr<DeviceTensor> Upload(const TensorView& host, DType dtype);
  // Copies the rows of a contiguous host tensor (f32, f16 or bf16; as many columns as this one)
  // into rows [row_offset, row_offset + host rows), converting to this tensor's dtype in chunks
  // (no host copy of the whole tensor).
  Status CopyRowsFromHost(const TensorView& host, int64_t row_offset);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  void* data() const { return view_.data; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(view_.data);
  }
  bool empty() const { return view_.data == nullptr; }

 private:
  DeviceBuffer buffer_;
  TensorView view_;
};

}  // namespace dinfer::cuda
