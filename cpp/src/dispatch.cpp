// From (kernel family, dtype, tile) to the one instantiation compiled for it. The instances are
// listed once per family in <family>/instances.inc; each line names an f16 and a bf16 symbol
// defined by the files in <family>/instances/ (a missing file fails the link). The Hopper family
// is compiled only when the build targets sm_90 (FLASHCORE_WITH_SM90, set by build.rs and CMake),
// and its bias kernels (sm90/instances/bias/) only with the `sm90-bias` feature
// (FLASHCORE_WITH_SM90_BIAS; CMake: FLASHCORE_SM90_BIAS).
#include <cuda_runtime_api.h>

#include <string>

#include "dispatch.h"

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
#if FLASHCORE_WITH_SM90
#define FLASHCORE_TILE(Q, K, D, FLAGS, CAUSAL_FLAGS, MODIFIER_FLAGS, BIAS_FLAGS) \
  FLASHCORE_DECLARE(sm90, sm90, Q, K, D##_bias)                                 \
  FLASHCORE_DECLARE(sm90, sm90, Q, K, D)
#include "sm90/instances.inc"
#undef FLASHCORE_TILE
#endif
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
#if FLASHCORE_WITH_SM90
constexpr Instance kSm90[] = {
#define FLASHCORE_TILE(Q, K, D, FLAGS, CAUSAL_FLAGS, MODIFIER_FLAGS, BIAS_FLAGS) \
  FLASHCORE_ENTRY(sm90, sm90, Q, K, D)
#include "sm90/instances.inc"
#undef FLASHCORE_TILE
};
#endif
// The Hopper kernel's bias schedules: each tile's `_bias` kernel, which runs the calls with an
// additive bias (the tile's entry refuses them).
#if FLASHCORE_WITH_SM90 && FLASHCORE_WITH_SM90_BIAS
constexpr Instance kSm90Bias[] = {
#define FLASHCORE_TILE(Q, K, D, FLAGS, CAUSAL_FLAGS, MODIFIER_FLAGS, BIAS_FLAGS)                 \
  Instance{Tile{Q, K, D}, sm90::fmha_sm90_F16_q##Q##_k##K##_d##D##_bias,                         \
           sm90::fmha_sm90_BF16_q##Q##_k##K##_d##D##_bias},
#include "sm90/instances.inc"
#undef FLASHCORE_TILE
};
#endif
#undef FLASHCORE_ENTRY

// Each family's instances, indexed by Kernel; empty where the family was not compiled.
struct Span {
  const Instance* first = nullptr;
  const Instance* last = nullptr;
};
template <size_t N>
constexpr Span span(const Instance (&a)[N]) {
  return Span{a, a + N};
}
constexpr Span kFamilies[kKernelCount] = {
    span(kSm80),
    span(kWmma),
#if FLASHCORE_WITH_SM90
    span(kSm90),
#else
    Span{},
#endif
};

constexpr Span family(Kernel kernel) {
  const auto k = static_cast<size_t>(kernel);
  return k < kKernelCount ? kFamilies[k] : Span{};
}

// The instances that run `args` on `kernel`: the Hopper bias kernels for a bias there (empty
// where they were not compiled), else the family's.
constexpr Span instances_for(Kernel kernel, const FmhaArgs& args) {
  if (kernel != Kernel::CutlassSm90 || args.bias == nullptr) {
    return family(kernel);
  }
#if FLASHCORE_WITH_SM90 && FLASHCORE_WITH_SM90_BIAS
  return span(kSm90Bias);
#else
  return Span{};
#endif
}

// One bit per compiled family, fixed at build time.
constexpr uint32_t compiled_mask() {
  uint32_t mask = 0;
  for (int32_t k = 0; k < kKernelCount; ++k) {
    mask |= family(static_cast<Kernel>(k)).first != nullptr ? 1u << k : 0u;
  }
  return mask;
}
constexpr uint32_t kCompiled = compiled_mask();

}  // namespace

void set_compiled(core::DeviceCaps& caps) noexcept {
  caps.kernels = kCompiled;
#if FLASHCORE_WITH_SM90 && FLASHCORE_WITH_SM90_BIAS
  caps.sm90_bias = true;
#else
  caps.sm90_bias = false;
#endif
}

void launch(Kernel kernel, const FmhaArgs& args, cudaStream_t stream) {
  if (kernel == Kernel::CutlassSm80 && (args.block_table != nullptr || args.splits > 1)) {
    throw detail::Failure(Code::Launch, "",  // the planner rules this out
                          std::string(name(kernel)) + " takes no paged cache or key splits");
  }
  const Span s = instances_for(kernel, args);
  for (const Instance* i = s.first; i != s.last; ++i) {
    if (i->tile == args.tile) {
      return (args.dtype == DType::F16 ? i->f16 : i->bf16)(args, stream);
    }
  }
  const Tile& t = args.tile;
  throw detail::Failure(Code::Launch, "",
                        std::string("no ") + name(kernel) +
                            (s.first == nullptr && args.bias != nullptr ? " bias" : "") +
                            " kernel compiled for tile q" +
                            std::to_string(t.queries_per_block) + "_k" +
                            std::to_string(t.keys_per_block) + "_d" +
                            std::to_string(t.max_head_dim));
}

}  // namespace flashcore
