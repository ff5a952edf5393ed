# Spack recipe for meshtrain (package API v2: Spack >= 1.0 with the spack-packages builtin repo).
#   spack repo add spack/spack_repo/meshtrain     # once, from a checkout (or the environments)
#   spack install meshtrain                       # CPU: Kokkos Serial, MPI, parallel HDF5, CBLAS
#   spack install meshtrain +cuda cuda_arch=90    # GPU: Kokkos CUDA (nvcc_wrapper), NCCL, cuBLAS
# The `git` URL below is a placeholder: a site points it at its mirror of the repository in
# packages.yaml (`packages: meshtrain: package_attributes: git: ...`, docs/spack.md). To build a
# checkout as it is, use `spack develop --path . meshtrain@main` in an environment instead.
import os

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage

from spack.package import *


class Meshtrain(CMakePackage, CudaPackage):
    """MPI-native GPT trainer: data, pipeline and tensor parallelism with ZeRO over Kokkos
    kernels, NCCL or MPI collectives, and parallel HDF5 checkpoints."""

    homepage = "https://meshtrain.example.org"
    git = "https://git.example.org/meshtrain/meshtrain.git"

    # BSD 3-Clause (LICENSE). No maintainers() yet: the project has no published GitHub
    # handles, and Spack's package review asks for them before a recipe goes upstream.
    license("BSD-3-Clause")

    version("main", branch="main")
    # project(VERSION 0.1.0) of CMakeLists.txt at this commit of main. A release adds
    # tag="v<version>" next to its commit, so that Spack checks the tag still points there.
    version("0.1.0", commit="e013ac7bfb7790aa3dd0266c4dc9635ce0a7027d")

    # Language dependencies; a C++20 compiler; CMake with presets version 6.
    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.25:", type="build")
    depends_on("pkgconfig", type="build")  # CMakeLists finds PCRE2 through pkg-config

    depends_on("mpi")
    depends_on("hdf5@1.10: +mpi")  # checkpoints are written collectively through MPI-IO
    depends_on("boost@1.70: +program_options")
    depends_on("nlohmann-json@3:")  # find_package(nlohmann_json 3 REQUIRED)
    depends_on("pcre2")  # tokenizer pre-tokenizer regexes (libpcre2-8)
    depends_on("zlib-api")  # prep: .gz corpora (find_package(ZLIB))
    depends_on("zstd")  # prep: .zst corpora (libzstd through pkg-config)
    depends_on("protobuf")  # TensorBoard event files: protoc at build time, the runtime library
    depends_on("blas")  # with the C interface: spec["blas:c"] is handed to CMake, see cmake_args

    # `ctest` (spack install --test=root): Catch2 for the unit and MPI tests; python3 with
    # PyYAML and shellcheck for the script tests (jobs/, the Spack files, the scaling driver).
    depends_on("catch2@2.13:", type="test")
    depends_on("python@3.8:", type="test")
    depends_on("py-pyyaml", type="test")
    depends_on("shellcheck", type="test")

    # Kokkos 4.2-4.7 in C++20 like meshtrain (Kokkos 4 defaults to cxxstd=17): the GPU build
    # is tested with a 4.6.99 snapshot (legacy View), the CPU build with Debian's 3.4, which
    # Spack does not have; a Serial Kokkos 4 build needs the half-type fix of docs/spack.md.
    # Widen the range only when a version has been tested; Kokkos 5 also drops the cuda_lambda
    # variant (lambdas are always on there).
    depends_on("kokkos@4.2:4.7 +serial cxxstd=20")
    depends_on("kokkos ~cuda", when="~cuda")
    # GPU builds: Kokkos compiles for the same architecture through its nvcc_wrapper, with
    # device lambdas (meshtrain's kernels are KOKKOS_LAMBDAs); NCCL for the collectives (cuBLAS
    # comes with cuda, which CudaPackage adds).
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(
            f"kokkos +cuda +wrapper +cuda_lambda cuda_arch={_arch}",
            when=f"+cuda cuda_arch={_arch}",
        )
        depends_on(f"nccl cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    depends_on("nccl@2.18:", when="+cuda")
    conflicts("+cuda", when="cuda_arch=none", msg="meshtrain +cuda needs cuda_arch (90: Hopper)")
    # Kokkos 4.6 made the mdspan-based View the default; nvcc lays its [[no_unique_address]]
    # members out differently in host and device code, so kernels read garbage pointers (seen on
    # an H200, Kokkos 4.6, CUDA 13.0). meshtrain needs Kokkos_ENABLE_IMPL_VIEW_LEGACY=ON there,
    # which the builtin kokkos package sets only for 4.7.00 and offers no variant for. So +cuda
    # takes Kokkos 4.2-4.5 (legacy View only) or 4.7.00; other versions: README, "GPU build".
    _legacy_view_msg = (
        "meshtrain +cuda needs the legacy Kokkos View (Kokkos_ENABLE_IMPL_VIEW_LEGACY=ON) with "
        "Kokkos 4.6+, which the kokkos package enables only for 4.7.00: use ^kokkos@4.7.00 or "
        "^kokkos@:4.5, or build Kokkos by hand as README 'GPU build' says"
    )
    conflicts("^kokkos@4.6", when="+cuda", msg=_legacy_view_msg)
    conflicts("^kokkos@4.7.01:", when="+cuda", msg=_legacy_view_msg)

    def cmake_args(self):
        blas = self.spec["blas:c"]  # the "c" query: netlib's libcblas next to libblas
        args = [
            self.define_from_variant("MESHTRAIN_ENABLE_CUDA", "cuda"),
            self.define_from_variant("MESHTRAIN_ENABLE_NCCL", "cuda"),
            self.define("MESHTRAIN_ENABLE_TESTS", self.run_tests),
            self.define("MESHTRAIN_ENABLE_PERF", False),
            # The provider Spack chose, exactly (cmake/MeshtrainBlas.cmake): FindBLAS would
            # look for OpenBLAS first and might pick up another BLAS on the system.
            self.define("MESHTRAIN_BLAS_LIBRARIES", blas.libs.joined(";")),
            self.define("MESHTRAIN_BLAS_INCLUDE_DIRS", self._cblas_header_dirs(blas.headers)),
        ]
        if self.spec.satisfies("+cuda"):
            # kokkos_cxx is a property of the kokkos package (nvcc_wrapper with +wrapper), not
            # of its spec: self["kokkos"] is the package.
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
        if self.run_tests:
            args += self._mpi_test_args()
        return args

    @staticmethod
    def _cblas_header_dirs(headers):
        """The folders holding the provider's cblas.h (or oneMKL's mkl_cblas.h), in its order.
        Not headers.directories: Spack cuts those at `include`, which for Debian's OpenBLAS
        (include/x86_64-linux-gnu/openblas-pthread/cblas.h) names a folder without the header."""
        dirs = []
        for h in headers:
            d = os.path.dirname(h)
            if os.path.basename(h) in ("cblas.h", "mkl_cblas.h") and d not in dirs:
                dirs.append(d)
        return dirs or headers.directories

    def _mpi_test_args(self):
        """MPI tests run up to 8 ranks on whatever node builds (MeshtrainTesting.cmake registers
        none above MPIEXEC_MAX_NUMPROCS). Open MPI refuses more ranks than slots unless told;
        MPICH's hydra oversubscribes by itself. Other MPIs keep FindMPI's processor count."""
        if self.spec.satisfies("^openmpi"):
            return [
                self.define("MPIEXEC_PREFLAGS", "--oversubscribe"),
                self.define("MPIEXEC_MAX_NUMPROCS", 8),
            ]
        if self.spec.satisfies("^mpich"):
            return [self.define("MPIEXEC_MAX_NUMPROCS", 8)]
        return []

    def _mpiexec_preflags(self):
        """The stand-alone test's mpiexec flags: Open MPI oversubscribes small nodes, and refuses
        to run as root (container builds, CI) unless told; `spack test run` does not pass the
        caller's OMPI_ALLOW_RUN_AS_ROOT through, so say it on the command line."""
        if not self.spec.satisfies("^openmpi"):
            return []
        return ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])

    def test_selfcheck(self):
        """run `meshtrain selfcheck` on 2 ranks: the mesh, and every collective of every backend
        of the build (run it on a GPU node for +cuda)"""
        mpiexec = which(self.spec["mpi"].prefix.bin.mpiexec, required=True)
        out = mpiexec(
            "-n", "2", *self._mpiexec_preflags(), self.prefix.bin.meshtrain, "selfcheck",
            output=str.split, error=str.split,
        )
        assert "selfcheck passed" in out, f"meshtrain selfcheck did not pass:\n{out}"

    def setup_run_environment(self, env):
        # The Slurm scripts find their library and this executable from here (README, Slurm).
        env.set("MESHTRAIN_HOME", self.prefix.share.meshtrain)
