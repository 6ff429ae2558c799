# What the top-level build and the Python package's build (python/) share:
# the language settings and warnings, the third-party packages the libraries
# of src/stitch use, and stitch_library(). Set STITCH_ROOT (the repository
# root) before including it.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release)
endif()
add_compile_options(-Wall -Wextra -Wno-missing-field-initializers)

find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(Boost 1.81.0 EXACT CONFIG REQUIRED COMPONENTS json url)
find_package(zstd REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CURL REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

include(${CMAKE_CURRENT_LIST_DIR}/stitch_layers.cmake)

# stitch_library(NAME SOURCES ... DEPS ...): one library per folder of
# src/stitch, linking only to folders its line of stitch_layers.cmake lists.
function(stitch_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT name IN_LIST STITCH_FOLDERS)
    message(FATAL_ERROR "src/stitch/${name} is not in cmake/stitch_layers.cmake: add it to "
      "STITCH_FOLDERS with the folders it may use (STITCH_MAY_USE_${name})")
  endif()
  foreach(dep IN LISTS ARG_DEPS ARG_PRIVATE_DEPS)
    if(dep MATCHES "^stitch_(.+)$" AND NOT CMAKE_MATCH_1 IN_LIST STITCH_MAY_USE_${name})
      message(FATAL_ERROR "src/stitch/${name} may not link ${dep}: its line in "
        "cmake/stitch_layers.cmake (STITCH_MAY_USE_${name}) does not list ${CMAKE_MATCH_1}; "
        "keep the dependency out, or change the design (docs/design.md) and that line")
    endif()
  endforeach()
  add_library(stitch_${name} STATIC ${ARG_SOURCES})
  target_include_directories(stitch_${name} PUBLIC ${STITCH_ROOT}/src)
  target_link_libraries(stitch_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()
