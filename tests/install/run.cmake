# Installs dtensor into a fresh prefix, then configures and builds a consumer that
# uses find_package(dtensor), and another that uses add_subdirectory.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
set(prefix ${WORK_DIR}/prefix)
# The library is configured as the main build was (tests/CMakeLists.txt passes its
# build type, GPU code flags, CUDA architectures and GCC heap): the same compiler commands, so
# ccache answers them from the main build's objects.
set(same_as_main -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DDTENSOR_GPU_CODE_OPT=${GPU_CODE_OPT}
    -DDTENSOR_GCC_HEAP_MB=${GCC_HEAP_MB})
if(CUDA_ARCHITECTURES)  # a list: through an initial cache file, where ';' needs no escaping
  string(REPLACE "," ";" archs "${CUDA_ARCHITECTURES}")
  file(WRITE ${WORK_DIR}/lib_cache.cmake "set(CMAKE_CUDA_ARCHITECTURES \"${archs}\" CACHE STRING \"\")\n")
  list(APPEND same_as_main -C ${WORK_DIR}/lib_cache.cmake)
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -DCMAKE_CXX_COMPILER=${CXX} -DDTENSOR_BUILD_TESTS=OFF
    -DDTENSOR_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${prefix} ${same_as_main})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/lib)  # the CUDA kernels library, where CUDA is found
run(${CMAKE_COMMAND} --install ${WORK_DIR}/lib)
# The CUDA target's packaging is checked through find_package; add_subdirectory
# builds without it (CUDA's detection and a second build of the kernels took most of
# this test's time, and add_subdirectory exports nothing).
foreach(mode find_package add_subdirectory)
  set(extra "")
  if(mode STREQUAL "add_subdirectory")
    set(extra -DDTENSOR_WITH_CUDA=OFF)
  endif()
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/${mode} -DCMAKE_CXX_COMPILER=${CXX}
      -DCMAKE_PREFIX_PATH=${prefix} -DMODE=${mode} -DDTENSOR_SOURCE=${SOURCE_DIR} ${extra})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/${mode})
  run(${WORK_DIR}/${mode}/consumer)
  if(mode STREQUAL "find_package")
    run(${WORK_DIR}/${mode}/consumer_runtime)
  endif()
endforeach()
message(STATUS "find_package(dtensor) and add_subdirectory both build and run")
