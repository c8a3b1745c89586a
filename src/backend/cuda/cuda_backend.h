// CudaBackend: one CUDA device — memory, streams, events, and copies, with CUDA errors turned into
// Status values. Thread-safety: a backend may be shared; each stream is used by one thread at a
// time.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace dinfer::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
};

// Number of visible CUDA devices; 0 when there is no driver or no GPU (never an error).
int DeviceCount();
StatusOr<DeviceInfo> GetDeviceInfo(int device);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Status CopyFromHost(const void* src, size_t bytes);
  Status CopyToHost(void* dst, size_t bytes) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

Status Synchronize();

}  // namespace dinfer::cuda
