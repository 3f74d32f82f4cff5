// A host loop over rows with slices and inserts: many small dispatches per call.
func.func @main(%x: tensor<6x5xf32>) -> tensor<6x5xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c6 = arith.constant 6 : index
  %r = scf.for %i = %c1 to %c6 step %c1 iter_args(%acc = %x) -> tensor<6x5xf32> {
    %im1 = arith.subi %i, %c1 : index
    %prev = tensor.extract_slice %acc[%im1, 0] [1, 5] [1, 1] : tensor<6x5xf32> to tensor<1x5xf32>
    %cur = tensor.extract_slice %acc[%i, 0] [1, 5] [1, 1] : tensor<6x5xf32> to tensor<1x5xf32>
    %s = arith.addf %prev, %cur : tensor<1x5xf32>
    %n = tensor.insert_slice %s into %acc[%i, 0] [1, 5] [1, 1] : tensor<1x5xf32> into tensor<6x5xf32>
    scf.yield %n : tensor<6x5xf32>
  }
  return %r : tensor<6x5xf32>
}
