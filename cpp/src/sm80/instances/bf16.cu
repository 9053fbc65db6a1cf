// Every tile of ../instances.inc in bf16: example 41's kernels are small beside CUTLASS's headers,
// so one translation unit per dtype parses them once for all its tiles (build/kernels.rs).
#include "sm80/launch.cuh"
#define FLASHCORE_TILE(Q, K, D) FLASHCORE_SM80_INSTANCE(cutlass::bfloat16_t, BF16, Q, K, D)
#include "sm80/instances.inc"
#undef FLASHCORE_TILE
