#include "backend/cuda/memory.h"

#include <cuda_runtime.h>

#include "backend/cuda/device.h"

namespace dinfer::cuda {

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t e = cudaMalloc(&b.ptr_, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return MakeError(StatusCode::kResourceExhausted, "out of device memory allocating {} MiB",
                     bytes >> 20);
  }
  DINFER_RETURN_IF_ERROR(CudaStatus(e, "cudaMalloc"));
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

Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) {
    return InvalidArgument("copy of {} bytes at {} into a {}-byte buffer", bytes, offset, bytes_);
  }
  return CudaStatus(
      cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice),
      "copy to device");
}

Status DeviceBuffer::CopyToHost(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) {
    return InvalidArgument("copy of {} bytes at {} from a {}-byte buffer", bytes, offset, bytes_);
  }
  return CudaStatus(
      cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost),
      "copy to host");
}

StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  DINFER_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&b.ptr_, bytes), "cudaMallocHost"));
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

StatusOr<DeviceArena> DeviceArena::Create(size_t bytes) {
  DeviceArena a;
  DINFER_ASSIGN_OR_RETURN(a.buffer_, DeviceBuffer::Allocate(bytes));
  return a;
}

void* DeviceArena::Allocate(size_t bytes) {
  const size_t begin = (used_ + kAlignment - 1) / kAlignment * kAlignment;
  if (begin + bytes > buffer_.bytes()) return nullptr;
  used_ = begin + bytes;
  return static_cast<char*>(buffer_.data()) + begin;
}

Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes, const Stream& stream) {
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream.get()),
                    "async copy to device");
}

Status CopyToHostAsync(void* dst, const void* src, size_t bytes, const Stream& stream) {
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream.get()),
                    "async copy to host");
}

Status CopyOnDeviceAsync(void* dst, const void* src, size_t bytes, const Stream& stream) {
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream.get()),
                    "async copy on device");
}

}  // namespace dinfer::cuda
