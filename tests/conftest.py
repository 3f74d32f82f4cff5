"""Shared test configuration.

The helper modules the suites share (`tests/support`, `tests/vm/programs`, ...) are on
`sys.path` through `pythonpath` in pyproject.toml, and test files are imported by path
(`--import-mode=importlib`), so nothing here depends on the checkout folder's name.
"""
