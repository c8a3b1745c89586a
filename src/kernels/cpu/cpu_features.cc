#include "kernels/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace dinfer::kernels::cpu {
namespace {

#if defined(__x86_64__)
// XCR0 tells whether the OS saves the vector registers on context switches.
uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  uint32_t eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  if (!osxsave) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  const bool avx = ((ecx >> 28) & 1) && ymm_state;
  f.fma = avx && ((ecx >> 12) & 1);
  f.f16c = avx && ((ecx >> 29) & 1);
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = avx && ((ebx >> 5) & 1);
  f.avx512f = zmm_state && ((ebx >> 16) & 1);
  f.avx512bw = f.avx512f && ((ebx >> 30) & 1);
  f.avx512vl = f.avx512f && ((ebx >> 31) & 1);
  f.avx512vnni = f.avx512f && ((ecx >> 11) & 1);
  const bool avx512dq = f.avx512f && ((ebx >> 17) & 1);
  if (!avx512dq) f.avx512f = false;  // the AVX-512 kernels are built with -mavx512dq as well
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  f.avx512bf16 = f.avx512f && ((eax >> 5) & 1);
#endif
  return f;
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa Clamp(Isa isa) {
  const Isa best = BestIsa();
  return static_cast<int>(isa) > static_cast<int>(best) ? best : isa;
}

Isa InitialIsa() {
  const char* env = std::getenv("DINFER_CPU_ISA");
  if (env == nullptr) return BestIsa();
  const std::string_view name(env);
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Clamp(Isa::kAvx2);
  return BestIsa();
}

std::atomic<Isa>& ActiveIsaSlot() {
  static std::atomic<Isa> slot{InitialIsa()};
  return slot;
}

std::atomic<bool>& VnniSlot() {
  static std::atomic<bool> slot{GetCpuFeatures().avx512vnni};
  return slot;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

bool IsaSupported(Isa isa) {
  const CpuFeatures& f = GetCpuFeatures();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512:
      return avx2 && f.avx512f && f.avx512bw && f.avx512vl;
  }
  return false;
}

Isa ActiveIsa() { return ActiveIsaSlot().load(std::memory_order_relaxed); }

void SetIsaForTesting(Isa isa) { ActiveIsaSlot().store(Clamp(isa), std::memory_order_relaxed); }

bool UseAvx512Vnni() { return VnniSlot().load(std::memory_order_relaxed); }

void SetAvx512VnniForTesting(bool enabled) {
  VnniSlot().store(enabled && GetCpuFeatures().avx512vnni, std::memory_order_relaxed);
}

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

}  // namespace dinfer::kernels::cpu
