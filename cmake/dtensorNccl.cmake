# dtensor_nccl_version(<nccl.h> <out_version> <out_notes>): the NCCL version that
# <nccl.h> declares ("2.28.9", or "" if it declares none), and what NcclComm does
# without the newer calls it would use (empty when the version has them all). The
# header checks NCCL_VERSION_CODE itself; this only tells the configure log.
function(dtensor_nccl_version header out_version out_notes)
  set(version "")
  set(notes "")
  file(STRINGS "${header}" lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    set(${part} "")
    foreach(line IN LISTS lines)
      if(line MATCHES "^#define NCCL_${part}[ \t]+([0-9]+)")
        set(${part} "${CMAKE_MATCH_1}")
      endif()
    endforeach()
  endforeach()
  if(NOT MAJOR STREQUAL "" AND NOT MINOR STREQUAL "" AND NOT PATCH STREQUAL "")
    set(version "${MAJOR}.${MINOR}.${PATCH}")
    # Calls newer than NCCL 2.7 (the oldest NcclComm supports) and the fallbacks.
    set(features
        "2.10.0|ncclAvg|floating-point Avg becomes a sum and a division"
        "2.13.0|ncclGetLastError|error messages lack NCCL's last error text"
        "2.14.0|ncclCommInitRankConfig|communicators are made with ncclCommInitRank, always blocking"
        "2.18.0|ncclCommSplit|split() makes communicators from fresh unique ids (two all-gathers and ncclCommInitRank)")
    foreach(f IN LISTS features)
      string(REPLACE "|" ";" f "${f}")
      list(GET f 0 since)
      list(GET f 1 call)
      list(GET f 2 fallback)
      if(version VERSION_LESS since)
        list(APPEND notes "${call} needs NCCL ${since}: ${fallback}")
      endif()
    endforeach()
  endif()
  set(${out_version} "${version}" PARENT_SCOPE)
  set(${out_notes} "${notes}" PARENT_SCOPE)
endfunction()
