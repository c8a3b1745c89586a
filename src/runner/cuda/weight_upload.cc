#include "runner/cuda/weight_upload.h"

#include <algorithm>
#include <numeric>

#include "kernels/cpu/ops.h"

namespace dinfer::cuda {

// Block formats are dequantised a few hundred rows at a time.
Status CopyWeightRows(const TensorView& w, DeviceTensor& dst, int64_t row_offset) {
  if (!IsQuantized(w.dtype)) return dst.CopyRowsFromHost(w, row_offset);
  const int64_t rows = w.dim(0), cols = w.dim(1);
  constexpr int64_t kRows = 256;
  Tensor buf = Tensor::Empty(DType::kF32, {std::min(kRows, rows), cols});
  std::vector<int32_t> ids;
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t n = std::min(kRows, rows - r0);
    ids.resize(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(r0));
    kernels::cpu::EmbeddingParams p;
    p.table = w.data;
    p.dtype = w.dtype;
    p.dim = cols;
    p.row_bytes = RowBytes(w.dtype, cols);
    p.vocab = rows;
    p.ids = ids.data();
    p.num_tokens = n;
    p.out = buf.data<float>();
    kernels::cpu::Embedding(p);
    DINFER_RETURN_IF_ERROR(dst.CopyRowsFromHost(
        TensorView::Make(buf.data<float>(), DType::kF32, {n, cols}), r0 + row_offset));
  }
  return OkStatus();
}

StatusOr<DeviceTensor> UploadRows(std::span<const TensorView* const> parts, DType dtype) {
  if (parts.empty()) return InvalidArgument("no weights to upload");
  int64_t rows = 0;
  const int64_t cols = parts.front()->dim(1);
  for (const TensorView* p : parts) {
    if (p->dim(1) != cols) {
      return InvalidArgument("weights of {} and {} columns in one matrix", cols, p->dim(1));
    }
    rows += p->dim(0);
  }
  DINFER_ASSIGN_OR_RETURN(DeviceTensor t, DeviceTensor::Empty(dtype, {rows, cols}));
  int64_t offset = 0;
  for (const TensorView* p : parts) {
    DINFER_RETURN_IF_ERROR(CopyWeightRows(*p, t, offset));
    offset += p->dim(0);
  }
  return t;
}

StatusOr<DeviceTensor> UploadF32(const std::vector<float>& v) {
  return DeviceTensor::Upload(
      TensorView::Make(const_cast<float*>(v.data()), DType::kF32, {static_cast<int64_t>(v.size())}),
      DType::kF32);
}

}  // namespace dinfer::cuda
