"""Stand-in for the spack-packages builtin repository: only its build systems (tests/scripts)."""
