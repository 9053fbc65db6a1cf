// One Hopper backward kernel per translation unit: see ../launch.cuh.
#include "backward/sm90/launch.cuh"

namespace flashcore {
template void launch_backward_sm90<DType::F16, 128>(const BackwardLaunch&, cudaStream_t);
}  // namespace flashcore
