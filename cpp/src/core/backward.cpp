// Validation of the backward pass: see backward.h.
#include "core/backward.h"

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
    if (r.forward.varlen || r.forward.paged) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None, -1, 0, 0,
                  "the backward pass takes dense batches (no variable-length batch or paged "
                  "cache yet)");
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

}  // namespace flashcore::core
