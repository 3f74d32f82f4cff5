"""Build hook: compiles the C helpers (HAL dispatch, VM integer loops, libm over
arrays for VMVX) with cffi at install, and the HAL's C core (`hal/native/core.c`) as a
CPython extension.

The repository root is the package, so this file is also importable as `tinyhal.setup`
(and `help(tinyhal)` lists it): everything happens only when the build runs it as a
script, and importing it does nothing.
"""

if __name__ == "__main__":
    import importlib.util
    import os

    from setuptools import setup

    def _core_extension():
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hal", "native",
                            "core_build.py")
        spec = importlib.util.spec_from_file_location("tinyhal_core_build", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.extension()

    setup(cffi_modules=["hal/native/build.py:ffibuilder", "vm/scalar/build.py:ffibuilder",
                        "vm/mathlib/build.py:ffibuilder"],
          ext_modules=[_core_extension()])
