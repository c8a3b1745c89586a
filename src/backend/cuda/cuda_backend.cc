#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

namespace dinfer::cuda {
namespace {

Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return Internal("{}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

StatusOr<DeviceInfo> GetDeviceInfo(int device) {
  cudaDeviceProp prop{};
  DINFER_RETURN_IF_ERROR(
      FromCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  return info;
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  DINFER_RETURN_IF_ERROR(FromCuda(cudaMalloc(&b.ptr_, bytes), "cudaMalloc"));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > bytes_)
    return InvalidArgument("copy of {} bytes into a {}-byte buffer", bytes, bytes_);
  return FromCuda(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_)
    return InvalidArgument("copy of {} bytes from a {}-byte buffer", bytes, bytes_);
  return FromCuda(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

Status Synchronize() { return FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace dinfer::cuda
