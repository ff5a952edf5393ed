# Host BLAS with the C interface (cblas.h). OpenBLAS is what Debian and Spack give; any CBLAS works.
set(BLA_VENDOR_SAVED "${BLA_VENDOR}")
if(NOT BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
find_package(BLAS)
if(NOT BLAS_FOUND)
  set(BLA_VENDOR "${BLA_VENDOR_SAVED}")
  find_package(BLAS REQUIRED)
endif()
find_path(MESHTRAIN_CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread
  DOC "directory holding cblas.h")
if(NOT MESHTRAIN_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "cblas.h not found: install libopenblas-dev (Debian) or openblas (Spack), "
    "or set MESHTRAIN_CBLAS_INCLUDE_DIR.")
endif()
add_library(meshtrain_blas INTERFACE)
target_include_directories(meshtrain_blas INTERFACE ${MESHTRAIN_CBLAS_INCLUDE_DIR})
target_link_libraries(meshtrain_blas INTERFACE ${BLAS_LIBRARIES})
