#include "backend/cuda/device.h"

#include <cuda_runtime.h>

namespace dinfer::cuda {

Status CudaStatus(int error, std::string_view what) {
  if (error == cudaSuccess) return OkStatus();
  const auto e = static_cast<cudaError_t>(error);
  return Internal("{}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

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
  DINFER_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "device properties"));
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  return info;
}

StatusOr<int> CurrentDevice() {
  int device = 0;
  DINFER_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  return device;
}

Status Synchronize() { return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace dinfer::cuda
