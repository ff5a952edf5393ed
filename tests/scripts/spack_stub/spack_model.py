"""The part of Spack's object model that package recipes touch, small enough to read, shaped like
the real one where recipes go wrong:
  - a package has a spec (`self.spec`); `self["dep"]` is the dependency's *package*, and
    `self.spec["dep"]` its *spec*. Properties such as kokkos' `kokkos_cxx` live on the package
    only: asking the spec raises AttributeError, as Spack's Spec does.
  - `spec["virtual:param"]` finds the provider of a virtual (blas, mpi) and records the query;
    `.libs` / `.headers` of the result are the provider package's (`blas_libs` first).
  - `spec.satisfies(...)` answers for `+v`, `~v`, `name=value` and `^dep` (by name).
  - `which(path)` returns an executable that records its calls in CALLS and prints `output`.
"""
import os
import re

DIRECTIVES = []  # (kind, args, kwargs) of every directive, in the order a recipe declared them
CALLS = []  # [argv] of every executable run through which()


class Prefix(str):
    """Spack's Prefix: attribute access joins path components (prefix.bin.meshtrain)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Prefix(os.path.join(self, name))


class LibraryList(list):
    def joined(self, separator=" "):
        return separator.join(self)

    @property
    def directories(self):
        return sorted({os.path.dirname(p) for p in self})


class HeaderList(list):
    """Spack's HeaderList: `directories` are the files' folders cut after an `include` component
    (.../include/x86_64-linux-gnu/cblas.h gives .../include), unless a package sets them."""

    def __init__(self, files, directories=None):
        super().__init__(files)
        if directories is None:
            directories = []
            for f in files:
                d = re.sub(r"^(.*?\binclude\b).*$", r"\1", os.path.dirname(f))
                if d not in directories:
                    directories.append(d)
        self.directories = directories


class Variant:
    def __init__(self, value):
        self.value = value


class DependencyPackage:
    """The package object of a dependency: whatever attributes a test gives it."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


class Spec:
    def __init__(self, name, variants=None, deps=(), provides=(), package=None, prefix=None):
        self.name = name
        self.variants = {k: Variant(v) for k, v in (variants or {}).items()}
        self._deps = list(deps)
        self.provides = set(provides)
        self.package = package
        self.prefix = Prefix(prefix or f"/opt/{name}")
        self.last_query = None

    def _variant_is(self, name, value):
        var = self.variants.get(name)
        if var is None:
            return False
        if isinstance(var.value, bool):
            return var.value == value
        values = var.value if isinstance(var.value, (tuple, list)) else (var.value,)
        return value in values

    def _satisfies_one(self, token):
        if token.startswith("^"):
            return any(d.name == token[1:] for d in self.traverse())
        if token[0] in "+~":
            return self._variant_is(token[1:], token[0] == "+")
        if "=" in token:
            name, value = token.split("=", 1)
            return self._variant_is(name, value)
        raise NotImplementedError(f"stub Spec.satisfies cannot answer {token!r}")

    def satisfies(self, constraint):
        return all(self._satisfies_one(t) for t in constraint.split())

    def __contains__(self, constraint):
        return self.satisfies(constraint)

    def traverse(self):
        for d in self._deps:
            yield d
            yield from d.traverse()

    def __getitem__(self, query):
        name, _, params = query.partition(":")
        for d in self.traverse():
            if d.name == name or name in d.provides:
                d.last_query = (name, tuple(p for p in params.split(",") if p))
                return d
        raise KeyError(f"no dependency {name!r} in the stub spec of {self.name}")

    # Spack forwards these queries to the provider's package (blas_libs before libs for blas).
    @property
    def libs(self):
        virtual = self.last_query[0] if self.last_query else self.name
        return getattr(self.package, f"{virtual}_libs", None) or self.package.libs

    @property
    def headers(self):
        return self.package.headers


class PackageBase:
    run_tests = False

    def __init__(self, spec):
        self.spec = spec
        self.prefix = spec.prefix

    def __getitem__(self, name):
        """Spack's PackageBase.__getitem__: the dependency's package, not its spec."""
        return self.spec[name].package

    @staticmethod
    def define(name, value):
        if isinstance(value, bool):
            value = "ON" if value else "OFF"
        elif isinstance(value, (list, tuple)):
            value = ";".join(str(v) for v in value)
        return f"-D{name}={value}"

    def define_from_variant(self, name, variant):
        return self.define(name, self.spec.satisfies(f"+{variant}"))


class Executable:
    output = ""  # what every run prints; tests set it

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, *args, output=None, error=None, **kwargs):
        CALLS.append([self.path, *[str(a) for a in args]])
        return Executable.output if output is str.split or output is str else None


def which(*names, required=False):
    return Executable(names[0])
