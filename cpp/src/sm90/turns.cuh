// Turns at the tensor cores for the Hopper kernel's consumer warpgroups (FlashAttention-3's warp
// scheduling): each warpgroup waits for its turn before it issues its matrix products of a key
// tile and passes the turn on once they are issued, so the warpgroups' products do not contend
// for the tensor cores and one warpgroup's softmax runs while the next one's products do.
//
// One named barrier per warpgroup (user ids 0 to kWarpGroups - 1, above CUTLASS's reserved ones;
// the epilogue's staging takes the next kWarpGroups, epilogue.cuh):
// its 128 threads wait on it, and the 128 threads of the warpgroup before it in the cycle arrive
// on it. Warpgroup 0 is given the first turn. Every warpgroup of a block takes the same number of
// turns per work unit (one per key tile the block visits, with an empty turn for each tile that
// its own rows do not see, mainloop.cuh), so the cycle never stalls. The last pass
// of a block is never waited for; compute-sanitizer's synccheck finds nothing to report.
#pragma once

#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"

namespace flashcore::sm90 {

template <int kWarpGroups, bool kEnabled>
struct IssueTurns {
  static constexpr uint32_t kThreads = 2 * cutlass::NumThreadsPerWarpGroup;

  // Called once by every consumer thread before its first turn.
  CUTLASS_DEVICE static void start(int consumer) {
    if constexpr (kEnabled) {
      if (consumer == 0) {
        cutlass::arch::NamedBarrier::arrive(kThreads, 0);
      }
    }
  }
  CUTLASS_DEVICE static void wait(int consumer) {
    if constexpr (kEnabled) {
      cutlass::arch::NamedBarrier::sync(kThreads, uint32_t(consumer));
    }
  }
  CUTLASS_DEVICE static void pass(int consumer) {
    if constexpr (kEnabled) {
      cutlass::arch::NamedBarrier::arrive(kThreads, uint32_t((consumer + 1) % kWarpGroups));
    }
  }
};

}  // namespace flashcore::sm90
