// Kernel timeline records (a diagnostic build): with the CMake option DINFER_KERNEL_TRACE, the
// decode GEMVs and the decode attention record, for each CTA, when it started, when its wait for
// the kernel before it (programmatic dependent launch) returned, when it reached two points of
// its own (the GEMV: its input staged, its weights read; the attention: its keys done, its
// partial rows merged across warps, before the merge of splits) and when it ended, on the GPU's
// global timer (common to all multiprocessors), into a buffer that TraceAttach names. This
// shows where a replayed CUDA graph's time goes between and inside its kernels, which a profiler
// that serialises kernels cannot. Other builds carry no trace code: TraceBuilt() is false and
// TraceAttach returns cudaErrorNotSupported.
#pragma once

#include <cstdint>

namespace dinfer::kernels::cuda {

struct TraceRecord {
  uint64_t start_ns;   // global timer at the CTA's first instruction
  uint64_t waited_ns;  // after its wait for the kernel before (start_ns where it has none)
  uint64_t mark_ns;    // a point the kernel names (see below; waited_ns if none)
  uint64_t mark2_ns;   // a second one (mark_ns if none)
  uint64_t end_ns;     // when its thread 0 finished
  uint32_t kernel;     // TraceKernel bits
  uint32_t block;      // linear CTA index
  uint32_t grid;       // CTAs in the launch
  uint32_t sm;         // the multiprocessor it ran on
};

// Kernel ids: the family in the high byte, variant bits below.
enum TraceKernel : uint32_t {
  kTraceGemv = 1u << 24,             // the staged decode GEMV (gemv_fused.cu)
  kTraceDecodeAttention = 2u << 24,  // paged decode attention (attention_decode.cu)
  kTraceGemvRows2 = 1u << 0,         // GEMV: two input rows
  kTraceGemvNorm = 1u << 1,          // GEMV: RMSNorm in front
  kTraceGemvQkv = 1u << 3,           // GEMV: the q/k/v rope + KV write epilogue
  kTraceFp8 = 1u << 4,               // e4m3 weights (GEMV) or cache (attention)
  kTraceGemvF32Out = 1u << 5,        // GEMV: f32 output
  kTraceAttentionCluster = 1u << 6,  // attention: splits merged in a cluster
  kTraceGemvSiluPairs = 1u << 8,     // GEMV: the SiLU·mul epilogue
};
// "gemv norm qkv", "attention fp8 cluster", ... (static storage).
const char* TraceKernelName(uint32_t kernel);

struct TraceSink {
  TraceRecord* records = nullptr;  // device memory, `capacity` records
  uint32_t* count = nullptr;       // device counter of records claimed (may pass capacity)
  uint32_t capacity = 0;
};

bool TraceBuilt();
// Points every instrumented kernel at `sink` (a null `records` detaches); kernels read it when
// they run, so graphs captured before keep recording into the current sink. Not synchronised
// with kernels in flight: attach and detach between synchronisations.
int TraceAttach(const TraceSink& sink);

// Each CUDA translation unit with instrumented kernels registers the setter of its own copy of
// the sink (device variables are per unit without relocatable device code).
bool RegisterTraceUnit(int (*set_sink)(const TraceSink&));

}  // namespace dinfer::kernels::cuda
