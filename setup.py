"""Build hook: compiles the C helpers (HAL dispatch, VM integer loops, libm over
arrays for VMVX) with cffi at install."""

from setuptools import setup

setup(cffi_modules=["hal/native/build.py:ffibuilder", "vm/scalar/build.py:ffibuilder",
                    "vm/mathlib/build.py:ffibuilder"])
