#include "model/layers/workspace.h"

#include <algorithm>

namespace dinfer::layers {

TensorView Workspace::Get(int slot, int64_t rows, int64_t cols, DType dtype) {
  if (static_cast<int>(buffers_.size()) <= slot) buffers_.resize(static_cast<size_t>(slot) + 1);
  Tensor& t = buffers_[slot];
  const int64_t bytes = rows * RowBytes(dtype, cols);
  if (t.empty() || t.view().nbytes() < bytes) {
    t = Tensor::Empty(DType::kF32, {std::max<int64_t>(1, (bytes + 3) / 4)});
  }
  return TensorView::Make(t.view().data, dtype, {rows, cols});
}

}  // namespace dinfer::layers
