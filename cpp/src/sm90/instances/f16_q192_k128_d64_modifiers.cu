// The tile's modifier kernel (a softcap, ALiBi), one per translation unit: see ../instances.inc.
#include "sm90/launch.cuh"
FLASHCORE_SM90_ROLE(cutlass::half_t, F16, 192, 128, 64, modifiers)
