// TensorView: a non-owning view (dtype, shape, row-major strides, data pointer, device).
// Tensor: an owning, 64-byte aligned host buffer with a view. No math lives here.
// Views are plain values; the memory they point to must outlive them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dinfer {

enum class Device : uint8_t { kCpu, kCuda };

inline constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  // Strides in elements for plain dtypes; rows of quantized tensors are contiguous and
  // stride[ndim-2] counts elements as well (bytes = RowBytes(dtype, stride)).
  std::array<int64_t, kMaxDims> stride{};

  static TensorView Make(void* data, DType dtype, std::initializer_list<int64_t> shape,
                         Device device = Device::kCpu);
  static TensorView Make(void* data, DType dtype, const std::vector<int64_t>& shape,
                         Device device = Device::kCpu);

  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const;
  int64_t nbytes() const;  // of the contiguous extent
  bool contiguous() const;
  // Rows of the last dimension as a 2-D view (all leading dims flattened).
  int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[ndim - 1]; }
  int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
  // Pointer to row r of the flattened 2-D view (contiguous tensors).
  uint8_t* row_ptr(int64_t r) const {
    return static_cast<uint8_t*>(data) + r * RowBytes(dtype, cols());
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // A view of rows [begin, end) of the flattened 2-D view.
  TensorView Rows(int64_t begin, int64_t end) const;
  std::string ShapeString() const;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor Empty(DType dtype, const std::vector<int64_t>& shape);
  static Tensor Zeros(DType dtype, const std::vector<int64_t>& shape);

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  operator const TensorView&() const { return view_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(view_.data);
  }
  bool empty() const { return view_.data == nullptr; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> buffer_;
  TensorView view_;
};

}  // namespace dinfer
