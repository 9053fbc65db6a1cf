// Dispatch from a requested (dtype, tile) to the one instantiation that build.rs generated for it.
// `sm80_registry.inc` is generated from src/plan/tiles.rs: one FLASHCORE_SM80_KERNEL line per
// dtype x distinct tile of the table.
#include <string>

#include "flashcore/fmha.h"

namespace flashcore::sm80 {
#define FLASHCORE_SM80_KERNEL(DT, Q, K, D, NAME) void NAME(const FmhaArgs&, cudaStream_t);
#include "sm80_registry.inc"
#undef FLASHCORE_SM80_KERNEL
}  // namespace flashcore::sm80

namespace flashcore {

void fmha_forward_sm80(const FmhaArgs& args, cudaStream_t stream) {
  const Tile& t = args.tile;
#define FLASHCORE_SM80_KERNEL(DT, Q, K, D, NAME)                                          \
  if (args.dtype == DType::DT && t.queries_per_block == Q && t.keys_per_block == K &&    \
      t.max_head_dim == D) {                                                              \
    return sm80::NAME(args, stream);                                                      \
  }
#include "sm80_registry.inc"
#undef FLASHCORE_SM80_KERNEL
  throw Error(ErrorKind::NoKernel, "",
              "no sm80 kernel compiled for tile q" + std::to_string(t.queries_per_block) + "_k" +
                  std::to_string(t.keys_per_block) + "_d" + std::to_string(t.max_head_dim));
}

}  // namespace flashcore
