#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dinfer {

TensorView TensorView::Make(void* data, DType dtype, const std::vector<int64_t>& shape,
                            Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.stride[i] = s;
    s *= shape[i];
  }
  return v;
}

TensorView TensorView::Make(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            Device device) {
  return Make(data, dtype, std::vector<int64_t>(shape), device);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t TensorView::nbytes() const { return rows() * RowBytes(dtype, cols()); }

bool TensorView::contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

TensorView TensorView::Rows(int64_t begin, int64_t end) const {
  TensorView v = Make(row_ptr(begin), dtype, {end - begin, cols()}, device);
  return v;
}

std::string TensorView::ShapeString() const {
  std::vector<int64_t> s(shape.begin(), shape.begin() + ndim);
  return fmt::format("[{}]", fmt::join(s, ", "));
}

void Tensor::Free::operator()(void* p) const { std::free(p); }

Tensor Tensor::Empty(DType dtype, const std::vector<int64_t>& shape) {
  Tensor t;
  t.view_ = TensorView::Make(nullptr, dtype, shape);
  const size_t bytes = static_cast<size_t>(t.view_.nbytes());
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  t.buffer_.reset(p);
  t.view_.data = p;
  return t;
}

Tensor Tensor::Zeros(DType dtype, const std::vector<int64_t>& shape) {
  Tensor t = Empty(dtype, shape);
  std::memset(t.view_.data, 0, static_cast<size_t>(t.view_.nbytes()));
  return t;
}

}  // namespace dinfer
