"""Build hook: compiles the C dispatch helper with cffi when the package is installed."""

from setuptools import setup

setup(cffi_modules=["hal/native/build.py:ffibuilder"])
