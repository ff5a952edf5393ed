"""Stand-in for Spack, just enough to import package recipes in tests (tests/scripts/test_spack.py)."""
