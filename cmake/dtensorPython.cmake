# dtensor_python_with(<out> <module>...): in <out>, the first python3 that imports every
# <module> (the one on PATH, then /usr/bin/python3: Debian's python3-numpy and
# python3-h5py are the system one's). Where none does, python3 on PATH anyway (the
# scripts then report themselves skipped, exit 77); empty without any python3.
function(dtensor_python_with out)
  find_program(DTENSOR_PYTHON3 python3)
  string(REPLACE ";" ", " imports "${ARGN}")
  set(found "")
  foreach(py IN ITEMS ${DTENSOR_PYTHON3} /usr/bin/python3)
    if(NOT found AND EXISTS ${py})
      execute_process(COMMAND ${py} -c "import ${imports}" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(found ${py})
      endif()
    endif()
  endforeach()
  if(NOT found AND DTENSOR_PYTHON3)
    set(found ${DTENSOR_PYTHON3})
  endif()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()
