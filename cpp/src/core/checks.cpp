// The shared operand checks: see checks.h.
#include "core/checks.h"

#include <cstring>
#include <limits>

namespace flashcore::core {
namespace {

constexpr Field kDims[4] = {Field::Batch, Field::Seq, Field::Heads, Field::HeadDim};

}  // namespace

Failed check_extent(Operand op, const TensorDesc& t, int64_t index) {
  int64_t last = 0;  // largest element offset
  bool empty = false;
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0 || t.stride[i] < 0) {
      return fail(Code::SizeOverflow, op, kDims[i], t.shape[i], t.stride[i], index,
                  "negative size or stride");
    }
    empty = empty || t.shape[i] == 0;
  }
  if (empty) {
    return std::nullopt;
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < 4; ++i) {
    const int64_t n = t.shape[i] - 1;
    if (n > 0 && t.stride[i] > (kMax - last) / n) {
      return fail(Code::SizeOverflow, op, kDims[i], t.shape[i], t.stride[i], index);
    }
    last += n * t.stride[i];
  }
  if (last >= kMax / t.element_bytes) {
    return fail(Code::SizeOverflow, op, Field::None, last, t.element_bytes, index);
  }
  return std::nullopt;
}

Failed expect_location(Operand op, const TensorDesc& t, int32_t expected, int64_t index) {
  if (t.location == expected) {
    return std::nullopt;
  }
  return fail(Code::DeviceMismatch, op, Field::None, t.location, expected, index);
}

Failed expect_dim(Operand op, int dim, int64_t got, int64_t expected, int64_t index) {
  if (got == expected) {
    return std::nullopt;
  }
  return fail(Code::ShapeMismatch, op, kDims[dim], got, expected, index);
}

Failed expect_shape(Operand op, const TensorDesc& t, const int64_t (&expected)[4],
                    int64_t index) {
  for (int i = 0; i < 4; ++i) {
    if (Failed f = expect_dim(op, i, t.shape[i], expected[i], index)) {
      return f;
    }
  }
  return std::nullopt;
}

Failed check_lse(Operand op, const TensorDesc& t, int64_t batch, int64_t seq, int64_t heads,
                 int64_t index) {
  const int64_t want[4] = {batch, seq, heads, 1};
  if (Failed f = expect_shape(op, t, want, index)) {
    return f;
  }
  int64_t dense[4];
  bhsd_strides(want, dense);
  const bool one_element = batch * seq * heads <= 1;
  if (!one_element && std::memcmp(dense, t.stride, sizeof(dense)) != 0) {
    return fail(Code::LseLayout, op, Field::None, 0, 0, index);
  }
  return std::nullopt;
}

Failed check_strides(Operand op, const TensorDesc& t, int64_t index) {
  if (t.shape[3] > 1 && t.stride[3] != 1) {
    return fail(Code::NonContiguousHeadDim, op, Field::HeadDim, t.stride[3], 0, index);
  }
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % kHeadDimMultiple != 0) {
      return fail(Code::MisalignedStride, op, kDims[i], t.stride[i], 0, index);
    }
  }
  if (t.location != kHost && t.address % 16 != 0) {
    return fail(Code::MisalignedPointer, op, Field::None, static_cast<int64_t>(t.address), 16,
                index);
  }
  return std::nullopt;
}

Failed check_head_dim(int64_t d) {
  if (d == 0 || d > kMaxHeadDim || d % kHeadDimMultiple != 0) {
    return fail(Code::UnsupportedHeadDim, Operand::None, Field::HeadDim, d);
  }
  return std::nullopt;
}

}  // namespace flashcore::core
