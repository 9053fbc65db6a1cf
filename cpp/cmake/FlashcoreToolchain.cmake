# Finding nvcc and CUTLASS the way build/toolchain.rs does, provisioning the pinned wheels
# (third_party/toolchain.lock) with scripts/fetch_toolchain.py when nothing is installed.

function(flashcore_provision what)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} ${FLASHCORE_ROOT}/scripts/fetch_toolchain.py
            ${FLASHCORE_ROOT}/third_party/toolchain.lock ${FLASHCORE_THIRD_PARTY_DIR} --only ${what}
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "flashcore: provisioning the pinned ${what} wheels failed (${rc}). "
            "Set CMAKE_CUDA_COMPILER (or NVCC, CUDA_HOME) and CUTLASS_DIR instead.")
  endif()
endfunction()

# Sets CMAKE_CUDA_COMPILER before project() enables CUDA.
macro(flashcore_find_nvcc)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    if(DEFINED ENV{NVCC})
      set(CMAKE_CUDA_COMPILER "$ENV{NVCC}")
    elseif(DEFINED ENV{CUDA_HOME})
      set(CMAKE_CUDA_COMPILER "$ENV{CUDA_HOME}/bin/nvcc")
    elseif(DEFINED ENV{CUDA_PATH})
      set(CMAKE_CUDA_COMPILER "$ENV{CUDA_PATH}/bin/nvcc")
    else()
      find_program(FLASHCORE_NVCC_ON_PATH nvcc)
      if(FLASHCORE_NVCC_ON_PATH)
        set(CMAKE_CUDA_COMPILER "${FLASHCORE_NVCC_ON_PATH}")
      else()
        flashcore_provision(cuda)
        set(CMAKE_CUDA_COMPILER "${FLASHCORE_THIRD_PARTY_DIR}/cuda/bin/nvcc")
      endif()
    endif()
  endif()
endmacro()

macro(flashcore_find_cutlass)
  if(NOT CUTLASS_DIR AND DEFINED ENV{CUTLASS_DIR})
    set(CUTLASS_DIR "$ENV{CUTLASS_DIR}")
  endif()
  if(NOT CUTLASS_DIR)
    flashcore_provision(cutlass)
    set(CUTLASS_DIR "${FLASHCORE_THIRD_PARTY_DIR}/cutlass")
  endif()
  set(CUTLASS_DIR "${CUTLASS_DIR}" CACHE PATH "CUTLASS 4.2.0 source tree" FORCE)
  foreach(needed include/cutlass/cutlass.h examples/41_fused_multi_head_attention/kernel_forward.h)
    if(NOT EXISTS "${CUTLASS_DIR}/${needed}")
      message(FATAL_ERROR "flashcore: CUTLASS at ${CUTLASS_DIR} lacks ${needed}")
    endif()
  endforeach()
endmacro()

# The static CUDA runtime (the pinned wheels ship no shared libcudart, which FindCUDAToolkit
# insists on), found beside the nvcc in use.
macro(flashcore_find_cudart)
  get_filename_component(_flashcore_cuda_root "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(_flashcore_cuda_root "${_flashcore_cuda_root}" DIRECTORY)
  find_library(FLASHCORE_CUDART_STATIC NAMES cudart_static
    HINTS "${_flashcore_cuda_root}" PATH_SUFFIXES lib64 lib targets/x86_64-linux/lib
    NO_DEFAULT_PATH REQUIRED)
  set(THREADS_PREFER_PTHREAD_FLAG ON)
  find_package(Threads REQUIRED)
endmacro()
