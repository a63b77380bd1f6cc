# Cross toolchain: AArch64 Linux with Debian's gcc-aarch64-linux-gnu; tests run under qemu-user
# (ctest prefixes every test with CMAKE_CROSSCOMPILING_EMULATOR). Used by scripts/check-arm.sh:
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DPAGEDATTN_CUDA=OFF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(PA_AARCH64_TRIPLE aarch64-linux-gnu CACHE STRING "cross compiler prefix")
set(CMAKE_C_COMPILER ${PA_AARCH64_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${PA_AARCH64_TRIPLE}-g++)
set(PA_AARCH64_SYSROOT /usr/${PA_AARCH64_TRIPLE} CACHE PATH "target libraries (qemu -L)")
set(CMAKE_FIND_ROOT_PATH ${PA_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${PA_AARCH64_SYSROOT})
