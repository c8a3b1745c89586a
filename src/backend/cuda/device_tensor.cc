#include "backend/cuda/device_tensor.h"

#include <algorithm>

#include "base/half.h"

namespace dinfer::cuda {

StatusOr<DeviceTensor> DeviceTensor::Empty(DType dtype, const std::vector<int64_t>& shape) {
  if (IsQuantized(dtype)) return Unimplemented("device tensors of {}", DTypeName(dtype));
  DeviceTensor t;
  t.view_ = TensorView::Make(nullptr, dtype, shape, Device::kCuda);
  DINFER_ASSIGN_OR_RETURN(t.buffer_, DeviceBuffer::Allocate(static_cast<size_t>(t.view_.nbytes())));
  t.view_.data = t.buffer_.data();
  return t;
}

namespace {

float ToF32(DType src, const void* base, int64_t i) {
  switch (src) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    default:
      return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
  }
}

}  // namespace

StatusOr<DeviceTensor> DeviceTensor::Upload(const TensorView& host, DType dtype) {
  std::vector<int64_t> shape(host.shape.begin(), host.shape.begin() + host.ndim);
  DINFER_ASSIGN_OR_RETURN(DeviceTensor t, Empty(dtype, shape));
  DINFER_RETURN_IF_ERROR(t.CopyRowsFromHost(host, 0));
  return t;
}

Status DeviceTensor::CopyRowsFromHost(const TensorView& host, int64_t row_offset) {
  if (host.device != Device::kCpu || !host.contiguous()) {
    return InvalidArgument("upload needs a contiguous host tensor, got {}", host.ShapeString());
  }
  if (host.dtype != DType::kF32 && host.dtype != DType::kF16 && host.dtype != DType::kBF16) {
    return Unimplemented("upload of {} tensors (dequantise first)", DTypeName(host.dtype));
  }
  const DType dtype = view_.dtype;
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return Unimplemented("device tensors of {}", DTypeName(dtype));
  }
  if (host.cols() != view_.cols() || row_offset < 0 || row_offset + host.rows() > view_.rows()) {
    return InvalidArgument("rows {} at {} do not fit device tensor {}", host.ShapeString(),
                           row_offset, view_.ShapeString());
  }
  const int64_t n = host.numel();
  const int64_t elem = dtype == DType::kF32 ? 4 : 2;
  const size_t dst = static_cast<size_t>(row_offset * view_.cols() * elem);
  if (host.dtype == dtype) {
    return buffer_.CopyFromHost(host.data, static_cast<size_t>(host.nbytes()), dst);
  }
  // Convert through a pinned staging chunk.
  constexpr int64_t kChunk = 1 << 22;
  DINFER_ASSIGN_OR_RETURN(PinnedBuffer stage,
                          PinnedBuffer::Allocate(static_cast<size_t>(std::min(n, kChunk) * elem)));
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t count = std::min(kChunk, n - begin);
    for (int64_t i = 0; i < count; ++i) {
      const float f = ToF32(host.dtype, host.data, begin + i);
      if (dtype == DType::kF32) {
        stage.as<float>()[i] = f;
      } else {
        stage.as<uint16_t>()[i] = F32ToBf16(f);
      }
    }
    DINFER_RETURN_IF_ERROR(buffer_.CopyFromHost(stage.data(), static_cast<size_t>(count * elem),
                                                dst + static_cast<size_t>(begin * elem)));
  }
  return OkStatus();
}

}  // namespace dinfer::cuda
