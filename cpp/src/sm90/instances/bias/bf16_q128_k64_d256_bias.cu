// The tile's bias kernel (an additive bias, with or without a softcap and ALiBi), built with
// the `sm90-bias` feature, one per translation unit: see ../../instances.inc.
#include "sm90/launch.cuh"
FLASHCORE_SM90_ROLE(cutlass::bfloat16_t, BF16, 128, 64, 256, bias)
