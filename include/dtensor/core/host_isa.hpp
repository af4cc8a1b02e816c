#pragma once
// The vector instruction sets the host code may choose at run time, and which one this
// CPU offers.
//
// A header-only library is compiled for its user's target, usually baseline x86-64
// (SSE2), while PyTorch and oneDNN pick AVX-512 or AVX2 kernels at run time. The few
// host loops where that difference is most of a step (the 16-bit conversions,
// core/float16_arrays.hpp; GELU, compute/gelu_host.hpp) are compiled a second time for
// the wider sets with GCC's target attribute, and call the best one host_isa() names.
// Elsewhere (other architectures, CUDA translation units) only the plain loop exists.
#include <cstdlib>
#include <string_view>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
#define DTENSOR_HOST_ISA_X86 1
#include <cpuid.h>
#else
#define DTENSOR_HOST_ISA_X86 0
#endif

// The two sets of definitions (with and without the x86 paths: a CUDA translation unit
// sees the latter) live in inline namespaces of their own, so that one program holding
// both links each call to its own and no inline function has two meanings.
#if DTENSOR_HOST_ISA_X86
#define DTENSOR_HOST_ISA_ABI host_x86
#else
#define DTENSOR_HOST_ISA_ABI host_portable
#endif

namespace dtensor::detail {
inline namespace DTENSOR_HOST_ISA_ABI {

// Best first: AVX-512 (F, BW, VL, with FMA and F16C), AVX2 (with FMA and F16C), the
// build's own target.
enum class HostIsa { Avx512, Avx2, Plain };

// The best this CPU offers, or a lesser one the environment names (DTENSOR_HOST_ISA=avx2
// or plain, as oneDNN's ONEDNN_MAX_CPU_ISA: to compare the paths in one build; it never
// raises the CPU's). Read once per process.
inline HostIsa host_isa() {
#if DTENSOR_HOST_ISA_X86
  static const HostIsa isa = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // F16C by CPUID (clang's __builtin_cpu_supports lacks it)
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    HostIsa best = HostIsa::Plain;
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      best = HostIsa::Avx512;
    else if (avx2)
      best = HostIsa::Avx2;
    const char* asked = std::getenv("DTENSOR_HOST_ISA");
    const std::string_view a = asked ? asked : "";
    const HostIsa cap = a == "plain" ? HostIsa::Plain : a == "avx2" ? HostIsa::Avx2 : HostIsa::Avx512;
    return static_cast<int>(cap) > static_cast<int>(best) ? cap : best;
  }();
  return isa;
#else
  return HostIsa::Plain;
#endif
}

inline const char* name(HostIsa isa) {
  return isa == HostIsa::Avx512 ? "avx512" : isa == HostIsa::Avx2 ? "avx2" : "plain";
}

}  // namespace DTENSOR_HOST_ISA_ABI
}  // namespace dtensor::detail
