"""Stand-in for spack_repo.builtin.build_systems.cuda: the +cuda and cuda_arch variants."""
from spack.package import variant
from spack_model import PackageBase


class CudaPackage(PackageBase):
    # A subset of Spack's list; the real class also depends on cuda when +cuda.
    cuda_arch_values = ("60", "70", "75", "80", "86", "89", "90", "90a", "100")
    variant("cuda", default=False, description="Build with CUDA")
    variant("cuda_arch", values=("none",) + cuda_arch_values, default="none", multi=True,
            description="CUDA architecture")
