// The shared operand checks: see checks.h.
#include "core/checks.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

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
  return check_aligned(op, t, index);
}

Failed check_aligned(Operand op, const TensorDesc& t, int64_t index) {
  if (t.location != kHost && t.address % 16 != 0) {
    return fail(Code::MisalignedPointer, op, Field::None, static_cast<int64_t>(t.address), 16,
                index);
  }
  return std::nullopt;
}

namespace {

// One dimension of a strided tensor, or of two that share strides: its stride (elements), the
// larger extent n, and the range [lo, hi] of j - i for index i in the first and j in the second.
struct Dim {
  int64_t s, n, lo, hi;
};

// The dimensions longer than 1 of `a` or `b` (strides from `a`), sorted by stride; returns their
// count.
int sorted_dims(const TensorDesc& a, const TensorDesc& b, Dim (&dims)[4]) {
  int count = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t n = std::max(a.shape[i], b.shape[i]);
    if (n > 1) {
      dims[count++] = Dim{a.stride[i], n, 1 - a.shape[i], b.shape[i] - 1};
    }
  }
  std::sort(dims, dims + count, [](Dim x, Dim y) { return x.s < y.s; });
  return count;
}

// Whether each stride exceeds the largest offset the smaller dimensions reach.
bool nested(const Dim* dims, int count) {
  int64_t span = 0;
  for (int i = 0; i < count; ++i) {
    if (dims[i].s <= span) {
      return false;
    }
    span += (dims[i].n - 1) * dims[i].s;  // no overflow: within check_extent's bound
  }
  return true;
}

// Whether `delta` = sum of c_i * s_i over dims[0..count) with lo_i <= c_i <= hi_i. The
// dimensions nest (|c_i| < n_i), so the smaller ones reach less than s_i either way: c_i is the
// floor or the ceiling of delta / s_i, at most two choices per dimension.
bool reachable(int64_t delta, const Dim* dims, int count) {
  if (count == 0) {
    return delta == 0;
  }
  const Dim d = dims[count - 1];
  const int64_t floor = delta / d.s - (delta % d.s < 0 ? 1 : 0);
  for (const int64_t c : {floor, floor + 1}) {
    if (c >= d.lo && c <= d.hi && reachable(delta - c * d.s, dims, count - 1)) {
      return true;
    }
  }
  return false;
}

// The bytes [first, last] that `t` addresses (non-empty; last < 2^63 after check_extent).
std::pair<uint64_t, uint64_t> byte_range(const TensorDesc& t) {
  uint64_t last = 0;
  for (int i = 0; i < 4; ++i) {
    last += static_cast<uint64_t>((t.shape[i] - 1) * t.stride[i]);
  }
  last = (last + 1) * static_cast<uint64_t>(t.element_bytes) - 1;
  return {t.address, t.address + last};
}

bool empty(const TensorDesc& t) {
  return t.shape[0] == 0 || t.shape[1] == 0 || t.shape[2] == 0 || t.shape[3] == 0;
}

}  // namespace

Failed check_no_self_overlap(Operand op, const TensorDesc& t, int64_t index) {
  Dim dims[4];
  const int count = sorted_dims(t, t, dims);
  if (empty(t) || nested(dims, count)) {
    return std::nullopt;
  }
  return fail(Code::OverlappingOutput, op, Field::None, 0, 0, index);
}

Failed check_disjoint(Operand out_op, const TensorDesc& out, int64_t out_index, Operand in_op,
                      const TensorDesc& in, int64_t in_index, bool allow_same) {
  if (empty(out) || empty(in)) {
    return std::nullopt;
  }
  const auto [a0, a1] = byte_range(out);
  const auto [b0, b1] = byte_range(in);
  if (a1 < b0 || b1 < a0) {
    return std::nullopt;
  }
  const bool same_layout = out.element_bytes == in.element_bytes &&
                           std::memcmp(out.stride, in.stride, sizeof(out.stride)) == 0;
  if (allow_same && same_layout && out.address == in.address &&
      std::memcmp(out.shape, in.shape, sizeof(out.shape)) == 0) {
    return std::nullopt;
  }
  // Interleaved views of one buffer (a packed [batch, seq, 4, heads, d] holding q, k, v and the
  // output, say): with equal strides, element i of out meets element j of in exactly when the
  // distance between their bases is sum((j - i) * stride).
  if (same_layout && out.address % out.element_bytes == in.address % in.element_bytes) {
    Dim dims[4];
    const int count = sorted_dims(out, in, dims);
    const int64_t delta = static_cast<int64_t>(a0 - b0) / out.element_bytes;
    if (nested(dims, count) && !reachable(delta, dims, count)) {
      return std::nullopt;
    }
  }
  return fail(Code::OverlappingOutput, out_op, Field::None, static_cast<int64_t>(in_op),
              in_index, out_index);
}

Failed check_word_array(Operand op, uint64_t address, int32_t location, int32_t expected) {
  if (location != expected) {
    return fail(Code::DeviceMismatch, op, Field::None, location, expected);
  }
  if (location != kHost && address % 4 != 0) {
    return fail(Code::MisalignedPointer, op, Field::None, static_cast<int64_t>(address), 4);
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
