"""Golden Core listings; each was checked against the corresponding listing of the paper."""

EXPECTED = {
    "value_tiling_of_x": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %x_1 = loop "B" [#tile<0>] (%rB: range<4>) {
    %0 = slice 0 %x[%rB] : tensor<64x8xf32>
    yield %0 : tensor<64x8xf32>
  } : tensor<256x8xf32>
  %1 = matmul(%x_1, %w1) : tensor<256x16xf32>
  %2 = matmul(%1, %w2) : tensor<256x8xf32>
  return %2 : tensor<256x8xf32>
}
""",
    "tiling_of_x1": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %x1 = matmul(%x, %w1) : tensor<256x16xf32>
  %x1_1 = loop "B" [#tile<0>] (%rB: range<4>) {
    %0 = slice 0 %x1[%rB] : tensor<64x16xf32>
    yield %0 : tensor<64x16xf32>
  } : tensor<256x16xf32>
  %1 = matmul(%x1_1, %w2) : tensor<256x8xf32>
  return %1 : tensor<256x8xf32>
}
""",
    "propagation_unfused": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %x1 = loop "B" [#tile<0>] (%rB: range<4>) {
    %0 = slice 0 %x[%rB] : tensor<64x8xf32>
    %x1_1 = matmul(%0, %w1) : tensor<64x16xf32>
    yield %x1_1 : tensor<64x16xf32>
  } : tensor<256x16xf32>
  %x1_2 = loop "B" [#tile<0>] (%rB_1: range<4>) {
    %1 = slice 0 %x1[%rB_1] : tensor<64x16xf32>
    yield %1 : tensor<64x16xf32>
  } : tensor<256x16xf32>
  %2 = loop "B" [#tile<0>] (%rB_2: range<4>) {
    %3 = slice 0 %x1_2[%rB_2] : tensor<64x16xf32>
    %4 = matmul(%3, %w2) : tensor<64x8xf32>
    yield %4 : tensor<64x8xf32>
  } : tensor<256x8xf32>
  return %2 : tensor<256x8xf32>
}
""",
    "propagation_fused": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %0 = loop "B" [#tile<0>] (%rB: range<4>) {
    %1 = slice 0 %x[%rB] : tensor<64x8xf32>
    %x1 = matmul(%1, %w1) : tensor<64x16xf32>
    %2 = matmul(%x1, %w2) : tensor<64x8xf32>
    yield %2 : tensor<64x8xf32>
  } : tensor<256x8xf32>
  return %0 : tensor<256x8xf32>
}
""",
    "inference_from_w2": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %0 = loop "B" [#tile<0>] (%rB: range<4>) {
    %1 = loop "M" [#sum] (%rM: range<2>) {
      %2 = slice 0 %x[%rB] : tensor<64x8xf32>
      %3 = slice 1 %w1[%rM] : tensor<8x8xf32>
      %4 = matmul(%2, %3) : tensor<64x8xf32>
      %5 = slice 0 %w2[%rM] : tensor<8x8xf32>
      %6 = matmul(%4, %5) : tensor<64x8xf32>
      yield %6 : tensor<64x8xf32>
    } : tensor<64x8xf32>
    yield %1 : tensor<64x8xf32>
  } : tensor<256x8xf32>
  return %0 : tensor<256x8xf32>
}
""",
    "conflict_x_w1": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %x_1, %w1_1 = loop "B" [#tile<0>, #tile<1>] (%rB: range<4>) {
    %0 = slice 0 %x[%rB] : tensor<64x8xf32>
    %1 = slice 1 %w1[%rB] : tensor<8x4xf32>
    yield %0, %1 : tensor<64x8xf32>, tensor<8x4xf32>
  } : tensor<256x8xf32>, tensor<8x16xf32>
  %2 = matmul(%x_1, %w1_1) : tensor<256x16xf32>
  %3 = matmul(%2, %w2) : tensor<256x8xf32>
  return %3 : tensor<256x8xf32>
}
""",
    "conflict_resolved_incrementally": """\
func @chain(%x: tensor<256x8xf32>,
    %w1: tensor<8x16xf32>,
    %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2}} {
  %w1_1 = loop "B" [#tile<1>] (%rB: range<4>) {
    %0 = slice 1 %w1[%rB] : tensor<8x4xf32>
    yield %0 : tensor<8x4xf32>
  } : tensor<8x16xf32>
  %1 = loop "B" [#tile<0>] (%rB_1: range<4>) {
    %2 = slice 0 %x[%rB_1] : tensor<64x8xf32>
    %3 = matmul(%2, %w1_1) : tensor<64x16xf32>
    %4 = matmul(%3, %w2) : tensor<64x8xf32>
    yield %4 : tensor<64x8xf32>
  } : tensor<256x8xf32>
  return %1 : tensor<256x8xf32>
}
""",
    "deep_tiling": """\
func @mm(%x: tensor<8x64xf32>,
    %w: tensor<64x4xf32>) attributes {mesh={"a":4, "b":2}} {
  %x_1 = loop "a" [#tile<1>] (%ra: range<4>) {
    %0 = loop "b" [#tile<1>] (%rb: range<2>) {
      %1 = slice 1 %x[%ra] : tensor<8x16xf32>
      %2 = slice 1 %1[%rb] : tensor<8x8xf32>
      yield %2 : tensor<8x8xf32>
    } : tensor<8x16xf32>
    yield %0 : tensor<8x16xf32>
  } : tensor<8x64xf32>
  %3 = loop "a" [#sum] (%ra_1: range<4>) {
    %4 = slice 0 %w[%ra_1] : tensor<16x4xf32>
    %5 = slice 1 %x_1[%ra_1] : tensor<8x16xf32>
    %6 = matmul(%5, %4) : tensor<8x4xf32>
    yield %6 : tensor<8x4xf32>
  } : tensor<8x4xf32>
  return %3 : tensor<8x4xf32>
}
""",
    "deep_tiling_propagated": """\
func @mm(%x: tensor<8x64xf32>,
    %w: tensor<64x4xf32>) attributes {mesh={"a":4, "b":2}} {
  %0 = loop "a" [#sum] (%ra: range<4>) {
    %1 = loop "b" [#sum] (%rb: range<2>) {
      %2 = slice 1 %x[%ra] : tensor<8x16xf32>
      %3 = slice 1 %2[%rb] : tensor<8x8xf32>
      %4 = slice 0 %w[%ra] : tensor<16x4xf32>
      %5 = slice 0 %4[%rb] : tensor<8x4xf32>
      %6 = matmul(%3, %5) : tensor<8x4xf32>
      yield %6 : tensor<8x4xf32>
    } : tensor<8x4xf32>
    yield %1 : tensor<8x4xf32>
  } : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
""",
    "atomic": """\
func @mm(%x: tensor<8x64xf32>,
    %w: tensor<64x4xf32>) attributes {mesh={"a":4, "b":2}} {
  %x_1 = loop "b" [any] (%rb: range<2>) {
    yield %x : tensor<8x64xf32>
  } : tensor<8x64xf32>
  %0 = matmul(%x_1, %w) : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
""",
    "transpose_conflict": """\
func @xxt(%x: tensor<256x256xf32>) attributes {mesh={"B":4, "M":2}} {
  %x_1, %transposed = loop "M" [#tile<0>, #tile<1>] (%rM: range<2>) {
    %0 = slice 0 %x[%rM] : tensor<128x256xf32>
    %1 = transpose(%0) {permutation=[1, 0]} : tensor<256x128xf32>
    %transposed_1 = tag "transposed" %1 : tensor<256x128xf32>
    yield %0, %transposed_1 : tensor<128x256xf32>, tensor<256x128xf32>
  } : tensor<256x256xf32>, tensor<256x256xf32>
  %2 = matmul(%x_1, %transposed) : tensor<256x256xf32>
  return %2 : tensor<256x256xf32>
}
""",
    "transpose_resolved_with_tag_and_atomic": """\
func @xxt(%x: tensor<256x256xf32>) attributes {mesh={"B":4, "M":2}} {
  %transposed = loop "M" [#tile<1>] (%rM: range<2>) {
    %0 = slice 0 %x[%rM] : tensor<128x256xf32>
    %1 = transpose(%0) {permutation=[1, 0]} : tensor<256x128xf32>
    %transposed_1 = tag "transposed" %1 : tensor<256x128xf32>
    yield %transposed_1 : tensor<256x128xf32>
  } : tensor<256x256xf32>
  %transposed_2 = loop "M" [any] (%rM_1: range<2>) {
    yield %transposed : tensor<256x256xf32>
  } : tensor<256x256xf32>
  %2 = loop "M" [#tile<0>] (%rM_2: range<2>) {
    %3 = slice 0 %x[%rM_2] : tensor<128x256xf32>
    %4 = matmul(%3, %transposed_2) : tensor<128x256xf32>
    yield %4 : tensor<128x256xf32>
  } : tensor<256x256xf32>
  return %2 : tensor<256x256xf32>
}
""",
}
