// One kernel per translation unit: the causal schedule of ../instances.inc's row.
#include "sm90/launch.cuh"
FLASHCORE_SM90_SCHEDULE(cutlass::half_t, F16, 128, 64, 256, 41)
