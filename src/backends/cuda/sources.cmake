# The cuda backend (included by the top-level CMakeLists.txt after PA_SOURCES is globbed).
#
# PAGEDATTN_CUDA=AUTO (default): build it when a CUDA compiler (nvcc) is found.
# PAGEDATTN_CUDA=ON: require it (configure fails without nvcc).
# PAGEDATTN_CUDA=OFF: never build it.
#
# When built: the .cu/.c files here join PA_SOURCES, PAGEDATTN_HAVE_CUDA joins PA_PRIVATE_DEFS
# (the registry then lists "cuda"), the static CUDA runtime joins PA_LINK_LIBS (so consumers of
# the library need no CUDA runtime of their own, only the driver), and PA_PC_EXTRA_LIBS names
# it for pkg-config. Device code targets sm_80 and sm_90 unless CMAKE_CUDA_ARCHITECTURES is set.

string(TOUPPER "${PAGEDATTN_CUDA}" _pa_cuda_mode)
if(_pa_cuda_mode MATCHES "^(1|TRUE|YES|Y)$")
  set(_pa_cuda_mode ON)
elseif(_pa_cuda_mode MATCHES "^(0|FALSE|NO|N)$")
  set(_pa_cuda_mode OFF)
endif()
if(NOT _pa_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "PAGEDATTN_CUDA must be AUTO, ON or OFF (got '${PAGEDATTN_CUDA}')")
endif()

set(PAGEDATTN_CUDA_BUILT OFF)
if(NOT _pa_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    include(CheckLanguage)
    check_language(CUDA)
  endif()
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    find_package(CUDAToolkit REQUIRED)

    file(GLOB _pa_cuda_sources CONFIGURE_DEPENDS
      ${CMAKE_CURRENT_LIST_DIR}/*.cu ${CMAKE_CURRENT_LIST_DIR}/*.c)
    list(APPEND PA_SOURCES ${_pa_cuda_sources})
    list(APPEND PA_PRIVATE_DEFS PAGEDATTN_HAVE_CUDA)

    # nvcc: hidden host symbols (the library exports only PA_API), line info for
    # compute-sanitizer, warnings from the host compiler, the architectures compiled in parallel
    # (--threads 0: one job per target; the attention kernels are the build's longest step). No
    # fast-math: the numerics contract needs IEEE expf/logf/tanhf and correctly rounded division
    # (the one approximate function, ex2.approx in the prefill tiles, makes probabilities that
    # are rounded to 16 bits next, and is called explicitly there).
    file(GLOB _pa_cuda_cu CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cu)
    set_source_files_properties(${_pa_cuda_cu} PROPERTIES COMPILE_OPTIONS
      "-lineinfo;--threads=0;-Xcompiler=-fvisibility=hidden,-fno-threadsafe-statics,-fno-exceptions,-Wall")

    # Static CUDA runtime by absolute path, so the installed CMake export and pkg-config need
    # no FindCUDAToolkit on the consumer's side.
    if(CUDA_cudart_static_LIBRARY)
      list(APPEND PA_LINK_LIBS ${CUDA_cudart_static_LIBRARY} ${CMAKE_DL_LIBS})
      if(UNIX AND NOT APPLE)
        list(APPEND PA_LINK_LIBS rt)
      endif()
      set(PA_PC_EXTRA_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
    else()
      list(APPEND PA_LINK_LIBS ${CUDA_cudart_LIBRARY})
      set(PA_PC_EXTRA_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -lcudart")
    endif()
    set(PAGEDATTN_CUDA_BUILT ON)
    message(STATUS "pagedattn: cuda backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_pa_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "PAGEDATTN_CUDA=ON but no CUDA compiler was found: put nvcc on PATH or "
                        "set CMAKE_CUDA_COMPILER (or CUDACXX)")
  else()
    message(STATUS "pagedattn: cuda backend OFF (no CUDA compiler found; PAGEDATTN_CUDA=AUTO)")
  endif()
else()
  message(STATUS "pagedattn: cuda backend OFF (PAGEDATTN_CUDA=OFF)")
endif()
