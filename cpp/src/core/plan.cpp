// Planning: which kernel and tile-table row run a validated problem (see validate.h). The tables
// are in tables.cpp.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "core/splits.h"
#include "core/validate.h"

namespace flashcore {

std::optional<ArchClass> arch_class(int32_t major, int32_t minor,
                                    int64_t smem_optin) noexcept {
  if (major == 8) {
    return minor == 0 ? ArchClass::Sm80 : ArchClass::Sm86Sm89;
  }
  if (major == 9) {
    return ArchClass::Sm90;
  }
  if (major < 8) {
    return std::nullopt;
  }
  for (ArchClass a : {ArchClass::Sm80, ArchClass::Sm86Sm89}) {
    if (smem_optin >= smem_per_block_optin(a)) {
      return a;
    }
  }
  return std::nullopt;
}

const TileRow* select_row(Kernel kernel, ArchClass arch, int64_t head_dim,
                          int64_t query_rows) noexcept {
  auto find = [&](Table table) -> const TileRow* {
    for (const TileRow& row : table) {
      if (row.arch == arch && head_dim <= row.max_head_dim) {
        return &row;
      }
    }
    return nullptr;
  };
  if (query_rows <= kDecodeMaxQueryRows) {
    if (const TileRow* row = find(decode_table(kernel))) {
      return row;
    }
  }
  return find(tile_table(kernel));
}

namespace {

// ceil(a / b) for a >= 0, b > 0, without overflow.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The Hopper kernel's work units, (query block, batch x head) pairs, saturating at INT64_MAX.
int64_t sm90_work_units(int64_t query_rows, int64_t batch_heads) {
  const int64_t blocks = ceil_div(query_rows, kSm90QueriesPerBlock);
  const int64_t max = std::numeric_limits<int64_t>::max();
  return blocks != 0 && batch_heads > max / blocks ? max : blocks * batch_heads;
}

// Whether the Hopper family can run: compute capability 9.0 and a build with its kernels.
bool hopper_runs(ArchClass arch, uint32_t kernels) {
  return arch == ArchClass::Sm90 && (kernels >> int32_t(Kernel::CutlassSm90) & 1u) != 0;
}

}  // namespace

// Measured on the H200 (2026-11-23 and, for split-KV on the Hopper kernel, 2026-11-24;
// docs/PERFORMANCE.md, f16 and bf16):
// - decode (at most kDecodeMaxQueryRows query rows per head), by (batch x heads) units, d = 128,
//   GQA 32:8: the Hopper kernel up to two units per SM, its keys split below one (one sequence
//   of 32k keys, 8 units: 47.6 us in 16 splits against 55.9 split on WMMA and 769 on CUTLASS's
//   decode row; 64 units: 72.9 in 2 splits against 79.3; 128 units: 126.8 against 143.8 on WMMA;
//   256: 129.6 against 136.7 on CUTLASS), or without it WMMA below two units per SM (split; 144
//   against 211 on CUTLASS at 128 units, a tie at 256); beyond, CUTLASS's decode row (129.9 us at
//   512 units against 131.3 on Hopper and 139.3 on WMMA);
// - on compute capability 9.0, the Hopper kernel once its 128-row work units fill the SMs: it ran
//   every throughput shape of the bench list 1.2-2.6x faster than WMMA; and below that, on
//   every prefill of at least kSm90SmallPrefillFlops (an H100, 2026-11-26, bf16, the bench's
//   `--rows small`, us, WMMA against the Hopper kernel: 1x8x2048x64 46.4 / 31.7, 1x16x1024x128
//   48.2 / 23.8, 1x8x2048x128 84.9 / 34.9, 1x4x4096x128 158.1 / 58.6, 2x8x1024x256 89.8 / 39.4,
//   1x16x1024x128 causal 48.4 / 22.3; on the H200, docs/PERFORMANCE.md, 1x8x1024x64 22.0-22.6 /
//   20.5-20.6);
// - elsewhere WMMA, faster than CUTLASS everywhere but decode (2026-11-21), and than the Hopper
//   kernel on the seeds' smallest problems (H200: 1x8x512x64 13.8-14.2 / 14.8-14.9 us,
//   4x8x256x64 11.5-11.7 / 13.0-13.1; 2^29 flops each).
Kernel auto_kernel(ArchClass arch, int64_t query_rows, int64_t batch_heads, int64_t seq_k,
                   int64_t head_dim, int32_t multiprocessors, uint32_t kernels) noexcept {
  const bool hopper = hopper_runs(arch, kernels);
  if (query_rows <= kDecodeMaxQueryRows) {
    const int64_t sms = multiprocessors;
    if (hopper) {
      return batch_heads <= 2 * sms ? Kernel::CutlassSm90 : Kernel::CutlassSm80;
    }
    return batch_heads < 2 * sms ? Kernel::Wmma : Kernel::CutlassSm80;
  }
  const bool fills = sm90_work_units(query_rows, batch_heads) >= multiprocessors;
  const double flops = 4.0 * double(batch_heads) * double(query_rows) * double(seq_k) *
                       double(head_dim);
  return hopper && (fills || flops >= kSm90SmallPrefillFlops) ? Kernel::CutlassSm90
                                                                : Kernel::Wmma;
}

int64_t wmma_blocks_per_sm(const TileRow& row) noexcept {
  const int64_t warps = std::clamp<int64_t>(row.tile.queries_per_block / 16, 1, 4);
  const int64_t by_registers = 65536 / (warps * 32 * 256);
  const int64_t by_smem = smem_per_sm(row.arch) / (row.smem_bytes + 1024);
  return std::max<int64_t>(1, std::min(by_registers, by_smem));
}

namespace core {
namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr int64_t kGridYzMax = 65535;  // CUDA's gridDim.y / gridDim.z limit (heads, batch)
// The family that takes every paged cache, and the family that also takes them where Auto or the
// caller chose it (every family takes a variable-length batch).
constexpr Kernel kIndexedKernel = Kernel::Wmma;
constexpr Kernel kHopperIndexedKernel = Kernel::CutlassSm90;
// The family that applies every score modifier (softcap, sliding window, ALiBi, an additive
// bias), and the family that also applies them where Auto or the caller chose it: the Hopper
// kernel (its mask skips the key tiles outside a window's band; each tile's modifier and bias
// schedules: docs/HOPPER.md).
constexpr Kernel kModifierKernel = Kernel::Wmma;
constexpr Kernel kHopperModifierKernel = Kernel::CutlassSm90;

// A feature only `family` serves: a forced other family is refused, saying why (`lacks`) and
// which family serves it.
Status only_family(Kernel family, std::optional<Kernel> forced, const char* lacks) {
  if (!forced || *forced == family) {
    return {};
  }
  return fail(Code::BackendUnavailable, Operand::None, Field::None, static_cast<int64_t>(*forced),
              0, 0, std::string(lacks) + name(family) + " does");
}

Status limit(Kernel kernel, Field what, int64_t value, int64_t max) {
  if (value <= max) {
    return {};
  }
  return fail(Code::IndexOverflow, Operand::None, what, value, max, static_cast<int64_t>(kernel));
}

// The kernels index with 32-bit sequence lengths and put heads and batch on the grid's y and z
// axes; example 41 also keeps seq/head strides and batch * seq_q in 32 bits (the WMMA and Hopper
// kernels share those limits so that all accept the same problems).
Status check_index_limits(Kernel kernel, const Request& r, const Problem& p) {
  const int64_t batch_rows =
      p.seq_q != 0 && p.batch > kU32Max / p.seq_q ? kU32Max + 1 : p.batch * p.seq_q;
  const std::pair<Field, std::pair<int64_t, int64_t>> checks[] = {
      {Field::SeqQ, {p.seq_q, kI32Max}},
      {Field::SeqK, {p.seq_k, kI32Max}},
      {Field::Heads, {p.heads_q, kGridYzMax}},
      {Field::Batch, {p.batch, kGridYzMax}},
      {Field::BatchTimesSeqQ, {batch_rows, kU32Max}},
  };
  for (const auto& [what, vm] : checks) {
    Status s = limit(kernel, what, vm.first, vm.second);
    if (!s.ok()) {
      return s;
    }
  }
  if (r.varlen) {  // the kernels read the offsets as int32 and clamp them to the token counts
    for (const auto& [what, tokens] : {std::pair{Field::SeqQ, r.q.shape[1]},
                                       std::pair{Field::SeqK, r.k.shape[1]}}) {
      Status s = limit(kernel, what, tokens, kI32Max);
      if (!s.ok()) {
        return s;
      }
    }
  }
  for (const TensorDesc* t : {&r.q, &r.k, &r.v, &r.out}) {
    for (const auto& [what, value] :
         {std::pair{Field::SeqStride, t->stride[1]}, std::pair{Field::HeadStride, t->stride[2]}}) {
      Status s = limit(kernel, what, value, kI32Max);
      if (!s.ok()) {
        return s;
      }
    }
  }
  return {};
}

// The Hopper kernel reads Q, K and V through TMA descriptors, whose strides must be nonzero
// multiples of 16 bytes below 2^40 bytes (validation already gives multiples of 8 elements; a
// dimension of extent 1 gets a valid stride from the launcher). A broadcast (stride 0) dimension
// or a stride beyond the limit is refused before any descriptor is built.
Status check_tma_strides(Kernel kernel, const Request& r) {
  constexpr int64_t kMaxStride = (int64_t{1} << 40) / 2;  // elements of 2 bytes
  const std::pair<Operand, const TensorDesc*> operands[] = {
      {Operand::Q, &r.q}, {Operand::K, &r.k}, {Operand::V, &r.v}};
  for (const auto& [op, t] : operands) {
    for (int i = 0; i < 3; ++i) {
      if (t->shape[i] > 1 && (t->stride[i] == 0 || t->stride[i] >= kMaxStride)) {
        return fail(Code::BackendUnavailable, op, Field::None, static_cast<int64_t>(kernel), 0, 0,
                    std::string("its TMA loads need every stride of ") + name(op) +
                        " to be nonzero and below 2^39 elements (stride " +
                        std::to_string(t->stride[i]) + ")");
      }
    }
  }
  return {};
}

// The Hopper kernel's SASS is sm_90a: it runs on compute capability 9.0 only, whatever class is
// forced.
Status check_sm90_device(const DeviceCaps& caps) {
  if (caps.major == 9 && caps.minor == 0) {
    return {};
  }
  return fail(Code::BackendUnavailable, Operand::None, Field::None,
              static_cast<int64_t>(Kernel::CutlassSm90), 0, 0,
              "its SASS is sm_90a, for compute capability 9.0 only (this device is " +
                  std::to_string(caps.major) + "." + std::to_string(caps.minor) + ")");
}

// What the Hopper kernel needs beyond the shared limits: its device, a work-unit count that fits
// its scheduler's int, and Q, K and V that TMA can describe. Forced, a failure is the caller's
// error; under Auto, the planner takes WMMA instead.
Status check_sm90(const Request& r, const Problem& p, const DeviceCaps& caps) {
  constexpr Kernel kernel = Kernel::CutlassSm90;
  if (Status s = check_sm90_device(caps); !s.ok()) {
    return s;
  }
  Status s = limit(kernel, Field::WorkUnits, sm90_work_units(p.query_rows(), p.batch_heads()),
                   kI32Max);
  // An empty problem launches nothing and describes no tensor to TMA (a Q of no tokens may have
  // zero strides).
  return s.ok() && !p.empty() ? check_tma_strides(kernel, r) : s;
}

// The tile-table class a plan uses: the forced one, else the device's.
std::optional<ArchClass> class_for(const DeviceCaps& caps, std::optional<ArchClass> forced) {
  return forced ? forced : arch_class(caps.major, caps.minor, caps.smem_per_block_optin);
}

// Auto's family for a decode past two units per SM, where the dense rule (auto_kernel) gives
// CUTLASS's decode row. `hopper`: the Hopper kernel runs here; `host_counts`: the host knows
// every sequence's key count. Measured (one query per sequence, GQA 32:8, d = 128, bf16; us;
// docs/SERVING.md and docs/PERFORMANCE.md):
// - a paged cache: the Hopper kernel where its copies take whole 64-key slabs, else WMMA (the
//   H200, 2026-11-26, 64 x 2k keys in shuffled pages: pages of 64 138.8-141.3 on the Hopper
//   kernel against 144.6-146.8 on WMMA; pages of 16 149.7-153.0 against 143.6-146.5; example
//   41 reads no pages);
// - a variable-length batch: the Hopper kernel where its blocks walk the batch longest first
//   (host copies of the offsets, core/splits.h sequence_order) or its heads pack; else example
//   41 where the heads do not pack and WMMA where they do (an H100, 2026-11-26, same machine:
//   packed, 64 x 2048 keys: Hopper 193.6-193.8, example 41 199.7-200.2, WMMA 200.3-203.3; 64
//   sequences of 1024-2991 keys: 195.1-195.4, 212.6-214.1, 207.0-207.5; unpacked (BHSD), 16 x
//   8192: 302.4-304.9, 391.0-400.6, 427.7-429.6; 64 of 1024-2991 keys: 315.1-320.7,
//   413.3-421.0, 426.2-426.6);
// - a dense batch: the Hopper kernel where its blocks walk the batch a sequence's heads side
//   by side (at most kMaxSplitSequences sequences), else example 41 (the H200, 2026-11-26:
//   64 x 2048 keys 135.8-136.0 on the Hopper kernel against 138.1-138.4 on example 41; an
//   H100, same run: 64 x 2048 193.4 / 197.8, 128 x 1024 194.9 / 197.6, 256 x 512 196.8 /
//   197.7, MHA 32 x 32 heads x 2048 (1024 unpacked units) 367.9 / 374.0; past the walk,
//   512 x 256 203.3 / 197.5).
Kernel wide_decode_kernel(const Request& r, const Problem& p, bool hopper, bool host_counts) {
  if (p.paged) {
    return hopper && r.pages.page_size >= kSm90WideSlabKeys ? kHopperIndexedKernel
                                                            : kIndexedKernel;
  }
  const bool walks = p.batch <= kMaxSplitSequences && (host_counts || !p.varlen);
  if (hopper && (walks || (p.varlen && p.packs_heads()))) {
    return Kernel::CutlassSm90;
  }
  return p.varlen && p.packs_heads() ? kIndexedKernel : Kernel::CutlassSm80;
}

}  // namespace

Status choose_row(Kernel kernel, int64_t head_dim, int64_t query_rows, const DeviceCaps& caps,
                  std::optional<ArchClass> forced, const TileRow** out) noexcept {
  try {
    const std::optional<ArchClass> arch = class_for(caps, forced);
    if (!arch) {
      return fail(Code::UnsupportedDevice, Operand::None, Field::None, caps.major, caps.minor);
    }
    if ((caps.kernels >> static_cast<int32_t>(kernel) & 1u) == 0) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None,
                  static_cast<int64_t>(kernel), 0, 0,
                  "this build did not compile it (FLASHCORE_CUDA_ARCHS lacks its arch)");
    }
    if (kernel == Kernel::CutlassSm90) {
      // Whatever class is forced, the device must run sm_90a SASS.
      if (Status s = check_sm90_device(caps); !s.ok()) {
        return s;
      }
    }
    const TileRow* row = select_row(kernel, *arch, head_dim, query_rows);
    if (row == nullptr) {
      const bool serves_class = std::any_of(
          tile_table(kernel).begin(), tile_table(kernel).end(),
          [&](const TileRow& r) { return r.arch == *arch; });
      if (!serves_class) {
        return fail(Code::BackendUnavailable, Operand::None, Field::None,
                    static_cast<int64_t>(kernel), 0, 0,
                    std::string("it has no kernels for compute capability ") +
                        std::to_string(caps.major) + "." + std::to_string(caps.minor) +
                        (forced ? " (or the forced class)" : ""));
      }
      return fail(Code::UnsupportedHeadDim, Operand::None, Field::HeadDim, head_dim);
    }
    if (row->smem_bytes > caps.smem_per_block_optin) {
      return fail(Code::SharedMemoryExceeded, Operand::None, Field::None, row->smem_bytes,
                  caps.smem_per_block_optin);
    }
    *out = row;
    return {};
  } catch (...) {
    return out_of_host_memory();
  }
}

Status plan(const Request& r, const Problem& p, const DeviceCaps& caps, Plan* out) noexcept {
  try {
    const std::optional<ArchClass> arch = class_for(caps, r.options.force_arch_class);
    const std::optional<Kernel> forced = kernel_of(r.options.backend);
    Kernel kernel = forced.value_or(auto_kernel(arch.value_or(ArchClass::Sm80), p.query_rows(),
                                                p.batch_heads(), p.seq_k, p.head_dim,
                                                caps.multiprocessors, caps.kernels));
    // A variable-length batch takes the dense rule by its longest sequence (p.query_rows(),
    // p.seq_k). For prefill that bounds the batch's flops from above, so a tiny batch may run on
    // the Hopper kernel where WMMA would be a microsecond or two faster, and no batch runs on WMMA
    // where the Hopper kernel is 1.5-2.7x faster (docs/HOPPER.md, round 36). Decode: the Hopper
    // kernel up to two units per SM (on compute capability 9.0), else WMMA below two units per
    // SM, on (sequence, kv head) units where its one-query heads pack (Problem::packs_heads),
    // else on (sequence, query head) units. Measured unpacked on the H200 (2026-11-25, one query
    // per sequence, GQA 32:8, d = 128, bf16, both split): 32 units (1 x 32k keys) 103.4 us on the
    // Hopper kernel against 124.8 on WMMA, 128 units (32k, 4k, 1000 and 300 keys) 370.9 against
    // 372.5.
    const std::vector<int64_t> key_counts = host_key_counts(r);
    if (!forced && kernel == Kernel::CutlassSm80) {  // a decode past two units per SM
      kernel = wide_decode_kernel(r, p, hopper_runs(arch.value_or(ArchClass::Sm80), caps.kernels),
                                  !key_counts.empty());
    }
    if (p.paged && kernel != kHopperIndexedKernel) {
      // Paged caches run on the WMMA kernel, or on the Hopper kernel where Auto or the caller
      // chose it (docs/SERVING.md). A paged cache follows the dense rule: on the H200
      // (2026-11-24, bf16, GQA 32:8, d = 128) the Hopper kernel read paged decodes of 1 x 32k
      // and 16 x 8k keys in 59-62 and 179-186 us against 86 and 270 on WMMA.
      if (Status s = only_family(kIndexedKernel, forced,
                                 "it reads no paged caches (the Hopper kernel does on compute "
                                 "capability 9.0); ");
          !s.ok()) {
        return s;
      }
      kernel = kIndexedKernel;
    }
    // A bias runs on the Hopper kernel only where this build compiled its bias schedules (the
    // `sm90-bias` feature: six kernels, about four minutes of a clean build on 2 cores).
    if (p.bias && kernel == kHopperModifierKernel && !caps.sm90_bias) {
      if (forced) {
        return fail(Code::BackendUnavailable, Operand::None, Field::None,
                    static_cast<int64_t>(kernel), 0, 0,
                    "this build has no Hopper bias kernels (build with the `sm90-bias` feature, "
                    "CMake -DFLASHCORE_SM90_BIAS=ON); Wmma applies a bias");
      }
      kernel = kModifierKernel;
    }
    // Score modifiers run on the WMMA kernel, or on the Hopper kernel where Auto or the caller
    // chose it.
    const bool on_hopper = kernel == kHopperModifierKernel;
    if ((r.options.softcap || p.windowed() || p.alibi || p.bias) && !on_hopper) {
      if (Status s = only_family(kModifierKernel, forced,
                                 "it applies no softcap, sliding window, ALiBi or bias (the "
                                 "Hopper kernel does on compute capability 9.0); ");
          !s.ok()) {
        return s;
      }
      kernel = kModifierKernel;
    }
    // Both kernels compute a window's band and ALiBi distances in 32-bit ints: every
    // |i + offset -+ side| stays below 2 (seq_q + seq_k).
    if ((p.windowed() || p.alibi) && p.location != kHost) {
      if (Status s = limit(kernel, Field::SeqK, p.seq_q + p.seq_k, kI32Max / 4); !s.ok()) {
        return s;
      }
    }
    if (p.location == kHost) {
      return fail(Code::BackendUnavailable, Operand::None, Field::None,
                  static_cast<int64_t>(kernel), 0, 0,
                  "operands are on the host; GPU kernels need device memory");
    }
    Status s = check_index_limits(kernel, r, p);
    if (s.ok() && kernel == Kernel::CutlassSm90) {
      s = check_sm90(r, p, caps);
      if (!s.ok() && !forced) {
        kernel = Kernel::Wmma;
        s = check_index_limits(kernel, r, p);
      }
    }
    if (!s.ok()) {
      return s;
    }
    const TileRow* row = nullptr;
    s = choose_row(kernel, p.head_dim, p.query_rows(), caps, r.options.force_arch_class, &row);
    if (!s.ok()) {
      return s;
    }
    // A batch whose key counts the host knows splits each sequence by its own keys, else
    // every sequence by the longest's.
    Plan planned{kernel, row, 1};
    SequenceSplits by_sequence =
        sequence_splits(kernel, *row, p.query_rows(), p.batch_heads() / std::max<int64_t>(1, p.batch),
                        key_counts, caps.multiprocessors);
    if (by_sequence.keys > 0) {
      planned.splits = by_sequence.slots;
      planned.split_keys = by_sequence.keys;
      planned.split_first = std::move(by_sequence.first);
    } else {
      planned.splits = kv_splits(kernel, *row, p.query_rows(), p.batch_heads(), p.seq_k,
                                 caps.multiprocessors);
    }
    // A wide decode batch: the Hopper kernel's blocks walk it a sequence's heads side by side,
    // longest sequence first where the host knows the key counts.
    planned.sequence_order =
        sequence_order(kernel, p.query_rows(), planned.splits, p.batch_heads(), p.batch,
                       key_counts, caps.multiprocessors);
    *out = std::move(planned);
    return {};
  } catch (...) {
    return out_of_host_memory();
  }
}

}  // namespace core
}  // namespace flashcore
