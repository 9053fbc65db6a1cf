// One kernel per translation unit: see ../instances.inc.
#include "wmma/launch.cuh"
FLASHCORE_WMMA_INSTANCE(__half, F16, 16, 64, 64)
