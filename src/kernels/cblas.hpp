// The C BLAS header of whichever provider cmake/MeshtrainBlas.cmake found: cblas.h (OpenBLAS,
// BLIS, netlib) or oneMKL's mkl_cblas.h, which declares the same cblas_* functions and enums.
#pragma once

#if defined(MESHTRAIN_CBLAS_MKL_HEADER)
#include <mkl_cblas.h>
#else
#include <cblas.h>
#endif
