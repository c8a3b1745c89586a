// CUDA devices: discovery, properties, and CUDA errors as Status values. The backend's other
// headers (memory, streams, device tensors) build on these.
// Thread-safety: free functions, callable from any thread; a thread's current device is its own.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

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
StatusOr<int> CurrentDevice();

// A cudaError_t value (passed as int so that callers need no CUDA headers) as a Status naming
// `what`; OkStatus for cudaSuccess.
Status CudaStatus(int error, std::string_view what);

Status Synchronize();

}  // namespace dinfer::cuda
