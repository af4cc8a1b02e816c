# dtensor_precompile_headers(<target> [HEADERS <header>...] [REUSE_FROM <other>])
#
# Precompiles dtensor's headers for <target>, so that its translation units read them
# from the compiler's saved state instead of parsing them again: by default
# <dtensor/dtensor.hpp> and <dtensor/nn.hpp>, the umbrella headers most programs start
# with. What it saves is parsing: about 3.6 s of each of dtensor's test TUs, under 1 s
# of a training example's front end, whose time is mostly template instantiation
# (bench/compile_time/examples.sh measures a program with and without). HEADERS names others (<dtensor/cnn.hpp>,
# <dtensor/solvers.hpp>, <dtensor/mpi.hpp>, ...). REUSE_FROM shares the precompiled
# header of another target built with the same flags instead of making one more.
#
# Left out of the default on purpose: <dtensor/io.hpp>. nlohmann-json's inline
# functions are instantiated at the end of every TU that includes it, precompiled or
# not, so precompiling it saves little and costs every TU that does not need it.
#
# A precompiled header only saves parsing; the templates a program instantiates (its
# layers' forwards and backwards for each placement) are compiled in every TU that
# uses them. Keep a model's types in one TU and the rest of the program in others, and
# a change elsewhere does not recompile the model.
function(dtensor_precompile_headers target)
  cmake_parse_arguments(PCH "" "REUSE_FROM" "HEADERS" ${ARGN})
  if(PCH_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "dtensor_precompile_headers(${target}): unknown arguments ${PCH_UNPARSED_ARGUMENTS} "
                        "(takes HEADERS <header>... and REUSE_FROM <target>)")
  endif()
  if(PCH_REUSE_FROM)
    if(PCH_HEADERS)
      message(FATAL_ERROR "dtensor_precompile_headers(${target}): give HEADERS or REUSE_FROM, not both "
                          "(the headers are those of ${PCH_REUSE_FROM})")
    endif()
    target_precompile_headers(${target} REUSE_FROM ${PCH_REUSE_FROM})
    return()
  endif()
  if(NOT PCH_HEADERS)
    set(PCH_HEADERS <dtensor/dtensor.hpp> <dtensor/nn.hpp>)
  endif()
  target_precompile_headers(${target} PRIVATE ${PCH_HEADERS})
endfunction()
