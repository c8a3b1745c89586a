#include "kernels/cuda/trace.h"

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

namespace dinfer::kernels::cuda {
namespace {

struct Units {
  std::mutex mu;
  std::vector<int (*)(const TraceSink&)> setters;
};
Units& TraceUnits() {
  static Units u;
  return u;
}

}  // namespace

bool RegisterTraceUnit(int (*set_sink)(const TraceSink&)) {
  Units& u = TraceUnits();
  std::lock_guard lock(u.mu);
  u.setters.push_back(set_sink);
  return true;
}

bool TraceBuilt() {
#if DINFER_KERNEL_TRACE
  return true;
#else
  return false;
#endif
}

int TraceAttach(const TraceSink& sink) {
  if (!TraceBuilt()) return cudaErrorNotSupported;
  Units& u = TraceUnits();
  std::lock_guard lock(u.mu);
  for (auto* set : u.setters) {
    if (const int err = set(sink); err != 0) return err;
  }
  return 0;
}

const char* TraceKernelName(uint32_t kernel) {
  // Names of every id the instrumented kernels use, made once.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v(1u << 9);
    for (uint32_t bits = 0; bits < v.size(); ++bits) {
      std::string s = "gemv";
      if (bits & kTraceGemvRows2) s += " m2";
      if (bits & kTraceGemvNorm) s += " norm";
      if (bits & kTraceGemvQkv) s += " qkv";
      if (bits & kTraceFp8) s += " fp8";
      if (bits & kTraceGemvF32Out) s += " f32";
      if (bits & kTraceGemvSiluPairs) s += " silu-out";
      v[bits] = s;
    }
    return v;
  }();
  static const char* kAttention[4] = {"attention", "attention fp8", "attention cluster",
                                      "attention fp8 cluster"};
  const uint32_t family = kernel >> 24, bits = kernel & 0xffffffu;
  if (family == (kTraceGemv >> 24) && bits < names.size()) return names[bits].c_str();
  if (family == (kTraceDecodeAttention >> 24)) {
    return kAttention[((bits & kTraceFp8) ? 1 : 0) + ((bits & kTraceAttentionCluster) ? 2 : 0)];
  }
  return "unknown";
}

}  // namespace dinfer::kernels::cuda
