"""cmake/MeshtrainBlas.cmake takes the BLAS it is given, as the Spack recipe gives it
(MESHTRAIN_BLAS_LIBRARIES and MESHTRAIN_BLAS_INCLUDE_DIRS from spec["blas:c"]): a one-file project
(tests/scripts/blas_probe) configures, builds and runs an SGEMM with
  - the libraries and header directory this build found, passed explicitly;
  - the same libraries behind a header named as oneMKL names it (mkl_cblas.h, no cblas.h), in a
    directory of its own: the header must come from there, not from the system;
and configuring fails, naming the variable, with a directory that has no header or libraries
without the CBLAS symbols (also when the same build directory passed before).
    python3 test_spack_blas.py --source SRC --work DIR --cmake CMAKE --cc CC --cxx CXX \
        --cblas-include DIR --cblas-header cblas.h --libs LIB...
"""
import argparse
import os
import shutil
import subprocess
import sys
import unittest

ARGS = None


def configure(build, *defines):
    """Runs cmake on the probe; returns (exit code, output)."""
    cmd = [ARGS.cmake, "-S", os.path.join(ARGS.source, "tests", "scripts", "blas_probe"),
           "-B", build, f"-DMESHTRAIN_SOURCE_DIR={ARGS.source}",
           f"-DCMAKE_C_COMPILER={ARGS.cc}", f"-DCMAKE_CXX_COMPILER={ARGS.cxx}", *defines]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def build_and_run(build):
    p = subprocess.run([ARGS.cmake, "--build", build], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise AssertionError(f"probe build failed:\n{p.stdout}")
    p = subprocess.run([os.path.join(build, "blas_probe")], stdout=subprocess.PIPE, text=True)
    return p.returncode, p.stdout


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    return None


class GivenBlas(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        shutil.rmtree(ARGS.work, ignore_errors=True)
        os.makedirs(ARGS.work)
        cls.libs = "-DMESHTRAIN_BLAS_LIBRARIES=" + ";".join(ARGS.libs)

    def dir(self, name):
        return os.path.join(ARGS.work, name)

    def test_explicit_libraries_and_header_directory(self):
        build = self.dir("given")
        rc, out = configure(build, self.libs,
                            f"-DMESHTRAIN_BLAS_INCLUDE_DIRS={ARGS.cblas_include}")
        self.assertEqual(rc, 0, out)
        self.assertIn("libraries from MESHTRAIN_BLAS_LIBRARIES", out)
        self.assertIsNone(cache_value(build, "BLAS_LIBRARIES"), "FindBLAS ran")
        rc, out = build_and_run(build)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"header {ARGS.cblas_header}\n", out)
        self.assertIn("c = 19 22 43 50", out)

    def test_mkl_style_header_from_the_given_directory_only(self):
        include = self.dir("mkl-include")
        os.makedirs(include)
        with open(os.path.join(include, "mkl_cblas.h"), "w") as f:
            f.write(f'#include "{os.path.join(ARGS.cblas_include, ARGS.cblas_header)}"\n')
        # A second directory without the header, as oneMKL's headers.directories has (fftw).
        os.makedirs(os.path.join(include, "fftw"))
        build = self.dir("mkl-style")
        rc, out = configure(build, self.libs,
                            f"-DMESHTRAIN_BLAS_INCLUDE_DIRS={include}/fftw;{include}")
        self.assertEqual(rc, 0, out)
        self.assertEqual(cache_value(build, "MESHTRAIN_CBLAS_INCLUDE_DIR"), include)
        rc, out = build_and_run(build)
        self.assertEqual(rc, 0, out)
        self.assertIn("header mkl_cblas.h\n", out)
        self.assertIn("c = 19 22 43 50", out)

    def test_directory_without_a_header_fails_naming_the_variable(self):
        empty = self.dir("no-header")
        os.makedirs(empty)
        rc, out = configure(self.dir("no-header-build"), self.libs,
                            f"-DMESHTRAIN_BLAS_INCLUDE_DIRS={empty}")
        self.assertNotEqual(rc, 0)
        self.assertIn(f"no cblas.h or mkl_cblas.h in MESHTRAIN_BLAS_INCLUDE_DIRS='{empty}'",
                      " ".join(out.split()))

    def test_libraries_without_cblas_fail_naming_the_variable_also_after_a_good_run(self):
        build = self.dir("relink")
        include = f"-DMESHTRAIN_BLAS_INCLUDE_DIRS={ARGS.cblas_include}"
        rc, out = configure(build, self.libs, include)
        self.assertEqual(rc, 0, out)
        # libm has no cblas_sgemm; the cached result of the first check must not answer.
        rc, out = configure(build, "-DMESHTRAIN_BLAS_LIBRARIES=m", include)
        self.assertNotEqual(rc, 0, out)
        flat = " ".join(out.split())
        self.assertIn("does not link with the BLAS libraries of MESHTRAIN_BLAS_LIBRARIES: 'm'",
                      flat)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for opt in ("source", "work", "cmake", "cc", "cxx", "cblas-include", "cblas-header"):
        parser.add_argument(f"--{opt}", required=True)
    parser.add_argument("--libs", nargs="+", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
