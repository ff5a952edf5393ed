# Spack recipe for meshtrain. `spack repo add spack/repo` from the checkout, then
#   spack install meshtrain                       # CPU: Kokkos Serial, MPI, parallel HDF5, BLAS
#   spack install meshtrain +cuda cuda_arch=90    # GPU: Kokkos CUDA (nvcc_wrapper), NCCL, cuBLAS
# The `main` version clones this checkout (file:// URL derived from this file's location), so
# no network URL is needed; `spack develop` works on the checkout in place.
import os

from spack.package import *

try:  # Spack >= 1.0: the build systems live in the builtin package repository
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.x: spack.package exports them
    pass

_CHECKOUT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))


class Meshtrain(CMakePackage, CudaPackage):
    """MPI-native GPT trainer: data, pipeline and tensor parallelism with ZeRO over Kokkos
    kernels, NCCL or MPI collectives, and parallel HDF5 checkpoints."""

    git = "file://" + _CHECKOUT

    version("main", branch="main")  # the checkout's committed main branch

    # Language dependencies (Spack >= 0.23); a C++20 compiler; CMake with presets version 6.
    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.25:", type="build")

    depends_on("mpi")
    depends_on("hdf5@1.10: +mpi")  # checkpoints are written collectively through MPI-IO
    depends_on("boost@1.70: +program_options")
    depends_on("nlohmann-json")
    depends_on("blas")
    depends_on("pcre2")
    depends_on("catch2@2.13:", type="test")

    depends_on("kokkos@4: +serial")
    depends_on("kokkos ~cuda", when="~cuda")
    # GPU builds: Kokkos compiles for the same architecture through its nvcc_wrapper, NCCL for the
    # collectives (cuBLAS comes with cuda, which CudaPackage adds).
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos +cuda +wrapper cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
        depends_on(f"nccl cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    depends_on("nccl@2.18:", when="+cuda")
    conflicts("+cuda", when="cuda_arch=none",
              msg="meshtrain +cuda needs cuda_arch (e.g. 90 for Hopper)")

    def cmake_args(self):
        args = [
            self.define_from_variant("MESHTRAIN_ENABLE_CUDA", "cuda"),
            self.define_from_variant("MESHTRAIN_ENABLE_NCCL", "cuda"),
            self.define("MESHTRAIN_ENABLE_TESTS", self.run_tests),
            self.define("MESHTRAIN_ENABLE_PERF", False),
        ]
        if self.spec.satisfies("+cuda"):
            archs = self.spec.variants["cuda_arch"].value
            args += [
                self.define("CMAKE_CXX_COMPILER", self.spec["kokkos"].kokkos_cxx),
                self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)),
            ]
        return args

    def setup_run_environment(self, env):
        # The Slurm scripts find their library and this executable from here (README, Slurm).
        env.set("MESHTRAIN_HOME", self.prefix.share.meshtrain)
