// Validation of the backward pass: see backward.h.
#include "core/backward.h"

#include <algorithm>
#include <climits>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "core/checks.h"

namespace flashcore::core {
namespace {

// The gradients with the forward operand each is shaped like: dout like the output, dq like Q,
// dk like K, dv like V.
struct Gradient {
  Operand op;
  const TensorDesc* t;
  const TensorDesc* like;
};

// No gradient output overlaps itself, an input of the backward call or an earlier gradient
// output.
Failed check_gradient_overlaps(const BackwardRequest& r, const Gradient (&grads)[4]) {
  const Request& f = r.forward;
  const std::pair<Operand, const TensorDesc*> inputs[] = {
      {Operand::Q, &f.q},     {Operand::K, &f.k},     {Operand::V, &f.v},
      {Operand::Out, &f.out}, {Operand::Lse, &f.lse}, {Operand::DOut, &r.dout}};
  for (int i = 1; i < 4; ++i) {  // grads[0] is dout, an input
    const auto& [op, t, like] = grads[i];
    FLASHCORE_TRY(check_no_self_overlap(op, *t));
    for (const auto& [in_op, in] : inputs) {
      FLASHCORE_TRY(check_disjoint(op, *t, 0, in_op, *in, 0));
    }
    if (f.has_bias) {
      FLASHCORE_TRY(check_disjoint(op, *t, 0, Operand::Bias, f.bias, 0));
    }
    for (int j = 1; j < i; ++j) {
      FLASHCORE_TRY(check_disjoint(op, *t, 0, grads[j].op, *grads[j].t, 0));
    }
  }
  return std::nullopt;
}

}  // namespace

Status validate_backward(const BackwardRequest& r, Problem* problem) noexcept {
  try {
    if (r.forward.paged) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None, -1, 0, 0,
                  "the backward pass takes no paged cache (dense and variable-length batches)");
    }
    Request forward = r.forward;
    forward.has_lse = true;
    Problem p{};
    const Status s = validate(forward, &p);
    if (!s.ok()) {
      return s;
    }
    const Gradient grads[] = {{Operand::DOut, &r.dout, &forward.out},
                              {Operand::DQ, &r.dq, &forward.q},
                              {Operand::DK, &r.dk, &forward.k},
                              {Operand::DV, &r.dv, &forward.v}};
    for (const auto& [op, t, like] : grads) {
      FLASHCORE_TRY(check_extent(op, *t));
    }
    for (const auto& [op, t, like] : grads) {
      FLASHCORE_TRY(expect_location(op, *t, p.location));
    }
    for (const auto& [op, t, like] : grads) {
      const int64_t* s = like->shape;
      FLASHCORE_TRY(expect_shape(op, *t, {s[0], s[1], s[2], s[3]}));
    }
    for (const auto& [op, t, like] : grads) {
      FLASHCORE_TRY(check_strides(op, *t));
    }
    FLASHCORE_TRY(check_gradient_overlaps(r, grads));
    *problem = p;
    return {};
  } catch (...) {  // only std::bad_alloc from a message string can get here
    return out_of_host_memory();
  }
}

Status plan_backward(const Request& r, const Problem& p, const DeviceCaps& caps,
                     int* tile) noexcept {
  try {
    const std::optional<Kernel> forced = kernel_of(r.options.backend);
    if (forced && *forced != Kernel::Wmma) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None,
                  static_cast<int64_t>(*forced), 0, 0,
                  "the backward pass has one GPU kernel, of the wmma family (ask for Auto or Wmma)");
    }
    if (!arch_class(caps.major, caps.minor, caps.smem_per_block_optin)) {
      return fail(Code::UnsupportedDevice, Operand::None, Field::None, caps.major, caps.minor);
    }
    // The first row of the head dim's tier that fits the device and the class forced in the
    // options (testing an L4's or an A100's choice on another GPU).
    const std::optional<ArchClass> forced_class = r.options.force_arch_class;
    const int64_t budget = forced_class ? std::min(caps.smem_per_block_optin,
                                                   smem_per_block_optin(*forced_class))
                                        : caps.smem_per_block_optin;
    const int64_t tier = backward_tier(p.head_dim);
    int chosen = -1;
    int64_t least = INT64_MAX;  // the tier's smallest need
    for (int i = 0; i < kBackwardTileCount; ++i) {
      const BackwardTileRow& t = kBackwardTiles[i];
      if (t.max_head_dim == tier) {
        least = std::min(least, t.smem_bytes);
        if (chosen < 0 && t.smem_bytes <= budget) {
          chosen = i;
        }
      }
    }
    if (chosen < 0) {
      return fail(Code::SharedMemoryExceeded, Operand::None, Field::None, least, budget);
    }
    // Sizes in 32 bits; the key-block kernel's grid (key blocks x sequences x kv heads) and the
    // row-sum kernel's (kBackwardWarps rows per block) on x.
    const int64_t keys = kBackwardTiles[chosen].keys_per_block;
    const int64_t key_blocks = (p.seq_k + keys - 1) / keys;
    const std::pair<Field, std::pair<int64_t, int64_t>> limits[] = {
        {Field::SeqQ, {p.seq_q, INT32_MAX}},
        {Field::SeqK, {p.seq_k, INT32_MAX}},
        {Field::Heads, {p.heads_q, INT32_MAX}},
        {Field::WorkUnits, {key_blocks * p.batch * p.heads_kv, INT32_MAX}},
        {Field::WorkUnits,
         {p.heads_q * (p.varlen ? r.q.shape[1] : p.batch * p.seq_q) / kBackwardWarps,
          INT32_MAX}}};
    for (const auto& [field, bound] : limits) {
      if (bound.first > bound.second) {
        return fail(Code::IndexOverflow, Operand::None, field, bound.first, bound.second,
                    static_cast<int64_t>(Kernel::Wmma));
      }
    }
    if (tile != nullptr) {
      *tile = chosen;
    }
    return {};
  } catch (...) {
    return out_of_host_memory();
  }
}

}  // namespace flashcore::core

namespace flashcore {

BackwardTable backward_tile_table() noexcept {
  return {core::kBackwardTiles, std::size(core::kBackwardTiles)};
}

}  // namespace flashcore
