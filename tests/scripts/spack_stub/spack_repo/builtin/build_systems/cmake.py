"""Stand-in for spack_repo.builtin.build_systems.cmake: CMakePackage, no build phases."""
from spack_model import PackageBase


class CMakePackage(PackageBase):
    pass
