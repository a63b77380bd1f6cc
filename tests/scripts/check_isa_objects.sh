#!/bin/sh
# check_isa_objects.sh LIBRARY.a: the run-time ISA dispatch on x86 is only safe if instructions of
# a wide ISA stay inside the files compiled for it. A helper compiled into cpu_avx512.c's object
# and shared with other code (a non-static inline function, a weak symbol the linker may pick)
# would put AVX-512 instructions on the AVX2 or generic path, and every CPU without AVX-512 would
# die of SIGILL there, which no test on an AVX-512 machine would notice. Checks, on the objects of
# the static library:
#   1. each ISA object (cpu_avx2, cpu_avx512, cpu_avx512bf16) defines exactly one global symbol,
#      its pa__cpu_kernels_init_* entry, and no weak or unique symbol;
#   2. no object but the two AVX-512 ones holds an AVX-512 register or instruction;
#   3. no object but the three ISA ones holds a 256-bit register (the rest of the library is
#      built at the x86-64 baseline; CMake registers this test only without -m flags of the
#      embedding project's own);
#   4. AVX512-VBMI's byte permutes (vpermb, vpermi2b, vpermt2b) sit only in the byte-table
#      kernels (*_lut: in cpu_avx512bf16.c they carry VBMI's target attribute, in cpu_avx512.c the
#      permutes are inline assembly), which the tables install only where CPUID reports VBMI
#      (Skylake-X and Cascade Lake have AVX-512 without it, Cooper Lake AVX512-BF16 without it).
set -eu
lib=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
ar x "$lib"
fails=0
# registers and instructions only AVX-512 has
AVX512='zmm|%k[1-7]|[xy]mm(1[6-9]|2[0-9]|3[01])|vpternlog|vpermt2|vpermi2|vdpbf16|vcvtne2?ps2bf16|kmov[bwdq]|vpmov[dqw][bwd] '
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
n=0
for o in *.o; do
    n=$((n + 1))
    case $o in
    cpu_avx2*.o | cpu_avx512*.o)
        base=${o%%.*}
        want="pa__cpu_kernels_init_${base#cpu_}"
        got=$(nm -g --defined-only "$o" | awk 'NF == 3 {print $3}' | tr '\n' ' ')
        [ "$got" = "$want " ] || fail "$o exports '$got', want only '$want'"
        weak=$(nm "$o" | awk '$(NF-1) ~ /^[WVu]$/ {print $NF}' | tr '\n' ' ')
        [ -z "$weak" ] || fail "$o has weak or unique symbols the linker may share: $weak"
        ;;
    esac
    dis=$(objdump -d --no-show-raw-insn "$o")
    case $o in
    cpu_avx512*.o) ;;
    *)
        if printf '%s\n' "$dis" | grep -q -E "$AVX512"; then
            fail "$o holds AVX-512 instructions:"
            printf '%s\n' "$dis" | grep -E "$AVX512" | head -5
        fi
        ;;
    esac
    vbmi=$(printf '%s\n' "$dis" | awk '/^[0-9a-f]+ <.*>:$/ {fn = $2} /vperm(i2|t2)?b[ \t]/ {print fn}' | sort -u |
           grep -v -E '^<[a-z0-9_]+_lut(\.[a-z0-9.]+)?>:$' || true)
    [ -z "$vbmi" ] || fail "$o: VBMI byte permutes outside the *_lut kernels: $vbmi"
    case $o in
    cpu_avx2*.o | cpu_avx512*.o) ;;
    *)
        if printf '%s\n' "$dis" | grep -q ymm; then
            fail "$o holds 256-bit instructions although built at the baseline:"
            printf '%s\n' "$dis" | grep ymm | head -5
        fi
        ;;
    esac
done
[ "$n" -gt 5 ] || fail "only $n objects in $lib"
[ -f cpu_avx2.c.o ] || fail "no cpu_avx2.c.o in $lib (object names changed? this check would then be empty)"
echo "check_isa_objects: $n objects, $fails failure(s)"
[ "$fails" -eq 0 ]
