# The cpu backend: generic C kernels always; x86 ISA files each compiled with their own flags
# (the rest of the library stays at the baseline) and chosen at run time after CPUID + XGETBV.
# AArch64: the NEON file (baseline flags; Advanced SIMD is always there).
include(CheckCCompilerFlag)
set(PA_CPU_DIR ${CMAKE_CURRENT_LIST_DIR})
set(PA_CPU_SOURCES_BEFORE ${PA_SOURCES})
list(APPEND PA_SOURCES
  ${PA_CPU_DIR}/cpu_backend.c
  ${PA_CPU_DIR}/cpu_pool.c
  ${PA_CPU_DIR}/cpu_plan.c
  ${PA_CPU_DIR}/cpu_attn.c
  ${PA_CPU_DIR}/cpu_kernels_generic.c)
list(APPEND PA_PRIVATE_DEFS PAGEDATTN_HAVE_CPU)

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  list(APPEND PA_SOURCES ${PA_CPU_DIR}/x86/cpu_detect.c ${PA_CPU_DIR}/x86/cpu_avx2.c)
  set_source_files_properties(${PA_CPU_DIR}/x86/cpu_avx2.c PROPERTIES
    COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  if(PAGEDATTN_CPU_AVX512)
    check_c_compiler_flag("-mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma -mf16c" PA_CC_HAS_AVX512BF16)
  endif()
  if(PAGEDATTN_CPU_AVX512 AND PA_CC_HAS_AVX512BF16)
    list(APPEND PA_SOURCES ${PA_CPU_DIR}/x86/cpu_avx512.c ${PA_CPU_DIR}/x86/cpu_avx512bf16.c)
    set_source_files_properties(${PA_CPU_DIR}/x86/cpu_avx512.c PROPERTIES
      COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx2;-mfma;-mf16c")
    set_source_files_properties(${PA_CPU_DIR}/x86/cpu_avx512bf16.c PROPERTIES
      COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512bf16;-mavx2;-mfma;-mf16c")
    list(APPEND PA_PRIVATE_DEFS PAGEDATTN_HAVE_AVX512)
  elseif(NOT PAGEDATTN_CPU_AVX512)
    list(APPEND PA_PRIVATE_DEFS PAGEDATTN_NO_AVX512) # (what `pagedattn info` says of it)
  endif()
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  list(APPEND PA_SOURCES ${PA_CPU_DIR}/arm/cpu_detect_arm.c ${PA_CPU_DIR}/arm/cpu_neon.c)
else()
  list(APPEND PA_SOURCES ${PA_CPU_DIR}/x86/cpu_detect.c)
endif()

# The kernels were written and measured at -O3. At -O2 (CMake's RelWithDebInfo, distribution
# CFLAGS) gcc 12 leaves their small arrays of vector accumulators in memory: decode 16 x 4096
# bf16 ran 1.7x and a 2048-token prefill 2.4x slower (bench/NOTES.md, ninth pass). So the cpu
# backend's files get -O3 in every configuration but Debug, whatever the embedding project's
# flags: source options come after CMAKE_C_FLAGS[_<CONFIG>] on the command line. Not in sanitized
# builds (PAGEDATTN_SANITIZE), which check, not measure: CI builds them at -O1 -g1, and the -O3
# here had overridden that (the sanitized build took most of CI's ASan section, 19 minutes on a
# Zen 3; bench/NOTES.md, forty-sixth pass).
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang" AND NOT PAGEDATTN_SANITIZE)
  set(PA_CPU_SOURCES ${PA_SOURCES})
  list(REMOVE_ITEM PA_CPU_SOURCES ${PA_CPU_SOURCES_BEFORE})
  set_property(SOURCE ${PA_CPU_SOURCES} APPEND PROPERTY COMPILE_OPTIONS "$<$<NOT:$<CONFIG:Debug>>:-O3>")
endif()
