// CPU feature detection and the choice of instruction set for the CPU kernels.
// Features are detected once (thread-safe static init). The active ISA is a process-wide
// setting read with a relaxed atomic: change it (SetIsaForTesting) only while no kernel runs.
#pragma once

#include <string_view>

namespace dinfer::kernels::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
};

const CpuFeatures& GetCpuFeatures();

// Instruction sets the kernels are built for. kAvx2 needs AVX2+FMA+F16C; kAvx512 needs
// AVX-512 F/BW/VL/DQ on top of kAvx2 and uses VNNI dot products where the CPU has them.
enum class Isa { kScalar, kAvx2, kAvx512 };

bool IsaSupported(Isa isa);
// The best supported ISA, lowered by env DINFER_CPU_ISA=scalar|avx2|avx512 (read once) or by
// SetIsaForTesting. Never an ISA the CPU lacks.
Isa ActiveIsa();
// Selects `isa`, clamped to the best supported one.
void SetIsaForTesting(Isa isa);
std::string_view IsaName(Isa isa);

// Whether the kAvx512 kernels use VNNI (vpdpbusd): the CPU has it and tests did not turn it off.
bool UseAvx512Vnni();
// Turns VNNI off (false) or back on where supported (true), to test the AVX-512BW fallback.
void SetAvx512VnniForTesting(bool enabled);

}  // namespace dinfer::kernels::cpu
