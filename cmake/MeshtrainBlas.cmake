# Host BLAS with the C interface, as the target meshtrain_blas. Two ways in:
#  - given: MESHTRAIN_BLAS_LIBRARIES (and MESHTRAIN_BLAS_INCLUDE_DIRS) name the provider exactly.
#    The Spack recipe passes spec["blas:c"].libs and .headers, so whichever provider the site
#    uses (OpenBLAS, oneMKL, BLIS, netlib's cblas) is the one linked; only those include
#    directories are searched, so its header never comes from another BLAS on the system.
#  - found: FindBLAS, OpenBLAS first (what Debian ships), and cblas.h next to it.
# The header is cblas.h (OpenBLAS, BLIS, netlib) or mkl_cblas.h (oneMKL, which has no cblas.h);
# src/kernels/cblas.hpp includes the one found. A configure-time link of cblas_sgemm proves the
# pair before the build does.
include(CheckSymbolExists)

set(MESHTRAIN_BLAS_LIBRARIES "" CACHE STRING
  "BLAS libraries with the CBLAS symbols (full paths, ;-separated); empty: FindBLAS")
set(MESHTRAIN_BLAS_INCLUDE_DIRS "" CACHE STRING
  "directories to search for cblas.h or mkl_cblas.h with MESHTRAIN_BLAS_LIBRARIES")

if(MESHTRAIN_BLAS_LIBRARIES)
  set(_mt_blas_libs ${MESHTRAIN_BLAS_LIBRARIES})
  set(_mt_blas_origin "MESHTRAIN_BLAS_LIBRARIES")
  if(MESHTRAIN_BLAS_INCLUDE_DIRS)
    set(_mt_blas_search PATHS ${MESHTRAIN_BLAS_INCLUDE_DIRS} NO_DEFAULT_PATH)
  else()
    set(_mt_blas_search "")
  endif()
  # feature_summary: BLAS is a required package; it was given rather than found.
  set_property(GLOBAL APPEND PROPERTY PACKAGES_FOUND BLAS)
else()
  set(BLA_VENDOR_SAVED "${BLA_VENDOR}")
  if(NOT BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
  endif()
  find_package(BLAS)
  if(NOT BLAS_FOUND)
    set(BLA_VENDOR "${BLA_VENDOR_SAVED}")
    find_package(BLAS REQUIRED)
  endif()
  set(_mt_blas_libs ${BLAS_LIBRARIES})
  set(_mt_blas_origin "FindBLAS (BLA_VENDOR=${BLA_VENDOR})")
  set(_mt_blas_search PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread)
endif()

# A header directory cached for other inputs (libraries, include dirs) is searched again.
set(_mt_blas_inputs "${MESHTRAIN_BLAS_LIBRARIES}|${MESHTRAIN_BLAS_INCLUDE_DIRS}")
if(DEFINED MESHTRAIN_CBLAS_SEARCHED_FOR
    AND NOT _mt_blas_inputs STREQUAL MESHTRAIN_CBLAS_SEARCHED_FOR)
  unset(MESHTRAIN_CBLAS_INCLUDE_DIR CACHE)
endif()
set(MESHTRAIN_CBLAS_SEARCHED_FOR "${_mt_blas_inputs}" CACHE INTERNAL "")
find_path(MESHTRAIN_CBLAS_INCLUDE_DIR NAMES cblas.h mkl_cblas.h ${_mt_blas_search}
  DOC "directory holding cblas.h (or oneMKL's mkl_cblas.h)")
if(NOT MESHTRAIN_CBLAS_INCLUDE_DIR)
  if(MESHTRAIN_BLAS_LIBRARIES AND MESHTRAIN_BLAS_INCLUDE_DIRS)
    set(_mt_where "in MESHTRAIN_BLAS_INCLUDE_DIRS='${MESHTRAIN_BLAS_INCLUDE_DIRS}'")
  else()
    set(_mt_where "in the default include paths")
  endif()
  message(FATAL_ERROR "meshtrain: no cblas.h or mkl_cblas.h ${_mt_where}. Install "
    "libopenblas-dev (Debian) or a blas with the C interface (Spack), or set "
    "MESHTRAIN_CBLAS_INCLUDE_DIR to the directory holding the header.")
endif()
if(EXISTS "${MESHTRAIN_CBLAS_INCLUDE_DIR}/cblas.h")
  set(MESHTRAIN_CBLAS_HEADER cblas.h)
elseif(EXISTS "${MESHTRAIN_CBLAS_INCLUDE_DIR}/mkl_cblas.h")
  set(MESHTRAIN_CBLAS_HEADER mkl_cblas.h)
else()
  message(FATAL_ERROR "meshtrain: MESHTRAIN_CBLAS_INCLUDE_DIR='${MESHTRAIN_CBLAS_INCLUDE_DIR}' "
    "holds neither cblas.h nor mkl_cblas.h; point it at the directory that does.")
endif()

# Re-run the link check whenever the libraries or the header change (the result is cached).
set(_mt_blas_signature "${_mt_blas_libs}|${MESHTRAIN_CBLAS_INCLUDE_DIR}/${MESHTRAIN_CBLAS_HEADER}")
if(NOT _mt_blas_signature STREQUAL MESHTRAIN_CBLAS_CHECKED_FOR)
  unset(MESHTRAIN_CBLAS_LINKS CACHE)
endif()
set(CMAKE_REQUIRED_INCLUDES ${MESHTRAIN_CBLAS_INCLUDE_DIR})
set(CMAKE_REQUIRED_LIBRARIES ${_mt_blas_libs})
set(CMAKE_REQUIRED_QUIET ON)
check_symbol_exists(cblas_sgemm ${MESHTRAIN_CBLAS_HEADER} MESHTRAIN_CBLAS_LINKS)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_LIBRARIES)
unset(CMAKE_REQUIRED_QUIET)
set(MESHTRAIN_CBLAS_CHECKED_FOR "${_mt_blas_signature}" CACHE INTERNAL "")
if(NOT MESHTRAIN_CBLAS_LINKS)
  message(FATAL_ERROR "meshtrain: cblas_sgemm from ${MESHTRAIN_CBLAS_HEADER} does not link with "
    "the BLAS libraries of ${_mt_blas_origin}: '${_mt_blas_libs}'. They need the C interface "
    "(for netlib, libcblas as well as libblas); set MESHTRAIN_BLAS_LIBRARIES to libraries that "
    "have it.")
endif()

# What was linked, for the probe test of this module (tests/scripts/test_spack_blas.py).
set(MESHTRAIN_BLAS_LINK_LIBRARIES ${_mt_blas_libs})
add_library(meshtrain_blas INTERFACE)
target_include_directories(meshtrain_blas INTERFACE ${MESHTRAIN_CBLAS_INCLUDE_DIR})
target_link_libraries(meshtrain_blas INTERFACE ${_mt_blas_libs})
if(MESHTRAIN_CBLAS_HEADER STREQUAL "mkl_cblas.h")
  target_compile_definitions(meshtrain_blas INTERFACE MESHTRAIN_CBLAS_MKL_HEADER)
endif()
message(STATUS "meshtrain: CBLAS ${MESHTRAIN_CBLAS_INCLUDE_DIR}/${MESHTRAIN_CBLAS_HEADER}, "
  "libraries from ${_mt_blas_origin}: ${_mt_blas_libs}")
