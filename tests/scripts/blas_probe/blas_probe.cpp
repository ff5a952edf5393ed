// One row-major SGEMM through the header meshtrain's kernels include; prints which header that was
// and the product of [[1,2],[3,4]] and [[5,6],[7,8]], [[19,22],[43,50]].
#include <cstdio>

#include "cblas.hpp"

int main() {
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  float c[4] = {0, 0, 0, 0};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
#if defined(MESHTRAIN_CBLAS_MKL_HEADER)
  std::printf("header mkl_cblas.h\n");
#else
  std::printf("header cblas.h\n");
#endif
  std::printf("c = %g %g %g %g\n", c[0], c[1], c[2], c[3]);
  return c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50 ? 0 : 1;
}
