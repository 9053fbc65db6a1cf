// One kernel per translation unit: the causal schedule of ../instances.inc's row.
#include "sm90/launch.cuh"
FLASHCORE_SM90_SCHEDULE(cutlass::bfloat16_t, BF16, 128, 64, 256, 41)
