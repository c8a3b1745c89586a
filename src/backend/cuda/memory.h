// Device and pinned host memory: owning buffers, a bump arena for per-step activations, and
// synchronous and stream-ordered copies.
// DeviceBuffer: one cudaMalloc allocation (weights, KV cache, arenas: long-lived, so the CUDA
// allocator's cost is paid once). PinnedBuffer: page-locked host memory, which asynchronous
// copies need to overlap with device work. DeviceArena: sub-allocations from one buffer, made
// once; their addresses stay fixed, which CUDA graph replay needs.
// Thread-safety: buffers are movable values; an arena is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/stream.h"
#include "base/status.h"

namespace dinfer::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  Status CopyFromHost(const void* src, size_t bytes, size_t offset = 0);
  Status CopyToHost(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  ~PinnedBuffer();

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class DeviceArena {
 public:
  static constexpr size_t kAlignment = 256;
  DeviceArena() = default;
  static StatusOr<DeviceArena> Create(size_t bytes);

  // Null when the arena is full.
  void* Allocate(size_t bytes);

 private:
  DeviceBuffer buffer_;
  size_t used_ = 0;
};

// Stream-ordered copies; host memory should be pinned for them to be asynchronous.
Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes, const Stream& stream);
Status CopyToHostAsync(void* dst, const void* src, size_t bytes, const Stream& stream);
Status CopyOnDeviceAsync(void* dst, const void* src, size_t bytes, const Stream& stream);

}  // namespace dinfer::cuda
