// One-instruction transcendentals on the multi-function unit, for the softmax and the score
// modifiers of every kernel family.
#pragma once

namespace flashcore {

// log2(e) and ln(2) in float, for moving scores between natural and exp2 units.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Defines `float NAME(float x)` as the single f32 PTX instruction OP applied to x.
#define FLASHCORE_ONE_INSTRUCTION(NAME, OP)              \
  __device__ __forceinline__ float NAME(float x) {       \
    float y;                                             \
    asm(OP " %0, %1;" : "=f"(y) : "f"(x));               \
    return y;                                            \
  }

// 2^x by ex2.approx.ftz: about 2 ulp, as FlashAttention computes its softmax. The plain exp2f
// (without --use_fast_math) compiles to ex2.approx without .ftz, which ptxas wraps in three more
// instructions per call to keep subnormal inputs and results (a compare and two predicated
// multiplies). The softmax never needs them: its arguments are at most 8 (docs/HOPPER.md, round
// 8), a subnormal argument gives 1 either way, and a result below 2^-126 weighs nothing beside
// the row's largest probability, which is at least 1.
FLASHCORE_ONE_INSTRUCTION(fast_exp2, "ex2.approx.ftz.f32")

// tanh(x) by tanh.approx.f32 (sm_75 and later), for the softcap: cap * tanh(s / cap). The PTX
// manual bounds its relative error by about 2^-11; measured on the H200 over [-10, 10]: absolute
// 7.9e-6, relative 1.1e-5 (docs/HOPPER.md, round 10).
FLASHCORE_ONE_INSTRUCTION(fast_tanh, "tanh.approx.f32")

// 1 / x by rcp.approx.ftz: about 1 ulp, without the IEEE-rounded reciprocal's slow path (a call
// per use for subnormal and huge arguments). For the softmax's row sums, which lie between 1 (the
// row's largest probability) and 2^8 times the key count (lazy rescaling, sm90/mainloop.cuh).
FLASHCORE_ONE_INSTRUCTION(fast_rcp, "rcp.approx.ftz.f32")

// log2(x) by lg2.approx.ftz: absolute error about 2^-22 near 1, relative about 2^-22 elsewhere,
// instead of log2f's polynomial of some twenty instructions.
FLASHCORE_ONE_INSTRUCTION(fast_log2, "lg2.approx.ftz.f32")

#undef FLASHCORE_ONE_INSTRUCTION

// The natural logarithm as fast_log2(x) * ln(2), for the logsumexp's log of a row sum (see
// fast_rcp).
__device__ __forceinline__ float fast_log(float x) { return fast_log2(x) * kLn2; }

}  // namespace flashcore
