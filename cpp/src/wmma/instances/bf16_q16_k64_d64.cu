// One kernel per translation unit: see ../instances.inc.
#include "wmma/launch.cuh"
FLASHCORE_WMMA_INSTANCE(__nv_bfloat16, BF16, 16, 64, 64)
