// Transcendentals for the softmax and the score modifiers of every kernel family: one instruction
// each on the multi-function unit, and 2^x on the FMA pipe.
#pragma once

namespace flashcore {

// 2^x by ex2.approx.ftz: about 2 ulp, as FlashAttention computes its softmax. The plain exp2f
// (without --use_fast_math) compiles to ex2.approx without .ftz, which ptxas wraps in three more
// instructions per call to keep subnormal inputs and results (a compare and two predicated
// multiplies). The softmax never needs them: its arguments are at most 8 (docs/HOPPER.md, round
// 8), a subnormal argument gives 1 either way, and a result below 2^-126 weighs nothing beside
// the row's largest probability, which is at least 1.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x without the multi-function unit, on the FMA and integer pipes (9 instructions): the
// multi-function unit computes 16 exponentials per clock per SM, which at d = 64 takes as long
// as the two matrix products of a score (256 flops at 4096 per clock) and at d = 128 half as
// long, twice that with a softcap's tanh; computing a share of the exponentials here leaves it
// to the others (FlashAttention-4's idea). Arguments below -125 (a masked -inf among them) give
// 2^-125, which weighs nothing beside the row's largest probability (at least 1); NaN stays NaN.
// x = n + f with n = round(x) and |f| <= 1/2; 2^f by a cubic (minimax for relative error on
// [-1/2, 1/2]: at most 7.5e-5, below the rounding of a bf16 or f16 probability); 2^n from n's
// bits: adding kRound leaves n + 127 in the low bits of t, which shifted 23 places are 2^n.
__device__ __forceinline__ float exp2_on_fma(float x) {
  constexpr float kRound = 12582912.f + 127.f;  // 1.5 * 2^23 + the exponent bias
  float clamped;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(clamped) : "f"(x), "f"(-125.f));
  const float t = __fadd_rn(clamped, kRound);
  const float f = __fsub_rn(clamped, __fsub_rn(t, kRound));
  const float p = fmaf(fmaf(fmaf(0.055171434f, f, 0.24261081f), f, 0.69326097f), f, 0.99992812f);
  return p * __int_as_float(__float_as_int(t) << 23);
}

// tanh(x) by tanh.approx.f32 (sm_75 and later), for the softcap: cap * tanh(s / cap). The PTX
// manual bounds its relative error by about 2^-11; measured on the H200 over [-10, 10]: absolute
// 7.9e-6, relative 1.1e-5 (docs/HOPPER.md, round 10).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashcore
