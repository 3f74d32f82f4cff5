"""Build hook: compiles the C helpers (HAL dispatch, VM integer loops) with cffi at install."""

from setuptools import setup

setup(cffi_modules=["hal/native/build.py:ffibuilder", "vm/scalar/build.py:ffibuilder"])
