// One kernel per translation unit: see ../instances.inc.
#include "sm90/launch.cuh"
FLASHCORE_SM90_INSTANCE(cutlass::half_t, F16, 192, 128, 64)
