# cuda.cmake — libdualemb_cuda.so, the GPU table (csrc/cuda), included by CMakeLists.txt only when
# check_language(CUDA) found nvcc.
#
# A separate shared library, so that libdualemb_core.so and every Python module load on a machine
# with no GPU and no CUDA driver: it is loaded only when a GPU table is made (ctypes from
# dualemb/core/_cuda.py today; dlopen from the core's table facade later). The CUDA runtime is
# linked statically (CMake's default for CUDA): the library needs only the driver (libcuda.so.1),
# which the runtime opens on the first CUDA call, so even loading it works without a driver and
# the first call reports "no CUDA driver" as a clear error.
#
# The host-side pieces the table needs (config parsing, optimizer specs and their per-batch
# scalars, initializer parsing) are the core's own sources compiled once more into this library:
# the core keeps its internal symbols hidden, and both copies are the same code.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # H100 / H200 (sm_90) at least; override with -DCMAKE_CUDA_ARCHITECTURES=...
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

file(GLOB DUALEMB_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/csrc/cuda/*.cu)
file(GLOB DUALEMB_CUDA_OPTIMIZER_SOURCES CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/csrc/core/optimizers/*.cc)
add_library(dualemb_cuda SHARED ${DUALEMB_CUDA_SOURCES} ${DUALEMB_CUDA_OPTIMIZER_SOURCES}
            ${CMAKE_SOURCE_DIR}/csrc/core/config.cc ${CMAKE_SOURCE_DIR}/csrc/core/initializer.cc
            ${CMAKE_SOURCE_DIR}/csrc/core/normal.cc ${CMAKE_SOURCE_DIR}/csrc/core/value_dtype.cc)
target_include_directories(dualemb_cuda PRIVATE ${CMAKE_SOURCE_DIR}/csrc/core
                           ${CMAKE_SOURCE_DIR}/csrc/cuda)
target_include_directories(dualemb_cuda SYSTEM PRIVATE ${DUALEMB_NLOHMANN_JSON_INCLUDE_DIR})
# Same bits as the CPU core: no FMA contraction on either side (--fmad=false for device code,
# -ffp-contract=off for host code, nvcc's host compiler included), IEEE division and sqrt, no
# flush-to-zero.
target_compile_options(dualemb_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:${DUALEMB_OPT_FLAGS}>
  $<$<COMPILE_LANGUAGE:CUDA>:-O3 --fmad=false --prec-div=true --prec-sqrt=true --ftz=false
    -Xcompiler=-ffp-contract=off>)
target_link_libraries(dualemb_cuda PRIVATE CUDA::cudart_static Threads::Threads)
set_target_properties(dualemb_cuda PROPERTIES
  OUTPUT_NAME dualemb_cuda
  CXX_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden
  CUDA_RUNTIME_LIBRARY Static
  BUILD_RPATH "\$ORIGIN"
  INSTALL_RPATH "\$ORIGIN"
  BUILD_WITH_INSTALL_RPATH ON
  LIBRARY_OUTPUT_DIRECTORY ${DUALEMB_OUT})
install(TARGETS dualemb_cuda LIBRARY DESTINATION dualemb)
message(STATUS "dualemb: GPU table libdualemb_cuda.so enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES})")
