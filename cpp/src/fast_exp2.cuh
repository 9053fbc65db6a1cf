// 2^x for the softmax of every kernel family, on the multi-function unit in one instruction.
#pragma once

namespace flashcore {

// ex2.approx.ftz: about 2 ulp, as FlashAttention computes its softmax. The plain exp2f (without
// --use_fast_math) compiles to ex2.approx without .ftz, which ptxas wraps in three more
// instructions per call to keep subnormal inputs and results (a compare and two predicated
// multiplies). The softmax never needs them: its arguments are at most 8 (docs/HOPPER.md, round
// 8), a subnormal argument gives 1 either way, and a result below 2^-126 weighs nothing beside
// the row's largest probability, which is at least 1.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashcore
