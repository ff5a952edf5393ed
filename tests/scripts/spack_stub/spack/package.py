"""A stand-in for `spack.package`: the directives record their arguments in DIRECTIVES instead of
building a package model, so tests can import a recipe without Spack and check what it declares.
The objects a recipe's methods see are shaped like Spack's (spack_model.py): a package's spec,
`self["dep"]` for a dependency's package, `spec["dep"]` for its spec, `spec["blas:c"].libs`.
As in Spack >= 1.0, the build systems are not here but in spack_repo.builtin.build_systems."""

from spack_model import (  # noqa: F401  (re-exported to recipes)
    DIRECTIVES,
    HeaderList,
    LibraryList,
    PackageBase,
    Prefix,
    Spec,
    which,
)


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

__all__ = [n for n in dir() if not n.startswith("_")]
