# The CUDA kernels and FFI handlers, included by CMakeLists.txt when a CUDA compiler is found.
#
# Architectures: 90 (H100, H200: sm_90 code plus compute_90 PTX for newer GPUs) unless
# -DCMAKE_CUDA_ARCHITECTURES=... or the CUDAARCHS environment variable says otherwise.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures of the gear_jax kernels")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
message(STATUS "gear_jax CUDA architectures: ${CMAKE_CUDA_ARCHITECTURES}")

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

# CUB, Thrust and libcu++ (CCCL): include/cccl in CUDA 13 toolkits and in the pip package
# nvidia-cuda-cccl, include/ itself in older toolkits.
find_path(GEAR_JAX_CCCL_INCLUDE_DIR cub/cub.cuh
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include
  PATH_SUFFIXES cccl
  NO_DEFAULT_PATH)
if(NOT GEAR_JAX_CCCL_INCLUDE_DIR)
  message(FATAL_ERROR "CUB headers (cub/cub.cuh) not found under ${CUDAToolkit_INCLUDE_DIRS}; "
                      "install the CUDA toolkit's CCCL or `pip install nvidia-cuda-cccl`")
endif()
message(STATUS "gear_jax CCCL headers: ${GEAR_JAX_CCCL_INCLUDE_DIR}")

# The host compiler's warnings (the XLA FFI and CCCL headers are system headers: theirs are not shown).
set(GEAR_JAX_CUDA_OPTIONS -Xcompiler=-Wall,-Wextra)

# Kernels: CUDA and CUB, no XLA, no Python.
add_library(gear_kernels_cuda STATIC kernels/sample.cu kernels/sample_at.cu kernels/gather.cu
  kernels/priorities.cu kernels/priority_index.cu)
target_include_directories(gear_kernels_cuda PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}")
target_include_directories(gear_kernels_cuda SYSTEM PUBLIC "${GEAR_JAX_CCCL_INCLUDE_DIR}")
target_compile_options(gear_kernels_cuda PRIVATE ${GEAR_JAX_CUDA_OPTIONS})
target_link_libraries(gear_kernels_cuda PUBLIC CUDA::cudart_static)
set_target_properties(gear_kernels_cuda PROPERTIES
  POSITION_INDEPENDENT_CODE ON CUDA_VISIBILITY_PRESET hidden)

# The CUDA handlers and the pinning of table memory, linked into _native.
add_library(gear_cuda_ffi STATIC xla_ffi/cuda_handlers.cu xla_ffi/cuda_runtime.cu xla_ffi/host_staging.cu)
target_include_directories(gear_cuda_ffi PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
target_include_directories(gear_cuda_ffi SYSTEM PRIVATE "${XLA_FFI_INCLUDE_DIR}")
target_compile_definitions(gear_cuda_ffi PRIVATE GEAR_JAX_WITH_CUDA=1)
target_compile_options(gear_cuda_ffi PRIVATE ${GEAR_JAX_CUDA_OPTIONS})
target_link_libraries(gear_cuda_ffi PUBLIC gear_kernels_cuda gear_kernels_cpu)  # CPU: the host priority scatter
set_target_properties(gear_cuda_ffi PROPERTIES
  POSITION_INDEPENDENT_CODE ON CUDA_VISIBILITY_PRESET hidden)

target_link_libraries(_native PRIVATE gear_cuda_ffi)
# Keep the static CUDA runtime's symbols out of the module's exports.
target_link_options(_native PRIVATE "LINKER:--exclude-libs,ALL")
