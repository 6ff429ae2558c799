# The `layering` test: every #include "stitch/<folder>/..." in a folder's
# library sources (tests and test helpers aside) names the folder itself or
# one its line of stitch_layers.cmake lists. Run as
#   cmake -DSTITCH_ROOT=<repository> -P cmake/check_layers.cmake
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/stitch_layers.cmake)

set(violations 0)
# A folder inside another (store/s3) is the layer store_s3.
file(GLOB folders LIST_DIRECTORIES true RELATIVE ${STITCH_ROOT}/src/stitch ${STITCH_ROOT}/src/stitch/*
  ${STITCH_ROOT}/src/stitch/*/*)
foreach(path IN LISTS folders)
  if(NOT IS_DIRECTORY ${STITCH_ROOT}/src/stitch/${path})
    continue()
  endif()
  string(REPLACE "/" "_" folder "${path}")
  if(NOT folder IN_LIST STITCH_FOLDERS)
    message(SEND_ERROR "src/stitch/${path} is not in cmake/stitch_layers.cmake: add it (as ${folder}) "
      "with the folders it may use")
    math(EXPR violations "${violations} + 1")
    continue()
  endif()
  file(GLOB sources ${STITCH_ROOT}/src/stitch/${path}/*.h ${STITCH_ROOT}/src/stitch/${path}/*.cc)
  foreach(source IN LISTS sources)
    get_filename_component(base ${source} NAME)
    if(base MATCHES "_test\\.cc$|_test_util\\.(h|cc)$|^fake_|^testing_|^test_")
      continue()
    endif()
    file(STRINGS ${source} includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"stitch/")
    foreach(line IN LISTS includes)
      string(REGEX MATCH "\"stitch/([a-z_]+)/(([a-z0-9_]+)/)?" _ "${line}")
      set(used ${CMAKE_MATCH_1})
      if(CMAKE_MATCH_3 AND "${CMAKE_MATCH_1}_${CMAKE_MATCH_3}" IN_LIST STITCH_FOLDERS)
        set(used "${CMAKE_MATCH_1}_${CMAKE_MATCH_3}")
      endif()
      if(NOT used STREQUAL folder AND NOT used IN_LIST STITCH_MAY_USE_${folder})
        message(SEND_ERROR "src/stitch/${path}/${base}: ${line}: ${folder} may not use ${used} "
          "(cmake/stitch_layers.cmake); speak through a folder it may use")
        math(EXPR violations "${violations} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations GREATER 0)
  message(FATAL_ERROR "layering: ${violations} include(s) against the dependency direction")
endif()
message(STATUS "layering: every folder includes only what cmake/stitch_layers.cmake allows")
