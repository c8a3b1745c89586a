// Device side of the kernel timeline records (trace.h): a kernel declares
//   CtaTrace trace(kTraceGemv | ...);
// at its start, calls trace.Waited() after WaitForPrerequisites and may call trace.Mark() and
// trace.Mark2() at points of its own (trace.h says which); thread 0 writes the CTA's
// record when `trace` goes out of scope. Without DINFER_KERNEL_TRACE this compiles to nothing.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/trace.h"

namespace dinfer::kernels::cuda {

#if DINFER_KERNEL_TRACE
namespace {
__device__ TraceSink g_trace_sink;  // this translation unit's copy
int SetThisUnitsTraceSink(const TraceSink& sink) {
  return static_cast<int>(cudaMemcpyToSymbol(g_trace_sink, &sink, sizeof sink));
}
[[maybe_unused]] const bool g_trace_unit_registered = RegisterTraceUnit(&SetThisUnitsTraceSink);
}  // namespace

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

class CtaTrace {
 public:
  __device__ explicit CtaTrace(uint32_t kernel) : kernel_(kernel), start_(GlobalTimerNs()) {}
  __device__ void Waited() { waited_ = GlobalTimerNs(); }
  __device__ void Mark() { mark_ = GlobalTimerNs(); }
  __device__ void Mark2() { mark2_ = GlobalTimerNs(); }
  __device__ ~CtaTrace() {
    if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0) return;
    const TraceSink s = g_trace_sink;
    if (s.records == nullptr) return;
    const uint64_t end = GlobalTimerNs();
    const uint32_t i = atomicAdd(s.count, 1u);
    if (i >= s.capacity) return;
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const uint64_t waited = waited_ ? waited_ : start_;
    const uint64_t mark = mark_ ? mark_ : waited;
    s.records[i] = TraceRecord{start_, waited,  mark,  mark2_ ? mark2_ : mark,
                               end,    kernel_, block, gridDim.x * gridDim.y * gridDim.z,
                               sm};
  }

 private:
  uint32_t kernel_;
  uint64_t start_, waited_ = 0, mark_ = 0, mark2_ = 0;
};
#else
class CtaTrace {
 public:
  __device__ explicit CtaTrace(uint32_t) {}
  __device__ void Waited() {}
  __device__ void Mark() {}
  __device__ void Mark2() {}
};
#endif

}  // namespace dinfer::kernels::cuda
