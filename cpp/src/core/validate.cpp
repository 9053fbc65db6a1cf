// Validation: see validate.h. The order of the checks is part of the contract (the first
// failure is the one reported): sizes, devices, shapes, heads, head dim, strides and alignment,
// overlapping outputs, a variable-length batch's offsets or a paged cache, scale, softcap,
// window, ALiBi slopes, visible keys, bias (its element type and extent come with the sizes,
// its overlap with the outputs with theirs).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "core/alibi.h"
#include "core/bias.h"
#include "core/checks.h"
#include "core/paged.h"
#include "core/validate.h"
#include "core/varlen.h"

namespace flashcore::core {
namespace {

// No output shares an address with an input or with the other output (the kernels' writes
// would race with their reads or with each other).
Failed check_overlaps(const Request& r) {
  const std::pair<Operand, const TensorDesc*> inputs[] = {
      {Operand::Q, &r.q}, {Operand::K, &r.k}, {Operand::V, &r.v}};
  for (const auto& [op, in] : inputs) {
    FLASHCORE_TRY(check_disjoint(Operand::Out, r.out, 0, op, *in, 0));
  }
  if (r.has_lse) {
    for (const auto& [op, in] : inputs) {
      FLASHCORE_TRY(check_disjoint(Operand::Lse, r.lse, 0, op, *in, 0));
    }
    FLASHCORE_TRY(check_disjoint(Operand::Lse, r.lse, 0, Operand::Out, r.out, 0));
  }
  if (r.has_bias) {
    FLASHCORE_TRY(check_disjoint(Operand::Out, r.out, 0, Operand::Bias, r.bias, 0));
    if (r.has_lse) {
      FLASHCORE_TRY(check_disjoint(Operand::Lse, r.lse, 0, Operand::Bias, r.bias, 0));
    }
  }
  return std::nullopt;
}

// `value` is positive and finite, else `code` with its IEEE bits.
Failed positive_finite(Code code, float value) {
  if (std::isfinite(value) && value > 0.0f) {
    return std::nullopt;
  }
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return fail(code, Operand::None, Field::None, bits);
}

// `p` with the request's score modifiers: its sliding window (a side of seq_q + seq_k keys or
// more bounds nothing) and whether it has ALiBi slopes and a bias; then the bias's checks,
// which need the problem's sizes.
Failed with_modifiers(Problem p, const Request& r, Problem* out) {
  const Options& o = r.options;
  const int64_t span = p.seq_q + p.seq_k;
  p.window_left = o.window_left && *o.window_left < span ? *o.window_left : -1;
  p.window_right = o.window_right && *o.window_right < span ? *o.window_right : -1;
  p.alibi = r.has_alibi;
  p.bias = r.has_bias;
  if (r.has_bias) {
    FLASHCORE_TRY(check_bias(r, p.batch, p.seq_q, p.seq_k));
  }
  *out = p;
  return std::nullopt;
}

// Problem::token_rows of a variable-length batch: Q's token stride in head strides, where the
// output's is the same multiple and the packed rows' span, (tokens - 1) * token_rows + heads_q,
// fits int32 (the Hopper kernel's TMA row extent); else 0.
int64_t token_rows(const Request& r) {
  const int64_t* q = r.q.stride;
  const int64_t* o = r.out.stride;
  if (q[2] <= 0 || o[2] <= 0 || q[1] <= 0 || q[1] % q[2] != 0) {
    return 0;
  }
  const int64_t m = q[1] / q[2];
  const int64_t tokens = r.q.shape[1], heads = r.q.shape[2];
  if (o[1] != m * o[2] || heads > INT32_MAX || (tokens > 0 && tokens - 1 > (INT32_MAX - heads) / m)) {
    return 0;
  }
  return m;
}

}  // namespace

int64_t blind_rows(const Options& o, int64_t seq_q, int64_t seq_k) {
  if (seq_k <= 0) {
    return seq_q;
  }
  const int64_t offset = o.causal == Causal::TopLeft ? 0 : seq_k - seq_q;
  const std::optional<int64_t> left = o.window_left;
  const std::optional<int64_t> right =
      o.causal != Causal::None ? std::optional<int64_t>(0) : o.window_right;
  // Both sides are at most seq_q + seq_k here, so no sum below overflows. Rows i < -(offset +
  // right) end before key 0; rows i >= seq_k - offset + left start past the last key. The band
  // is never empty (left, right >= 0), so the two sets are disjoint.
  const int64_t span = seq_q + seq_k;
  const auto clamp = [&](int64_t x) { return std::min(std::max(x, int64_t{0}), seq_q); };
  const int64_t before = right ? clamp(-(offset + std::min(*right, span))) : 0;
  const int64_t after = left ? clamp(seq_q - (seq_k - offset + std::min(*left, span))) : 0;
  return std::min(seq_q, before + after);
}

Status check_addresses(const Request& r) noexcept {
  try {
    const std::pair<Operand, const TensorDesc*> operands[] = {
        {Operand::Q, &r.q}, {Operand::K, &r.k}, {Operand::V, &r.v}, {Operand::Out, &r.out}};
    for (const auto& [op, t] : operands) {
      FLASHCORE_TRY(check_aligned(op, *t));
    }
    FLASHCORE_TRY(check_overlaps(r));
    return {};
  } catch (...) {
    return out_of_host_memory();
  }
}

Status validate(const Request& r, Problem* problem) noexcept {
  try {
    FLASHCORE_TRY(check_extent(Operand::Q, r.q));
    FLASHCORE_TRY(check_extent(Operand::K, r.k));
    FLASHCORE_TRY(check_extent(Operand::V, r.v));
    FLASHCORE_TRY(check_extent(Operand::Out, r.out));
    if (r.has_lse) {
      FLASHCORE_TRY(check_extent(Operand::Lse, r.lse));
    }
    if (r.has_bias) {
      FLASHCORE_TRY(check_bias_extent(r));
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
    if (r.paged && r.varlen) {
      return fail(Code::InvalidPageTable, Operand::None, Field::Sequences, -1, 0, 0);
    }
    if (r.varlen) {  // the sequences are packed along the token axis of one batch entry
      FLASHCORE_TRY(expect_dim(Operand::Q, 0, qs[0], 1));
    }
    if (!r.paged) {  // a paged cache's dim 0 counts pages, not sequences
      FLASHCORE_TRY(expect_dim(Operand::K, 0, ks[0], qs[0]));
    }
    FLASHCORE_TRY(expect_dim(Operand::K, 3, ks[3], qs[3]));
    FLASHCORE_TRY(expect_shape(Operand::V, r.v, {ks[0], ks[1], ks[2], ks[3]}));
    FLASHCORE_TRY(expect_shape(Operand::Out, r.out, {qs[0], qs[1], qs[2], qs[3]}));
    if (r.has_lse) {
      FLASHCORE_TRY(check_lse(Operand::Lse, r.lse, qs[0], qs[1], qs[2]));
    }

    if ((ks[2] == 0 && qs[2] > 0) || (ks[2] > 0 && qs[2] % ks[2] != 0)) {
      return fail(Code::HeadsNotDivisible, Operand::None, Field::Heads, qs[2], ks[2]);
    }
    const int64_t d = qs[3];
    FLASHCORE_TRY(check_head_dim(d));
    FLASHCORE_TRY(check_strides(Operand::Q, r.q));
    FLASHCORE_TRY(check_strides(Operand::K, r.k));
    FLASHCORE_TRY(check_strides(Operand::V, r.v));
    FLASHCORE_TRY(check_strides(Operand::Out, r.out));
    FLASHCORE_TRY(check_no_self_overlap(Operand::Out, r.out));
    FLASHCORE_TRY(check_overlaps(r));
    if (r.varlen) {
      FLASHCORE_TRY(check_offsets(r));
    }
    if (r.paged) {
      FLASHCORE_TRY(check_pages(r));
    }

    const float scale = r.options.scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
    // Positive and finite: a zero or negative scale flattens or inverts attention, and CUTLASS
    // example 41 masks causal keys before scaling, so its results would be NaN there (found by
    // tests/gpu.rs explicit_scales, 2026-11-21).
    FLASHCORE_TRY(positive_finite(Code::InvalidScale, scale));
    if (r.options.softcap) {
      FLASHCORE_TRY(positive_finite(Code::InvalidSoftcap, *r.options.softcap));
    }
    for (const auto& [side, field] : {std::pair{r.options.window_left, Field::WindowLeft},
                                      std::pair{r.options.window_right, Field::WindowRight}}) {
      if (side && *side < 0) {
        return fail(Code::InvalidWindow, Operand::None, field, *side);
      }
    }
    if (r.has_alibi) {
      FLASHCORE_TRY(check_alibi(r, r.varlen ? r.cu_q.count : qs[0]));
    }
    if (r.varlen) {
      FLASHCORE_TRY(check_sequence_keys(r));
      Problem p{r.cu_q.count, r.cu_q.max_len, r.cu_k.max_len, qs[2], ks[2], d, scale,
                r.options.causal, location, true};
      p.token_rows = token_rows(r);
      FLASHCORE_TRY(with_modifiers(p, r, problem));
      return {};
    }
    if (r.paged) {
      FLASHCORE_TRY(check_paged_keys(r));
      FLASHCORE_TRY(with_modifiers(Problem{qs[0], qs[1], r.pages.max_seqlen_k, qs[2], ks[2], d,
                                           scale, r.options.causal, location, false, true},
                                   r, problem));
      return {};
    }
    Problem p{qs[0], qs[1], ks[1], qs[2], ks[2], d, scale, r.options.causal, location};
    if (!p.empty()) {
      const int64_t blind = blind_rows(r.options, p.seq_q, p.seq_k);
      if (blind > 0) {
        return fail(Code::NoVisibleKeys, Operand::None, Field::None, blind, p.seq_q, p.seq_k);
      }
    }
    FLASHCORE_TRY(with_modifiers(p, r, problem));
    return {};
  } catch (...) {  // only std::bad_alloc from a message string can get here
    return out_of_host_memory();
  }
}

}  // namespace flashcore::core
