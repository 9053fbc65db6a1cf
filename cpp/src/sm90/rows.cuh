// A thread's share of a wgmma accumulator (or of the coordinate tensor partitioned like it) seen
// as (row, column): the view through which the softmax, the score modifiers and the epilogue walk
// a thread's rows. Within a row, a thread's values differ in their column by constants known at
// compile time once a loop over them unrolls. The view shares the tensor's registers (or its
// coordinate iterator): it must not outlive a register tensor.
#pragma once

#include "collective/fmha_common.hpp"  // CUTLASS examples/88_hopper_fmha: layout_acc_mn
#include "cute/tensor.hpp"

namespace flashcore::sm90 {

template <class TiledMma, class Acc>
CUTLASS_DEVICE auto as_rows(TiledMma const& mma, Acc&& acc) {
  return cute::make_tensor(acc.data(),
                           cutlass::fmha::collective::layout_acc_mn(mma, acc.layout()));
}

}  // namespace flashcore::sm90
