// From (kernel family, dtype, tile) to the one instantiation compiled for it. The instances are
// listed once per family in instances.inc; each line names an f16 and a bf16 symbol defined by
// the files in instances/ (a missing file fails the link).
#include <cuda_runtime_api.h>

#include <iterator>
#include <string>

#include "launcher.h"

namespace flashcore {

#define FLASHCORE_DECLARE(NS, FAMILY, Q, K, D)                                           \
  namespace NS {                                                                         \
  void fmha_##FAMILY##_F16_q##Q##_k##K##_d##D(const FmhaArgs&, cudaStream_t);            \
  void fmha_##FAMILY##_BF16_q##Q##_k##K##_d##D(const FmhaArgs&, cudaStream_t);           \
  }
#define FLASHCORE_TILE(Q, K, D) FLASHCORE_DECLARE(sm80, sm80, Q, K, D)
#include "sm80/instances.inc"
#undef FLASHCORE_TILE
#define FLASHCORE_TILE(Q, K, D) FLASHCORE_DECLARE(wmma_fa, wmma, Q, K, D)
#include "wmma/instances.inc"
#undef FLASHCORE_TILE
#undef FLASHCORE_DECLARE

namespace {

using LaunchFn = void (*)(const FmhaArgs&, cudaStream_t);

struct Instance {
  Tile tile;
  LaunchFn f16, bf16;
};

#define FLASHCORE_ENTRY(NS, FAMILY, Q, K, D)                                                   \
  Instance{Tile{Q, K, D}, NS::fmha_##FAMILY##_F16_q##Q##_k##K##_d##D,                         \
           NS::fmha_##FAMILY##_BF16_q##Q##_k##K##_d##D},
constexpr Instance kSm80[] = {
#define FLASHCORE_TILE(Q, K, D) FLASHCORE_ENTRY(sm80, sm80, Q, K, D)
#include "sm80/instances.inc"
#undef FLASHCORE_TILE
};
constexpr Instance kWmma[] = {
#define FLASHCORE_TILE(Q, K, D) FLASHCORE_ENTRY(wmma_fa, wmma, Q, K, D)
#include "wmma/instances.inc"
#undef FLASHCORE_TILE
};
#undef FLASHCORE_ENTRY

}  // namespace

void launch(Kernel kernel, const FmhaArgs& args, cudaStream_t stream) {
  const Instance* first = kernel == Kernel::Wmma ? std::begin(kWmma) : std::begin(kSm80);
  const Instance* last = kernel == Kernel::Wmma ? std::end(kWmma) : std::end(kSm80);
  for (const Instance* i = first; i != last; ++i) {
    if (i->tile == args.tile) {
      return (args.dtype == DType::F16 ? i->f16 : i->bf16)(args, stream);
    }
  }
  const Tile& t = args.tile;
  throw detail::Failure(Code::Launch, "",
                        std::string("no ") + name(kernel) + " kernel compiled for tile q" +
                            std::to_string(t.queries_per_block) + "_k" +
                            std::to_string(t.keys_per_block) + "_d" +
                            std::to_string(t.max_head_dim));
}

}  // namespace flashcore
