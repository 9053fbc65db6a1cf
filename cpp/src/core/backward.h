// Validation of the backward pass (host-only): the gradients of attention's output with respect
// to Q, K and V, from the forward call's operands, its output and logsumexp, and the incoming
// gradient of the output. The Rust crate calls it before anything runs (src/backward.rs).
#pragma once

#include "core/validate.h"

namespace flashcore::core {

// One backward call. `forward` describes the forward call as it ran: Q, K, V, its output `out`
// and its logsumexp `lse` (required: has_lse is ignored), its options. `dout` is the gradient
// of the output (shaped like out); dq, dk and dv receive the gradients of Q, K and V (shaped
// like them).
struct BackwardRequest {
  Request forward;
  TensorDesc dout, dq, dk, dv;
};

// Checks `r` and describes its problem in `*problem`: first every rule of validate() on the
// forward call with its logsumexp; then the gradients' extents, locations, shapes, strides and
// alignment (dout, dq, dk, dv in this order); then that no gradient output overlaps itself,
// another gradient output or any input (q, k, v, out, lse, dout, bias). A variable-length batch
// or a paged cache is BackendUnavailable: the backward pass takes dense batches.
Status validate_backward(const BackwardRequest& r, Problem* problem) noexcept;

}  // namespace flashcore::core
