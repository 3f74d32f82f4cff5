func.func @main(%x: tensor<2x4x15x13xf32>, %w: tensor<6x4x3x3xf32>) -> tensor<2x6x8x7xf32> {
  %z = arith.constant 0.0 : f32
  %p = tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %z : f32
  } : tensor<2x4x15x13xf32> to tensor<2x4x17x15xf32>
  %e = tensor.empty() : tensor<2x6x8x7xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x6x8x7xf32>) -> tensor<2x6x8x7xf32>
  %r = linalg.conv_2d_nchw_fchw {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>}
      ins(%p, %w : tensor<2x4x17x15xf32>, tensor<6x4x3x3xf32>) outs(%f : tensor<2x6x8x7xf32>) -> tensor<2x6x8x7xf32>
  return %r : tensor<2x6x8x7xf32>
}
