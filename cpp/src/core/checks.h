// The operand checks that every validator shares (validate.cpp for attention, merge.cpp for
// merging attention states): extents, locations, shapes, strides and alignment. Each returns an
// empty optional when the check passes (cheap: no Status, no strings, on the common path), else
// the Status naming the operand. For the operands of a list (Operand::State, StateLse), `index`
// is the position in the list and goes to Status::values[2].
#pragma once

#include <cstdint>
#include <optional>

#include "core/validate.h"

namespace flashcore::core {

using Failed = std::optional<Status>;

// Negative sizes or strides, or an extent (in bytes) that overflows 64 bits.
Failed check_extent(Operand op, const TensorDesc& t, int64_t index = 0);
// The operand lives at `expected` (kHost or a device ordinal).
Failed expect_location(Operand op, const TensorDesc& t, int32_t expected, int64_t index = 0);
// Dimension `dim` (0 batch, 1 seq, 2 heads, 3 head dim) is `expected`.
Failed expect_dim(Operand op, int dim, int64_t got, int64_t expected, int64_t index = 0);
Failed expect_shape(Operand op, const TensorDesc& t, const int64_t (&expected)[4],
                    int64_t index = 0);
// A logsumexp: float, shape [batch, seq, heads, 1] with dense BHSD strides.
Failed check_lse(Operand op, const TensorDesc& t, int64_t batch, int64_t seq, int64_t heads,
                 int64_t index = 0);
// Head-dim stride 1; other strides (of dims longer than 1) multiples of 8 elements; device
// addresses 16-byte aligned (check_aligned).
Failed check_strides(Operand op, const TensorDesc& t, int64_t index = 0);
// A device operand's address is 16-byte aligned (the kernels' vector loads); host: any.
Failed check_aligned(Operand op, const TensorDesc& t, int64_t index = 0);
// A head dim the kernels serve: a multiple of 8 from 8 to kMaxHeadDim.
Failed check_head_dim(int64_t d);
// An array of 4-byte elements the kernels read (a variable-length batch's offsets, a page table,
// ALiBi slopes) lives at `expected` (DeviceMismatch) and, on a device, is 4-byte aligned
// (MisalignedPointer).
Failed check_word_array(Operand op, uint64_t address, int32_t location, int32_t expected);
// An output's elements each have their own address: ordered by stride, the strides of its
// dimensions longer than 1 each exceed the span of the smaller ones (a stride-0 or interleaved
// layout is refused, even one whose elements happen not to collide). After check_extent.
Failed check_no_self_overlap(Operand op, const TensorDesc& t, int64_t index = 0);
// The output `out` shares no byte with `in` (both after check_extent), or with `allow_same`
// is exactly `in` (same address, element size, shape and strides: an in-place merge). Exact
// when the two have the same element size and strides that nest as check_no_self_overlap
// asks; otherwise any intersection of their address ranges counts as an overlap.
Failed check_disjoint(Operand out_op, const TensorDesc& out, int64_t out_index, Operand in_op,
                      const TensorDesc& in, int64_t in_index, bool allow_same = false);

#define FLASHCORE_TRY(expr)                          \
  do {                                               \
    if (::flashcore::core::Failed f_ = (expr)) {     \
      return *f_;                                    \
    }                                                \
  } while (0)

}  // namespace flashcore::core
