"""A stand-in for `spack.package`: the directives record their arguments in DIRECTIVES instead of
building a package model, so tests can import a recipe without Spack and check what it declares.
Only what meshtrain's recipe uses is here (CMakePackage, CudaPackage, the directives, a spec
that answers `satisfies` for cmake_args)."""

DIRECTIVES = []


def _directive(kind):
    def record(*args, **kwargs):
        DIRECTIVES.append((kind, args, kwargs))

    record.__name__ = kind
    return record


version = _directive("version")
variant = _directive("variant")
depends_on = _directive("depends_on")
conflicts = _directive("conflicts")
requires = _directive("requires")
provides = _directive("provides")
patch = _directive("patch")
resource = _directive("resource")
license = _directive("license")
maintainers = _directive("maintainers")


class Variant:
    def __init__(self, value):
        self.value = value


class FakeSpec:
    """A concrete spec reduced to a set of constraints it satisfies, plus variant values."""

    def __init__(self, satisfied=(), variants=None, deps=None):
        self._satisfied = set(satisfied)
        self.variants = {k: Variant(v) for k, v in (variants or {}).items()}
        self._deps = deps or {}

    def satisfies(self, constraint):
        return all(part in self._satisfied for part in constraint.split())

    def __contains__(self, constraint):
        return self.satisfies(constraint)

    def __getitem__(self, name):
        return self._deps[name]


class PackageBase:
    run_tests = False

    def __init__(self, spec):
        self.spec = spec

    @staticmethod
    def define(name, value):
        if isinstance(value, bool):
            value = "ON" if value else "OFF"
        elif isinstance(value, (list, tuple)):
            value = ";".join(str(v) for v in value)
        return f"-D{name}={value}"

    def define_from_variant(self, name, variant):
        return self.define(name, self.spec.satisfies(f"+{variant}"))


class CMakePackage(PackageBase):
    pass


class CudaPackage(PackageBase):
    # A subset of Spack's list; the real class also declares the `cuda` and `cuda_arch` variants
    # and depends on cuda when +cuda.
    cuda_arch_values = ("60", "70", "75", "80", "86", "89", "90", "90a", "100")
    variant("cuda", default=False, description="Build with CUDA")
    variant("cuda_arch", values=("none",) + cuda_arch_values, default="none", multi=True,
            description="CUDA architecture")


__all__ = [n for n in dir() if not n.startswith("_")]
