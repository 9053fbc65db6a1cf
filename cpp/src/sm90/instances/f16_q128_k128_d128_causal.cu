// The tile's causal kernel (its schedule without the last wave in pieces), one per translation
// unit: see ../instances.inc.
#include "sm90/launch.cuh"
FLASHCORE_SM90_ROLE(cutlass::half_t, F16, 128, 128, 128, causal)
