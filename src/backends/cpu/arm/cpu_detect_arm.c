/* cpu_detect_arm.c: CPU feature detection on AArch64 (baseline flags; no intrinsics). Advanced
 * SIMD (with the f16 <-> f32 conversions the NEON path uses) is part of every AArch64 CPU and its
 * registers are always saved by the OS, so there is nothing to ask: the NEON path always runs. */
#include "../cpu.h"

void pa__cpu_detect(pa__cpu_features *f)
{
    memset(f, 0, sizeof *f);
#ifdef PA__CPU_ARM64
    f->neon = true;
#endif
}
