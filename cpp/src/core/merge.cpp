// Validation of merge_states: see merge.h.
#include "core/merge.h"

#include "core/checks.h"

namespace flashcore::core {

Status validate_merge(const MergeRequest& r, MergeProblem* problem) noexcept {
  try {
    if (r.count < 1 || r.count > kMaxMergeStates) {
      return fail(Code::StateCount, Operand::None, Field::None, r.count, 1, kMaxMergeStates);
    }
    FLASHCORE_TRY(check_extent(Operand::Out, r.out));
    if (r.has_lse) {
      FLASHCORE_TRY(check_extent(Operand::Lse, r.lse));
    }
    for (int64_t i = 0; i < r.count; ++i) {
      FLASHCORE_TRY(check_extent(Operand::State, r.outs[i], i));
      FLASHCORE_TRY(check_extent(Operand::StateLse, r.lses[i], i));
    }

    const int32_t location = r.out.location;
    if (r.has_lse) {
      FLASHCORE_TRY(expect_location(Operand::Lse, r.lse, location));
    }
    for (int64_t i = 0; i < r.count; ++i) {
      FLASHCORE_TRY(expect_location(Operand::State, r.outs[i], location, i));
      FLASHCORE_TRY(expect_location(Operand::StateLse, r.lses[i], location, i));
    }

    const int64_t* os = r.out.shape;
    const int64_t shape[4] = {os[0], os[1], os[2], os[3]};
    for (int64_t i = 0; i < r.count; ++i) {
      FLASHCORE_TRY(expect_shape(Operand::State, r.outs[i], shape, i));
      FLASHCORE_TRY(check_lse(Operand::StateLse, r.lses[i], os[0], os[1], os[2], i));
    }
    if (r.has_lse) {
      FLASHCORE_TRY(check_lse(Operand::Lse, r.lse, os[0], os[1], os[2]));
    }
    FLASHCORE_TRY(check_head_dim(os[3]));
    FLASHCORE_TRY(check_strides(Operand::Out, r.out));
    for (int64_t i = 0; i < r.count; ++i) {
      FLASHCORE_TRY(check_strides(Operand::State, r.outs[i], i));
    }
    // The output may be one of the states exactly (in place: each row is read whole before it
    // is written) but shares no other address with them, with itself or with its logsumexp.
    FLASHCORE_TRY(check_no_self_overlap(Operand::Out, r.out));
    for (int64_t i = 0; i < r.count; ++i) {
      FLASHCORE_TRY(check_disjoint(Operand::Out, r.out, 0, Operand::State, r.outs[i], i, true));
      FLASHCORE_TRY(check_disjoint(Operand::Out, r.out, 0, Operand::StateLse, r.lses[i], i));
      if (r.has_lse) {
        FLASHCORE_TRY(check_disjoint(Operand::Lse, r.lse, 0, Operand::StateLse, r.lses[i], i, true));
        FLASHCORE_TRY(check_disjoint(Operand::Lse, r.lse, 0, Operand::State, r.outs[i], i));
      }
    }
    if (r.has_lse) {
      FLASHCORE_TRY(check_disjoint(Operand::Lse, r.lse, 0, Operand::Out, r.out, 0));
    }
    // The logsumexps are floats at dense strides: aligned when their base address is.
    for (int64_t i = 0; i <= r.count; ++i) {
      const TensorDesc& l = i < r.count ? r.lses[i] : r.lse;
      if ((i < r.count || r.has_lse) && l.location != kHost && l.address % 4 != 0) {
        return fail(Code::MisalignedPointer, i < r.count ? Operand::StateLse : Operand::Lse,
                    Field::None, static_cast<int64_t>(l.address), 4, i < r.count ? i : 0);
      }
    }
    *problem = MergeProblem{os[0], os[1], os[2], os[3], r.count, location};
    return {};
  } catch (...) {  // only std::bad_alloc from a message string can get here
    return out_of_host_memory();
  }
}

}  // namespace flashcore::core
