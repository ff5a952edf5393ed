# Find Kokkos (>= 3.4) and normalise the differences between the installs we support:
#  - Kokkos 4.x from source or Spack: a clean Kokkos::kokkos target.
#  - Debian 12's Trilinos package (Kokkos 3.4.01, Serial): its TriBITS-generated config points
#    INTERFACE_INCLUDE_DIRECTORIES at <prefix>/lib/include, which does not exist; the headers are
#    in /usr/include/trilinos. We repair the imported target instead of asking users to patch it.
find_package(Kokkos 3.4 REQUIRED)

if(NOT DEFINED Kokkos_VERSION OR "${Kokkos_VERSION}" STREQUAL "")
  set(Kokkos_VERSION "3.4")
endif()

get_target_property(_mt_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
set(_mt_kokkos_fixed_inc "")
foreach(_dir IN LISTS _mt_kokkos_inc)
  if(_dir MATCHES "^\\$<" OR EXISTS "${_dir}")
    list(APPEND _mt_kokkos_fixed_inc "${_dir}")
  endif()
endforeach()
if(NOT _mt_kokkos_fixed_inc)
  find_path(MESHTRAIN_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
    HINTS ${Kokkos_INCLUDE_DIRS} PATH_SUFFIXES trilinos
    DOC "directory holding Kokkos_Core.hpp")
  if(NOT MESHTRAIN_KOKKOS_INCLUDE_DIR)
    message(FATAL_ERROR "Kokkos was found at '${Kokkos_DIR}' but Kokkos_Core.hpp was not; "
      "set MESHTRAIN_KOKKOS_INCLUDE_DIR to the folder that holds it.")
  endif()
  message(STATUS "Kokkos config exports a missing include dir (${_mt_kokkos_inc}); "
    "using ${MESHTRAIN_KOKKOS_INCLUDE_DIR}")
  set(_mt_kokkos_fixed_inc "${MESHTRAIN_KOKKOS_INCLUDE_DIR}")
endif()
set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_mt_kokkos_fixed_inc}")

# The TriBITS config lists the libraries by bare name; they live in the system library path.
if(Kokkos_VERSION VERSION_LESS 4.0)
  get_target_property(_mt_kokkos_libs Kokkos::kokkos INTERFACE_LINK_LIBRARIES)
  list(FILTER _mt_kokkos_libs EXCLUDE REGEX "^-D")
  set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_LINK_LIBRARIES "${_mt_kokkos_libs}")
endif()

set(MESHTRAIN_KOKKOS_DEVICES "")
foreach(_dev SERIAL OPENMP THREADS CUDA HIP SYCL)
  if(Kokkos_ENABLE_${_dev})
    list(APPEND MESHTRAIN_KOKKOS_DEVICES ${_dev})
  endif()
endforeach()
if(NOT MESHTRAIN_KOKKOS_DEVICES)
  # Kokkos 3.4 via TriBITS does not export Kokkos_ENABLE_*: read the generated config header.
  foreach(_dir IN LISTS _mt_kokkos_fixed_inc)
    if(EXISTS "${_dir}/KokkosCore_config.h")
      file(STRINGS "${_dir}/KokkosCore_config.h" _defs REGEX "^#define KOKKOS_ENABLE_(SERIAL|OPENMP|THREADS|CUDA)$")
      foreach(_d IN LISTS _defs)
        string(REGEX REPLACE "^#define KOKKOS_ENABLE_" "" _d "${_d}")
        list(APPEND MESHTRAIN_KOKKOS_DEVICES ${_d})
        set(Kokkos_ENABLE_${_d} ON)
      endforeach()
    endif()
  endforeach()
endif()
