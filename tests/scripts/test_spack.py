"""Spack files: the environments, repo.yaml and spack-repo-index.yaml parse as YAML with the shapes
Spack (>= 1.0) expects, and the recipe compiles and, imported against a stub of Spack
(tests/scripts/spack_stub: directives recorded; package, spec and dependency objects shaped like
Spack's), declares what the README promises and hands CMake the right arguments.
    python3 tests/scripts/test_spack.py SOURCE_DIR
MESHTRAIN_SPACK_RECIPE=path/to/package.py checks another recipe (e.g. an older one) instead."""
import importlib.util
import os
import py_compile
import re
import sys
import tempfile
import unittest
import unittest.mock

sys.dont_write_bytecode = True  # keep the source tree clean (tests run in it)

import yaml

SRC = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else ".")
REPO = os.path.join(SRC, "spack", "spack_repo", "meshtrain")
RECIPE = os.environ.get("MESHTRAIN_SPACK_RECIPE") or os.path.join(
    REPO, "packages", "meshtrain", "package.py")
sys.path.insert(0, os.path.join(SRC, "tests", "scripts", "spack_stub"))
import spack.package as stub  # noqa: E402  (the stub, first on the path)
import spack_model as model  # noqa: E402
from spack_repo.builtin.build_systems.cmake import CMakePackage  # noqa: E402
from spack_repo.builtin.build_systems.cuda import CudaPackage  # noqa: E402


def load_yaml(rel):
    with open(os.path.join(SRC, rel)) as f:
        return yaml.safe_load(f)


def load_recipe():
    """Imports the recipe afresh; returns its Meshtrain class and the directives it declared."""
    del stub.DIRECTIVES[:]
    spec = importlib.util.spec_from_file_location("meshtrain_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Meshtrain, list(stub.DIRECTIVES)


def norm(s):
    return " ".join(s.split())


# ---- concrete specs as Spack hands them to cmake_args / test methods --------------------------
def openblas():
    pkg = model.DependencyPackage(libs=model.LibraryList(["/ob/lib/libopenblas.so"]),
                                  headers=model.HeaderList(["/ob/include/cblas.h"]))
    return model.Spec("openblas", provides={"blas", "lapack"}, package=pkg)


def debian_openblas():
    """Debian's OpenBLAS as an external at /usr: the headers sit below include/."""
    pkg = model.DependencyPackage(
        libs=model.LibraryList(["/usr/lib/x86_64-linux-gnu/libopenblas.so"]),
        headers=model.HeaderList(["/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h",
                                  "/usr/include/x86_64-linux-gnu/cblas.h",
                                  "/usr/include/x86_64-linux-gnu/openblas-pthread/lapacke.h"]))
    return model.Spec("openblas", provides={"blas", "lapack"}, package=pkg, prefix="/usr")


def mkl():
    """oneMKL as a blas provider: several libraries, headers in two directories, no cblas.h."""
    libs = ["/mkl/lib/libmkl_intel_lp64.so", "/mkl/lib/libmkl_sequential.so",
            "/mkl/lib/libmkl_core.so", "/usr/lib/libpthread.so", "/usr/lib/libm.so"]
    pkg = model.DependencyPackage(
        libs=model.LibraryList(libs),
        headers=model.HeaderList(["/mkl/include/mkl_cblas.h", "/mkl/include/fftw/fftw3.h"],
                                 directories=["/mkl/include", "/mkl/include/fftw"]))
    return model.Spec("intel-oneapi-mkl", provides={"blas", "lapack", "fftw-api"}, package=pkg)


def meshtrain_spec(cuda=False, mpi="openmpi", blas=None):
    cxx = "/kw/bin/nvcc_wrapper" if cuda else "/usr/bin/g++"
    kokkos = model.Spec("kokkos", {"cuda": cuda, "wrapper": cuda, "serial": True},
                        package=model.DependencyPackage(kokkos_cxx=cxx))
    variants = {"cuda": cuda, "cuda_arch": ("90",) if cuda else ("none",)}
    deps = [kokkos, blas or openblas(), model.Spec(mpi, provides={"mpi"})]
    return model.Spec("meshtrain", variants, deps=deps, prefix="/opt/mt")


class Environments(unittest.TestCase):
    def check_env(self, rel):
        doc = load_yaml(rel)
        self.assertEqual(list(doc), ["spack"], rel)
        specs = doc["spack"]["specs"]
        self.assertTrue(specs, rel)
        for s in specs:
            # An unquoted `- cmake@3.25:` is a YAML mapping, which Spack rejects.
            self.assertIsInstance(s, str, f"{rel}: spec {s!r} is not a string (quote it)")
        names = [s.split()[0].split("@")[0] for s in specs]
        for needed in ("mpi", "kokkos", "hdf5", "boost", "cmake"):
            self.assertIn(needed, names, rel)
        self.assertIn("+mpi", next(s for s in specs if s.startswith("hdf5")))
        self.assertIn("+program_options", next(s for s in specs if s.startswith("boost")))
        self.assertTrue(doc["spack"]["concretizer"]["unify"])
        # The environment brings the recipe's repository itself (relative to the manifest).
        repos = doc["spack"].get("repos")
        self.assertIsInstance(repos, dict, f"{rel}: no repos: mapping for the meshtrain recipe")
        path = os.path.join(os.path.dirname(os.path.join(SRC, rel)), repos["meshtrain"])
        self.assertTrue(os.path.isfile(os.path.join(path, "repo.yaml")), f"{rel}: repos: {path}")
        return specs

    def test_cpu_environment(self):
        specs = self.check_env("spack.yaml")
        kokkos = next(s for s in specs if s.startswith("kokkos"))
        for v in ("@4.2:4.7", "~cuda", "cxxstd=20"):
            self.assertIn(v, kokkos)

    def test_cuda_environment(self):
        specs = self.check_env("spack-cuda.yaml")
        self.assertIn("meshtrain +cuda cuda_arch=90", specs)
        kokkos = next(s for s in specs if s.startswith("kokkos"))
        # The one Kokkos 4.6+ whose package enables the legacy View (see the recipe's conflicts).
        for v in ("@4.7.00", "+cuda", "+wrapper", "+cuda_lambda", "cuda_arch=90", "cxxstd=20"):
            self.assertIn(v, kokkos)
        self.assertIn("nccl cuda_arch=90", specs)
        cuda = next(s for s in specs if s.startswith("cuda@"))
        self.assertTrue(cuda.endswith(":12"), "Kokkos 4.7.00 conflicts with CUDA 13")

    def test_repo_layout(self):
        # Package API v2: <...>/spack_repo/<namespace>/repo.yaml, packages/<name>/package.py.
        doc = load_yaml("spack/spack_repo/meshtrain/repo.yaml")
        self.assertEqual(doc["repo"]["namespace"], "meshtrain")
        self.assertRegex(doc["repo"]["api"], r"^v2\.\d+$")
        self.assertEqual(os.path.basename(os.path.dirname(REPO)), "spack_repo")
        self.assertTrue(os.path.isfile(os.path.join(REPO, "packages", "meshtrain", "package.py")))
        index = load_yaml("spack-repo-index.yaml")
        self.assertEqual(index["repo_index"]["paths"], ["spack/spack_repo/meshtrain"])


class Recipe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        py_compile.compile(RECIPE, cfile=os.path.join(tempfile.mkdtemp(), "p.pyc"), doraise=True)
        cls.cls, cls.directives = load_recipe()
        cls.deps = {}
        for kind, args, kw in cls.directives:
            if kind == "depends_on":
                cls.deps.setdefault(norm(args[0]), []).append(
                    (norm(kw.get("when", "")), kw.get("type")))
        cls.conflicts = [(norm(a[0]), norm(kw.get("when", ""))) for k, a, kw in cls.directives
                         if k == "conflicts"]

    def cmake_args(self, spec, run_tests=False):
        pkg = self.cls(spec)
        pkg.run_tests = run_tests
        return pkg.cmake_args()

    def test_build_system(self):
        self.assertTrue(issubclass(self.cls, CMakePackage))
        self.assertTrue(issubclass(self.cls, CudaPackage))  # +cuda and cuda_arch variants

    def test_source_is_a_url_a_site_can_mirror(self):
        # Not the folder the recipe happens to live in (file://): a site overrides `git` with
        # package_attributes; `spack develop --path .` builds a checkout.
        self.assertTrue(self.cls.homepage.startswith("https://"))
        self.assertRegex(self.cls.git, r"^https://.+\.git$")
        versions = {a[0]: kw for k, a, kw in self.directives if k == "version"}
        self.assertEqual(versions["main"], {"branch": "main"})
        released = [v for v in versions if re.match(r"^\d+\.\d+\.\d+$", v)]
        self.assertTrue(released, "no numbered version")
        for v in released:
            self.assertRegex(versions[v].get("commit", ""), r"^[0-9a-f]{40}$", v)

    def test_license_is_the_files(self):
        # BSD 3-Clause (LICENSE, copyright "the meshtrain authors"); no maintainers() until the
        # project has people with published handles.
        licenses = [a for k, a, kw in self.directives if k == "license"]
        self.assertEqual(licenses, [("BSD-3-Clause",)])
        self.assertFalse([a for k, a, kw in self.directives if k == "maintainers"])
        with open("LICENSE") as f:
            text = f.read()
        self.assertTrue(text.startswith("BSD 3-Clause License"))
        self.assertIn("Copyright (c) 2026, the meshtrain authors", text)

    def test_dependencies(self):
        for dep in ("mpi", "blas", "pcre2", "zlib-api", "zstd", "protobuf"):
            self.assertIn(dep, self.deps)
        for prefix, must in (("hdf5", "+mpi"), ("boost", "+program_options")):
            match = [d for d in self.deps if d.startswith(prefix) and must in d]
            self.assertTrue(match, f"no depends_on({prefix} ... {must})")
        self.assertEqual(self.deps["cmake@3.25:"][0][1], "build")
        self.assertEqual(self.deps["pkgconfig"][0][1], "build")  # pkg_check_modules(PCRE2)
        self.assertIn("nlohmann-json@3:", self.deps)  # find_package(nlohmann_json 3 REQUIRED)
        # What ctest needs: Catch2, and python3 + PyYAML + shellcheck for the script tests.
        for dep in ("catch2@2.13:", "python@3.8:", "py-pyyaml", "shellcheck"):
            self.assertEqual(self.deps.get(dep, [(None, None)])[0][1], "test", dep)

    def test_kokkos_is_the_tested_range_in_cxx20(self):
        self.assertIn(("", None), self.deps.get("kokkos@4.2:4.7 +serial cxxstd=20", []))
        self.assertIn(("~cuda", None), self.deps.get("kokkos ~cuda", []))

    def test_cuda_arch_propagates_to_kokkos_with_lambdas_and_to_nccl(self):
        for arch in CudaPackage.cuda_arch_values:
            when = f"+cuda cuda_arch={arch}"
            kokkos = f"kokkos +cuda +wrapper +cuda_lambda cuda_arch={arch}"
            self.assertIn((when, None), self.deps.get(kokkos, []))
            self.assertIn((when, None), self.deps.get(f"nccl cuda_arch={arch}", []))
        self.assertIn(("+cuda", "cuda_arch=none"), self.conflicts)

    def test_cuda_refuses_kokkos_without_the_legacy_view(self):
        # Kokkos 4.6.x and 4.7.01+ build the mdspan View (the builtin package turns the legacy
        # one on for 4.7.00 only); 4.2-4.5 have only the legacy one.
        self.assertIn(("^kokkos@4.6", "+cuda"), self.conflicts)
        self.assertIn(("^kokkos@4.7.01:", "+cuda"), self.conflicts)
        self.assertFalse([c for c in self.conflicts if c[0] in ("^kokkos@4.7.00", "^kokkos@:4.5")])

    def test_cmake_args_cpu(self):
        args = self.cmake_args(meshtrain_spec())
        self.assertIn("-DMESHTRAIN_ENABLE_CUDA=OFF", args)
        self.assertIn("-DMESHTRAIN_ENABLE_NCCL=OFF", args)
        self.assertIn("-DMESHTRAIN_ENABLE_TESTS=OFF", args)
        self.assertFalse(any(a.startswith("-DCMAKE_CXX_COMPILER") for a in args))
        self.assertFalse(any(a.startswith("-DMPIEXEC_") for a in args))  # no tests, no flags

    def test_cmake_args_cuda_take_nvcc_wrapper_from_the_kokkos_package(self):
        # kokkos_cxx is on the package (self["kokkos"]); spec["kokkos"] has no such attribute.
        spec = meshtrain_spec(cuda=True)
        self.assertFalse(hasattr(spec["kokkos"], "kokkos_cxx"))
        args = self.cmake_args(spec)
        for a in ("-DMESHTRAIN_ENABLE_CUDA=ON", "-DMESHTRAIN_ENABLE_NCCL=ON",
                  "-DCMAKE_CXX_COMPILER=/kw/bin/nvcc_wrapper"):
            self.assertIn(a, args)
        # meshtrain enables no CUDA language: CMAKE_CUDA_ARCHITECTURES would go unused.
        self.assertFalse(any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in args))

    def test_cmake_args_hand_the_blas_provider_to_cmake(self):
        args = self.cmake_args(meshtrain_spec())
        self.assertIn("-DMESHTRAIN_BLAS_LIBRARIES=/ob/lib/libopenblas.so", args)
        self.assertIn("-DMESHTRAIN_BLAS_INCLUDE_DIRS=/ob/include", args)
        # Not headers.directories (/usr/include here): the folders that hold cblas.h.
        self.assertEqual(debian_openblas().package.headers.directories, ["/usr/include"])
        args = self.cmake_args(meshtrain_spec(blas=debian_openblas()))
        self.assertIn("-DMESHTRAIN_BLAS_INCLUDE_DIRS=/usr/include/x86_64-linux-gnu/"
                      "openblas-pthread;/usr/include/x86_64-linux-gnu", args)
        provider = mkl()
        args = self.cmake_args(meshtrain_spec(blas=provider))
        self.assertIn("-DMESHTRAIN_BLAS_LIBRARIES=/mkl/lib/libmkl_intel_lp64.so;"
                      "/mkl/lib/libmkl_sequential.so;/mkl/lib/libmkl_core.so;"
                      "/usr/lib/libpthread.so;/usr/lib/libm.so", args)
        self.assertIn("-DMESHTRAIN_BLAS_INCLUDE_DIRS=/mkl/include", args)  # mkl_cblas.h's
        # netlib keeps cblas in its own library: the recipe asks for the C interface.
        self.assertEqual(provider.last_query, ("blas", ("c",)))

    def test_cmake_args_let_mpi_tests_oversubscribe(self):
        args = self.cmake_args(meshtrain_spec(mpi="openmpi"), run_tests=True)
        self.assertIn("-DMESHTRAIN_ENABLE_TESTS=ON", args)
        self.assertIn("-DMPIEXEC_PREFLAGS=--oversubscribe", args)
        self.assertIn("-DMPIEXEC_MAX_NUMPROCS=8", args)
        args = self.cmake_args(meshtrain_spec(mpi="mpich"), run_tests=True)
        self.assertIn("-DMPIEXEC_MAX_NUMPROCS=8", args)
        self.assertFalse(any(a.startswith("-DMPIEXEC_PREFLAGS") for a in args))
        # An MPI we know nothing about keeps FindMPI's processor count and no flags.
        args = self.cmake_args(meshtrain_spec(mpi="cray-mpich"), run_tests=True)
        self.assertFalse(any(a.startswith("-DMPIEXEC_") for a in args))

    def test_standalone_test_runs_selfcheck(self):
        self.assertTrue(hasattr(self.cls, "test_selfcheck"), "no stand-alone test_selfcheck")
        self.assertTrue(self.cls.test_selfcheck.__doc__, "spack test list shows the docstring")
        root = ["--allow-run-as-root"]
        for mpi, uid, preflags in (("openmpi", 1000, ["--oversubscribe"]),
                                   ("openmpi", 0, ["--oversubscribe", *root]),
                                   ("mpich", 0, [])):
            del model.CALLS[:]
            model.Executable.output = "rank 0 ...\nselfcheck passed (2 ranks)\n"
            with unittest.mock.patch("os.geteuid", return_value=uid):
                self.cls(meshtrain_spec(mpi=mpi)).test_selfcheck()
            self.assertEqual(model.CALLS, [[f"/opt/{mpi}/bin/mpiexec", "-n", "2", *preflags,
                                            "/opt/mt/bin/meshtrain", "selfcheck"]])
        model.Executable.output = "selfcheck FAILED: all_reduce on tp\n"
        with self.assertRaises(AssertionError):
            self.cls(meshtrain_spec()).test_selfcheck()

    def test_run_environment_points_jobs_at_the_install(self):
        class Env(dict):
            def set(self, k, v):
                self[k] = v

        env = Env()
        self.cls(meshtrain_spec()).setup_run_environment(env)
        self.assertEqual(env["MESHTRAIN_HOME"], "/opt/mt/share/meshtrain")


if __name__ == "__main__":
    unittest.main(verbosity=2)
