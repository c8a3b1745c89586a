// Copying checkpoint weights (host TensorViews of f32, f16, bf16 or a quantized block format) to
// device matrices of the CUDA models, dequantising block formats on the way.
#pragma once

#include <initializer_list>
#include <span>
#include <vector>

#include "backend/cuda/device_tensor.h"

namespace dinfer::cuda {

// One device matrix of `dtype` (f32 or bf16) holding the given weights' rows one after the other
// (all with as many columns).
StatusOr<DeviceTensor> UploadRows(std::span<const TensorView* const> parts, DType dtype);
inline StatusOr<DeviceTensor> UploadRows(std::initializer_list<const TensorView*> parts,
                                         DType dtype) {
  return UploadRows(std::span<const TensorView* const>(parts.begin(), parts.size()), dtype);
}
// Copies the rows of a weight into rows [row_offset, ...) of a device matrix.
Status CopyWeightRows(const TensorView& w, DeviceTensor& dst, int64_t row_offset);
StatusOr<DeviceTensor> UploadF32(const std::vector<float>& v);
// Bytes of a device tensor.
inline int64_t Bytes(const DeviceTensor& t) { return t.view().nbytes(); }

}  // namespace dinfer::cuda
