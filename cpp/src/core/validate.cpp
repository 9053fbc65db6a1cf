// Validation: see validate.h. The order of the checks is part of the contract (the first
// failure is the one reported): sizes, devices, shapes, heads, head dim, strides and alignment,
// scale, visible keys.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "core/validate.h"

namespace flashcore::core {
namespace {

// A check's result: empty when it passes (cheap: no Status, no strings, on the common path).
using Failed = std::optional<Status>;

constexpr Field kDims[4] = {Field::Batch, Field::Seq, Field::Heads, Field::HeadDim};

// Negative sizes or strides, or an extent (in bytes) that overflows 64 bits.
Failed check_extent(Operand op, const TensorDesc& t) {
  int64_t last = 0;  // largest element offset
  bool empty = false;
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0 || t.stride[i] < 0) {
      return fail(Code::SizeOverflow, op, kDims[i], t.shape[i], t.stride[i], 0,
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
      return fail(Code::SizeOverflow, op, kDims[i], t.shape[i], t.stride[i]);
    }
    last += n * t.stride[i];
  }
  if (last >= kMax / t.element_bytes) {
    return fail(Code::SizeOverflow, op, Field::None, last, t.element_bytes);
  }
  return std::nullopt;
}

Failed expect_location(Operand op, const TensorDesc& t, int32_t expected) {
  if (t.location == expected) {
    return std::nullopt;
  }
  return fail(Code::DeviceMismatch, op, Field::None, t.location, expected);
}

Failed expect_dim(Operand op, int dim, int64_t got, int64_t expected) {
  if (got == expected) {
    return std::nullopt;
  }
  return fail(Code::ShapeMismatch, op, kDims[dim], got, expected);
}

Failed expect_shape(Operand op, const TensorDesc& t, const int64_t (&expected)[4]) {
  for (int i = 0; i < 4; ++i) {
    if (Failed f = expect_dim(op, i, t.shape[i], expected[i])) {
      return f;
    }
  }
  return std::nullopt;
}

// Head-dim stride 1; other strides (of dims longer than 1) multiples of 8 elements; device
// addresses 16-byte aligned.
Failed check_strides(Operand op, const TensorDesc& t) {
  if (t.shape[3] > 1 && t.stride[3] != 1) {
    return fail(Code::NonContiguousHeadDim, op, Field::HeadDim, t.stride[3]);
  }
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % kHeadDimMultiple != 0) {
      return fail(Code::MisalignedStride, op, kDims[i], t.stride[i]);
    }
  }
  if (t.location != kHost && t.address % 16 != 0) {
    return fail(Code::MisalignedPointer, op, Field::None, static_cast<int64_t>(t.address));
  }
  return std::nullopt;
}

#define FLASHCORE_TRY(expr)             \
  do {                                  \
    if (Failed f_ = (expr)) return *f_; \
  } while (0)

}  // namespace

Status validate(const Request& r, Problem* problem) noexcept {
  try {
    FLASHCORE_TRY(check_extent(Operand::Q, r.q));
    FLASHCORE_TRY(check_extent(Operand::K, r.k));
    FLASHCORE_TRY(check_extent(Operand::V, r.v));
    FLASHCORE_TRY(check_extent(Operand::Out, r.out));
    if (r.has_lse) {
      FLASHCORE_TRY(check_extent(Operand::Lse, r.lse));
    }

    const int32_t location = r.q.location;
    FLASHCORE_TRY(expect_location(Operand::K, r.k, location));
    FLASHCORE_TRY(expect_location(Operand::V, r.v, location));
    FLASHCORE_TRY(expect_location(Operand::Out, r.out, location));
    if (r.has_lse) {
      FLASHCORE_TRY(expect_location(Operand::Lse, r.lse, location));
    }

    const int64_t* qs = r.q.shape;
    const int64_t* ks = r.k.shape;
    FLASHCORE_TRY(expect_dim(Operand::K, 0, ks[0], qs[0]));
    FLASHCORE_TRY(expect_dim(Operand::K, 3, ks[3], qs[3]));
    FLASHCORE_TRY(expect_shape(Operand::V, r.v, {ks[0], ks[1], ks[2], ks[3]}));
    FLASHCORE_TRY(expect_shape(Operand::Out, r.out, {qs[0], qs[1], qs[2], qs[3]}));
    if (r.has_lse) {
      const int64_t want[4] = {qs[0], qs[1], qs[2], 1};
      FLASHCORE_TRY(expect_shape(Operand::Lse, r.lse, want));
      int64_t dense[4];
      bhsd_strides(want, dense);
      const bool one_element = qs[0] * qs[1] * qs[2] <= 1;
      if (!one_element && std::memcmp(dense, r.lse.stride, sizeof(dense)) != 0) {
        return fail(Code::LseLayout, Operand::Lse);
      }
    }

    if ((ks[2] == 0 && qs[2] > 0) || (ks[2] > 0 && qs[2] % ks[2] != 0)) {
      return fail(Code::HeadsNotDivisible, Operand::None, Field::Heads, qs[2], ks[2]);
    }
    const int64_t d = qs[3];
    if (d == 0 || d > kMaxHeadDim || d % kHeadDimMultiple != 0) {
      return fail(Code::UnsupportedHeadDim, Operand::None, Field::HeadDim, d);
    }
    FLASHCORE_TRY(check_strides(Operand::Q, r.q));
    FLASHCORE_TRY(check_strides(Operand::K, r.k));
    FLASHCORE_TRY(check_strides(Operand::V, r.v));
    FLASHCORE_TRY(check_strides(Operand::Out, r.out));

    const float scale = r.options.scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
    // Positive and finite: a zero or negative scale flattens or inverts attention, and CUTLASS
    // example 41 masks causal keys before scaling, so its results would be NaN there (found by
    // tests/gpu.rs explicit_scales, 2026-11-21).
    if (!std::isfinite(scale) || !(scale > 0.0f)) {
      uint32_t bits = 0;
      std::memcpy(&bits, &scale, sizeof(bits));
      return fail(Code::InvalidScale, Operand::None, Field::None, bits);
    }
    const Problem p{qs[0], qs[1], ks[1], qs[2], ks[2], d, scale, r.options.causal, location};
    if (!p.empty()) {
      int64_t blind = 0;
      if (p.seq_k == 0) {
        blind = p.seq_q;
      } else if (p.causal == Causal::BottomRight && p.seq_q > p.seq_k) {
        blind = p.seq_q - p.seq_k;
      }
      if (blind > 0) {
        return fail(Code::NoVisibleKeys, Operand::None, Field::None, blind, p.seq_q, p.seq_k);
      }
    }
    *problem = p;
    return {};
  } catch (...) {  // only std::bad_alloc from a message string can get here
    return out_of_host_memory();
  }
}

}  // namespace flashcore::core
