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

// Whether Auto takes the Hopper kernel for a call it covers (problem `p`, the head dim's `tier`)
// on a device with `caps`: where its grid has a block per SM at least (or the SM count is
// unknown). Measured on the H200 (calls 268 and 269, bf16, against the wide WMMA rows): 1.23x
// on 4x16x2048x128, 1.12x causal, 1.25x on GQA 4x32(kv8)x2048x128 causal, 1.08x on
// 8x16x2048x64 causal; smaller grids are unmeasured.
bool hopper_by_auto(int64_t tier, const Problem& p, const DeviceCaps& caps) {
  for (const BackwardTileRow& t : kBackwardTiles) {
    if (t.kernel == BackwardKernel::Hopper && t.max_head_dim == tier) {
      const int64_t blocks =
          (p.seq_k + t.keys_per_block - 1) / t.keys_per_block * p.batch * p.heads_kv;
      return caps.multiprocessors == 0 || blocks >= caps.multiprocessors;
    }
  }
  return false;
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

Status hopper_backward_covers(const BackwardRequest& r, const Problem& p,
                              const DeviceCaps& caps) noexcept {
  try {
    const Request& f = r.forward;
    const auto refuse = [](const std::string& why) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None,
                  static_cast<int64_t>(Kernel::CutlassSm90), 0, 0,
                  "the Hopper backward kernel " + why);
    };
    if ((caps.kernels >> static_cast<int32_t>(Kernel::CutlassSm90) & 1u) == 0) {
      return refuse("is not in this build (FLASHCORE_CUDA_ARCHS lacks 90)");
    }
    if (caps.major != 9 || caps.minor != 0) {
      return refuse("runs on compute capability 9.0 only (sm_90a SASS)");
    }
    if (f.options.force_arch_class && *f.options.force_arch_class != ArchClass::Sm90) {
      return refuse("is not another class's choice (force_arch_class)");
    }
    if (p.varlen || f.options.softcap.value_or(0.0f) != 0.0f || f.has_alibi || f.has_bias) {
      return refuse("takes no variable-length batch, softcap, ALiBi or bias");
    }
    if (p.head_dim > 128 || p.head_dim % 8 != 0 || p.seq_q == 0) {
      return refuse("takes head dims up to 128 in multiples of 8, and queries");
    }
    // TMA: 16-byte aligned rows and bases, strides below 2^40 bytes (dimensions of extent 1 get
    // a stride from the launcher).
    constexpr int64_t kMaxStride = (int64_t{1} << 40) / 2;
    for (const TensorDesc* t : {&f.q, &f.k, &f.v, &r.dout}) {
      if (t->address % 16 != 0) {
        return refuse("reads operands at 16-byte aligned addresses (TMA)");
      }
      for (int i = 0; i < 3; ++i) {
        if (t->shape[i] > 1 && (t->stride[i] % 8 != 0 || t->stride[i] <= 0 ||
                                t->stride[i] >= kMaxStride)) {
          return refuse("reads operands with positive strides in multiples of 8 elements below "
                        "2^39 (TMA)");
        }
      }
    }
    return {};
  } catch (...) {
    return out_of_host_memory();
  }
}

Status plan_backward(const BackwardRequest& r, const Problem& p, const DeviceCaps& caps,
                     int* tile) noexcept {
  try {
    const Request& f = r.forward;
    const std::optional<Kernel> forced = kernel_of(f.options.backend);
    if (forced && *forced == Kernel::CutlassSm80) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None,
                  static_cast<int64_t>(*forced), 0, 0,
                  "the backward pass runs on the wmma kernels and, on compute capability 9.0, "
                  "the Hopper kernel (ask for Auto, Wmma or CutlassSm90)");
    }
    if (!arch_class(caps.major, caps.minor, caps.smem_per_block_optin)) {
      return fail(Code::UnsupportedDevice, Operand::None, Field::None, caps.major, caps.minor);
    }
    // The Hopper rows take the calls the kernel covers when CutlassSm90 is forced (it must then
    // cover the call) and those hopper_by_auto picks under Auto; the WMMA rows the others.
    const int64_t tier = backward_tier(p.head_dim);
    const Status hopper = hopper_backward_covers(r, p, caps);
    if (forced == Kernel::CutlassSm90 && !hopper.ok()) {
      return hopper;
    }
    const bool on_hopper = forced == Kernel::CutlassSm90 ||
                           (!forced && hopper.ok() && hopper_by_auto(tier, p, caps));
    const auto takes = [&](const BackwardTileRow& t) {
      return (t.kernel == BackwardKernel::Hopper) == on_hopper;
    };
    // The first row of the head dim's tier that takes the call and fits the device and the
    // class forced in the options (testing an L4's or an A100's choice on another GPU).
    const std::optional<ArchClass> forced_class = f.options.force_arch_class;
    const int64_t budget = forced_class ? std::min(caps.smem_per_block_optin,
                                                   smem_per_block_optin(*forced_class))
                                        : caps.smem_per_block_optin;
    int chosen = -1;
    int64_t least = INT64_MAX;  // the smallest need of the tier's rows that take the call
    for (int i = 0; i < kBackwardTileCount; ++i) {
      const BackwardTileRow& t = kBackwardTiles[i];
      if (t.max_head_dim == tier && takes(t)) {
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
         {p.heads_q * (p.varlen ? f.q.shape[1] : p.batch * p.seq_q) / kBackwardWarps,
          INT32_MAX}}};
    const Kernel kernel = kBackwardTiles[chosen].kernel == BackwardKernel::Hopper
                              ? Kernel::CutlassSm90
                              : Kernel::Wmma;
    for (const auto& [field, bound] : limits) {
      if (bound.first > bound.second) {
        return fail(Code::IndexOverflow, Operand::None, field, bound.first, bound.second,
                    static_cast<int64_t>(kernel));
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
