# Every public header compiles on its own (include what you use): for each header
# under include/dtensor a generated TU includes only that header, and a ctest test
# named after it (header:dtensor/ops/matmul.hpp, label "headers") runs the compiler
# on it with -fsyntax-only: no object, no link, one to three seconds each, in
# parallel under ctest -j. The glob is re-run at build time, so a new header is
# checked without touching this file.
#
# Flags come from the targets a user would link (dtensor::dtensor, ::mpi, ::cuda),
# so the check sees what a user's TU sees. Headers of optional backends are checked
# where the backend is, as the rest of the build does: comm/mpi/ and mpi.hpp with
# MPI; io/hdf5*.hpp and io/xdmf.hpp with parallel HDF5; spectral/, spectral.hpp and
# the headers built on FFTW with FFTW; cuda/ and cuda.hpp with
# the CUDA toolkit; cuda/nccl_*.hpp with NCCL, and
# nccl_mpi.hpp with NCCL and MPI.
file(GLOB_RECURSE dtensor_public_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
     ${PROJECT_SOURCE_DIR}/include/dtensor/*.hpp)
list(SORT dtensor_public_headers)

# -I and -D lists of the given targets' usage requirements (transitive over their
# INTERFACE_LINK_LIBRARIES: Eigen, MPI, CUDA include dirs).
function(dtensor_header_flags out)
  set(flags "")
  foreach(t IN LISTS ARGN)
    set(inc "$<TARGET_PROPERTY:${t},INTERFACE_INCLUDE_DIRECTORIES>")
    set(def "$<TARGET_PROPERTY:${t},INTERFACE_COMPILE_DEFINITIONS>")
    list(APPEND flags "$<$<BOOL:${inc}>:-I$<JOIN:${inc},$<SEMICOLON>-I>>"
                      "$<$<BOOL:${def}>:-D$<JOIN:${def},$<SEMICOLON>-D>>")
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

foreach(h IN LISTS dtensor_public_headers)
  set(targets dtensor)
  if(h MATCHES "^dtensor/cuda/nccl_mpi\\.hpp$")
    if(NOT DTENSOR_NCCL_FOUND OR NOT DTENSOR_WITH_MPI)
      continue()
    endif()
    set(targets dtensor_cuda dtensor_mpi)
  elseif(h MATCHES "^dtensor/cuda/nccl_")
    if(NOT DTENSOR_NCCL_FOUND)
      continue()
    endif()
    set(targets dtensor_cuda)
  elseif(h MATCHES "^dtensor/(cuda/|cuda\\.hpp$)")
    if(NOT DTENSOR_CUDA_FOUND)
      continue()
    endif()
    set(targets dtensor_cuda)
  elseif(h MATCHES "^dtensor/(spectral/|spectral\\.hpp$|compute/fftw|solvers/spectral|nn/spectral)")
    if(NOT DTENSOR_HAVE_FFTW)
      continue()  # FFTW (libfftw3-dev)
    endif()
    set(targets dtensor_fftw)
  elseif(h MATCHES "^dtensor/io/(hdf5|xdmf)")
    if(NOT DTENSOR_HAVE_HDF5)
      continue()  # parallel HDF5 (hdf5-openmpi)
    endif()
    set(targets dtensor_hdf5)
  elseif(h MATCHES "^dtensor/(io/|io\\.hpp$)")
    if(NOT DTENSOR_WITH_IO)
      continue()  # checkpoints need nlohmann-json and xxhash.h
    endif()
  elseif(h MATCHES "^dtensor/(comm/mpi/|mpi\\.hpp$)")
    if(NOT DTENSOR_WITH_MPI)
      continue()
    endif()
    set(targets dtensor_mpi)
  endif()
  string(MAKE_C_IDENTIFIER "${h}" tu)
  set(tu ${CMAKE_CURRENT_BINARY_DIR}/headers/${tu}.cpp)
  file(CONFIGURE OUTPUT ${tu} CONTENT "#include \"${h}\"  // and nothing else: ${h} compiles on its own\n")
  dtensor_header_flags(flags ${targets})
  add_test(NAME header:${h}
           COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only ${DTENSOR_GCC_HEAP_FLAGS} ${flags} ${tu}
           COMMAND_EXPAND_LISTS)
  set_tests_properties(header:${h} PROPERTIES LABELS headers TIMEOUT 120)
endforeach()
