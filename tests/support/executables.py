"""MLIR sources of the executables the HAL tests dispatch, compiled as hal-executables.

Each source is a `hal.executable.source` with explicit pipeline layouts, compiled by the
pinned iree-compile with `--compile-mode=hal-executable` for this host, either as the
default embedded ELF or as a system ELF (`--iree-llvmcpu-link-embedded=false`).
"""

from __future__ import annotations

from .iree_tools import compile_mlir

_LAYOUT_2C_3B = """#layout = #hal.pipeline.layout<constants = 2, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer, ReadOnly>,
  #hal.pipeline.binding<storage_buffer>
]>"""

# out[i] = in0[i] * bitcast<f32>(c0) + in1[i] + float(c1), four elements per workgroup,
# workgroups laid out over a 3D grid: linear id = (z * ny + y) * nx + x.
ELEMENTWISE_3D = _LAYOUT_2C_3B + """
hal.executable.source public @elementwise {
  hal.executable.export public @fma_3d ordinal(0) layout(#layout)
      count(%device: !hal.device, %x: index, %y: index, %z: index) -> (index, index, index) {
    hal.return %x, %y, %z : index, index, index
  }
  builtin.module {
    func.func @fma_3d() {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c4 = arith.constant 4 : index
      %k0 = hal.interface.constant.load layout(#layout) ordinal(0) : i32
      %k1 = hal.interface.constant.load layout(#layout) ordinal(1) : i32
      %scale = arith.bitcast %k0 : i32 to f32
      %bias = arith.sitofp %k1 : i32 to f32
      %x = hal.interface.workgroup.id[0] : index
      %y = hal.interface.workgroup.id[1] : index
      %z = hal.interface.workgroup.id[2] : index
      %nx = hal.interface.workgroup.count[0] : index
      %ny = hal.interface.workgroup.count[1] : index
      %nz = hal.interface.workgroup.count[2] : index
      %zy = arith.muli %z, %ny : index
      %zyy = arith.addi %zy, %y : index
      %row = arith.muli %zyy, %nx : index
      %lin = arith.addi %row, %x : index
      %base = arith.muli %lin, %c4 : index
      %nxy = arith.muli %nx, %ny : index
      %nxyz = arith.muli %nxy, %nz : index
      %n = arith.muli %nxyz, %c4 : index
      %a = hal.interface.binding.subspan layout(#layout) binding(0) alignment(64) offset(%c0)
          flags(ReadOnly) : memref<?xf32>{%n}
      %b = hal.interface.binding.subspan layout(#layout) binding(1) alignment(64) offset(%c0)
          flags(ReadOnly) : memref<?xf32>{%n}
      %o = hal.interface.binding.subspan layout(#layout) binding(2) alignment(64) offset(%c0)
          : memref<?xf32>{%n}
      scf.for %i = %c0 to %c4 step %c1 {
        %j = arith.addi %base, %i : index
        %va = memref.load %a[%j] : memref<?xf32>
        %vb = memref.load %b[%j] : memref<?xf32>
        %m = arith.mulf %va, %scale : f32
        %s = arith.addf %m, %vb : f32
        %r = arith.addf %s, %bias : f32
        memref.store %r, %o[%j] : memref<?xf32>
      }
      return
    }
  }
}
"""

# Returns a non-zero status from every workgroup: drives the failure path.
FAILING = """#layout = #hal.pipeline.layout<bindings = [
  #hal.pipeline.binding<storage_buffer>
]>
hal.executable.source public @failing {
  hal.executable.export public @store_then_trap ordinal(0) layout(#layout)
      count(%device: !hal.device) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    hal.return %c1, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @store_then_trap() {
      %c0 = arith.constant 0 : index
      %o = hal.interface.binding.subspan layout(#layout) binding(0) alignment(64) offset(%c0)
          : memref<4xi32>
      %v = arith.constant 7 : i32
      memref.store %v, %o[%c0] : memref<4xi32>
      return
    }
  }
}
"""

SOURCES = {"elementwise_3d": ELEMENTWISE_3D}

HOST_EXECUTABLE_FLAGS = [
    "--compile-mode=hal-executable",
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
]


def compile_executable(name: str, embedded: bool = True) -> bytes:
    """The named executable's library bytes, compiled once per content hash."""
    flags = list(HOST_EXECUTABLE_FLAGS)
    if not embedded:
        flags.append("--iree-llvmcpu-link-embedded=false")
    path = compile_mlir(SOURCES[name], flags, suffix=".so")
    return path.read_bytes()
