"""Spack files: the environments and repo.yaml parse as YAML with the shapes Spack expects, and the
recipe compiles and, imported against a stub `spack.package` (tests/scripts/spack_stub), declares
the variants, dependencies and CMake arguments the README promises.
    python3 tests/scripts/test_spack.py SOURCE_DIR"""
import importlib.util
import os
import py_compile
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean (tests run in it)

import yaml

SRC = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else ".")
RECIPE = os.path.join(SRC, "spack", "repo", "packages", "meshtrain", "package.py")
sys.path.insert(0, os.path.join(SRC, "tests", "scripts", "spack_stub"))
import spack.package as stub  # noqa: E402  (the stub, first on the path)


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
        return specs

    def test_cpu_environment(self):
        specs = self.check_env("spack.yaml")
        kokkos = next(s for s in specs if s.startswith("kokkos"))
        self.assertIn("~cuda", kokkos)

    def test_cuda_environment(self):
        specs = self.check_env("spack-cuda.yaml")
        self.assertIn("meshtrain +cuda cuda_arch=90", specs)
        kokkos = next(s for s in specs if s.startswith("kokkos"))
        for v in ("+cuda", "+wrapper", "cuda_arch=90"):
            self.assertIn(v, kokkos)
        self.assertIn("nccl cuda_arch=90", specs)

    def test_repo_yaml(self):
        doc = load_yaml("spack/repo/repo.yaml")
        self.assertEqual(doc["repo"]["namespace"], "meshtrain")
        self.assertTrue(os.path.isfile(RECIPE))


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

    def test_build_system(self):
        self.assertTrue(issubclass(self.cls, stub.CMakePackage))
        self.assertTrue(issubclass(self.cls, stub.CudaPackage))  # +cuda and cuda_arch variants
        versions = [a[0] for k, a, _ in self.directives if k == "version"]
        self.assertIn("main", versions)
        self.assertTrue(self.cls.git.startswith("file://"))
        self.assertTrue(os.path.isfile(os.path.join(self.cls.git[len("file://"):], "CMakeLists.txt")),
                        "the recipe's git URL must be this checkout")

    def test_dependencies(self):
        for dep in ("mpi", "blas"):
            self.assertIn(dep, self.deps)
        for prefix, must in (("hdf5", "+mpi"), ("boost", "+program_options"), ("kokkos@4:", "")):
            match = [d for d in self.deps if d.startswith(prefix) and must in d]
            self.assertTrue(match, f"no depends_on({prefix} ... {must})")
        self.assertEqual(self.deps["cmake@3.25:"][0][1], "build")
        self.assertIn("nlohmann-json", self.deps)  # find_package(nlohmann_json 3 REQUIRED)
        catch2 = [d for d in self.deps if d.startswith("catch2")]
        self.assertTrue(catch2)
        self.assertEqual(self.deps[catch2[0]][0][1], "test")

    def test_cuda_arch_propagates_to_kokkos_and_nccl(self):
        for arch in stub.CudaPackage.cuda_arch_values:
            when = f"+cuda cuda_arch={arch}"
            self.assertIn((when, None), self.deps.get(f"kokkos +cuda +wrapper cuda_arch={arch}", []))
            self.assertIn((when, None), self.deps.get(f"nccl cuda_arch={arch}", []))
        conflicts = [(a[0], kw.get("when")) for k, a, kw in self.directives if k == "conflicts"]
        self.assertIn(("+cuda", "cuda_arch=none"), conflicts)

    def test_cmake_args_cpu(self):
        pkg = self.cls(stub.FakeSpec({"~cuda"}))
        args = pkg.cmake_args()
        self.assertIn("-DMESHTRAIN_ENABLE_CUDA=OFF", args)
        self.assertIn("-DMESHTRAIN_ENABLE_NCCL=OFF", args)
        self.assertIn("-DMESHTRAIN_ENABLE_TESTS=OFF", args)
        self.assertFalse(any(a.startswith("-DCMAKE_CXX_COMPILER") for a in args))

    def test_cmake_args_cuda(self):
        kokkos = type("Kokkos", (), {"kokkos_cxx": "/k/bin/nvcc_wrapper"})()
        pkg = self.cls(stub.FakeSpec({"+cuda"}, {"cuda_arch": ("90",)}, {"kokkos": kokkos}))
        args = pkg.cmake_args()
        for a in ("-DMESHTRAIN_ENABLE_CUDA=ON", "-DMESHTRAIN_ENABLE_NCCL=ON",
                  "-DCMAKE_CXX_COMPILER=/k/bin/nvcc_wrapper", "-DCMAKE_CUDA_ARCHITECTURES=90"):
            self.assertIn(a, args)

    def test_run_environment_points_jobs_at_the_install(self):
        class Prefix(str):
            def __getattr__(self, name):
                return Prefix(os.path.join(self, name))

        class Env(dict):
            def set(self, k, v):
                self[k] = v

        pkg = self.cls(stub.FakeSpec())
        pkg.prefix = Prefix("/opt/mt")
        env = Env()
        pkg.setup_run_environment(env)
        self.assertEqual(env["MESHTRAIN_HOME"], "/opt/mt/share/meshtrain")


if __name__ == "__main__":
    unittest.main(verbosity=2)
