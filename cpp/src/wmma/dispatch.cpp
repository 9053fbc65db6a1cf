// Dispatch from a requested (dtype, tile) to the WMMA instantiation build.rs generated for it.
// `wmma_registry.inc` is generated from src/plan/tiles.rs: one FLASHCORE_WMMA_KERNEL line per
// dtype x distinct tile of the WMMA table.
#include <string>

#include "flashcore/fmha.h"

namespace flashcore::wmma_fa {
#define FLASHCORE_WMMA_KERNEL(DT, BR, BC, D, NAME) void NAME(const FmhaArgs&, cudaStream_t);
#include "wmma_registry.inc"
#undef FLASHCORE_WMMA_KERNEL
}  // namespace flashcore::wmma_fa

namespace flashcore {

void fmha_forward_wmma(const FmhaArgs& args, cudaStream_t stream) {
  const Tile& t = args.tile;
#define FLASHCORE_WMMA_KERNEL(DT, BR, BC, D, NAME)                                      \
  if (args.dtype == DType::DT && t.queries_per_block == BR && t.keys_per_block == BC && \
      t.max_head_dim == D) {                                                            \
    return wmma_fa::NAME(args, stream);                                                 \
  }
#include "wmma_registry.inc"
#undef FLASHCORE_WMMA_KERNEL
  throw Error(ErrorKind::NoKernel, "",
              "no wmma kernel compiled for tile q" + std::to_string(t.queries_per_block) + "_k" +
                  std::to_string(t.keys_per_block) + "_d" + std::to_string(t.max_head_dim));
}

}  // namespace flashcore
