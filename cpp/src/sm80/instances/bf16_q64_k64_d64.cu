// One kernel per translation unit: see ../instances.inc.
#include "sm80/launch.cuh"
FLASHCORE_SM80_INSTANCE(cutlass::bfloat16_t, BF16, 64, 64, 64)
