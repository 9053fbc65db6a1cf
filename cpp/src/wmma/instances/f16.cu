// Every tile of ../instances.inc in f16: one translation unit per dtype parses the headers once
// for all its tiles (build/kernels.rs).
#include "wmma/launch.cuh"
#define FLASHCORE_TILE(BR, BC, D) FLASHCORE_WMMA_INSTANCE(__half, F16, BR, BC, D)
#include "wmma/instances.inc"
#undef FLASHCORE_TILE
