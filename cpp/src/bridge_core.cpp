// The host-only half of the Rust bridge: validation, planning and the tile tables.
#include "flashcore/cpp/src/bridge.h"

#include <array>
#include <vector>

#include "bridge_convert.h"
#include "core/alibi.h"
#include "core/backward.h"
#include "core/merge.h"
#include "core/splits.h"

namespace flashcore::bridge {

// The Rust side (src/ffi/mod.rs) decodes these by value.
static_assert(static_cast<int>(Code::ShapeMismatch) == 1 && static_cast<int>(Code::LseLayout) == 7 &&
                  static_cast<int>(Code::SizeOverflow) == 11 && static_cast<int>(Code::NoDevice) == 16 &&
                  static_cast<int>(Code::Cuda) == 17 && static_cast<int>(Code::Launch) == 18 &&
                  static_cast<int>(Code::StateCount) == 19 &&
                  static_cast<int>(Code::InvalidOffsets) == 20 &&
                  static_cast<int>(Code::InvalidSoftcap) == 23 &&
                  static_cast<int>(Code::OutOfDeviceMemory) == 24 &&
                  static_cast<int>(Code::PlanMismatch) == 25 &&
                  static_cast<int>(Code::InvalidWindow) == 26 &&
                  static_cast<int>(Code::InvalidAlibiSlope) == 27 &&
                  static_cast<int>(Code::UnsupportedBiasType) == 28,
              "flashcore::Code values are part of the bridge: update src/ffi/mod.rs too");
static_assert(kKernelCount == 3 && static_cast<int>(Kernel::CutlassSm90) == 2,
              "flashcore::Kernel values are part of the bridge: update plan::Kernel in src/plan/mod.rs");
static_assert(static_cast<int>(Field::WorkUnits) == 11 &&
                  static_cast<int>(Field::FirstOffset) == 12 &&
                  static_cast<int>(Field::OffsetOrder) == 13 &&
                  static_cast<int>(Field::LastOffset) == 14 &&
                  static_cast<int>(Field::Sequences) == 16 && static_cast<int>(Operand::Lse) == 5 &&
                  static_cast<int>(Operand::StateLse) == 7 &&
                  static_cast<int>(Operand::CuSeqlensK) == 9 &&
                  static_cast<int>(Operand::AlibiSlopes) == 12 &&
                  static_cast<int>(Operand::Bias) == 13 &&
                  static_cast<int>(Operand::DV) == 17 &&
                  static_cast<int>(Field::WindowLeft) == 20 &&
                  static_cast<int>(Field::WindowRight) == 21,
              "flashcore::Field / Operand values are part of the bridge: update src/ffi/mod.rs");

StatusFfi validate(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                   rust::Slice<const int32_t> host_k, ProblemFfi& problem) {
  core::Problem p{};
  const Status s = core::validate(from_ffi(request, host_q, host_k), &p);
  if (s.ok()) {
    problem = to_ffi(p);
  }
  return to_ffi(s);
}

StatusFfi validate_backward(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                            rust::Slice<const int32_t> host_k, const DescFfi& dout,
                            const DescFfi& dq, const DescFfi& dk, const DescFfi& dv,
                            ProblemFfi& problem) {
  core::BackwardRequest r{from_ffi(request, host_q, host_k), from_ffi(dout), from_ffi(dq),
                          from_ffi(dk), from_ffi(dv)};
  core::Problem p{};
  const Status s = core::validate_backward(r, &p);
  if (s.ok()) {
    problem = to_ffi(p);
  }
  return to_ffi(s);
}

StatusFfi check_alibi_slopes(rust::Slice<const float> slopes) {
  const core::Failed f =
      core::check_alibi_values(slopes.data(), static_cast<int64_t>(slopes.size()));
  return to_ffi(f ? *f : Status{});
}

StatusFfi validate_merge(int32_t dtype, rust::Slice<const DescFfi> outs,
                         rust::Slice<const DescFfi> lses, const DescFfi& out, const DescFfi& lse,
                         bool has_lse) {
  // On the stack: validating allocates nothing (a count out of range is refused unread).
  std::array<core::TensorDesc, kMaxMergeStates> o, l;
  const bool fits = outs.size() <= o.size() && lses.size() == outs.size();
  for (size_t i = 0; fits && i < outs.size(); ++i) {
    o[i] = from_ffi(outs[i]);
    l[i] = from_ffi(lses[i]);
  }
  core::MergeRequest r;
  r.dtype = static_cast<DType>(dtype);
  r.outs = o.data();
  r.lses = l.data();
  r.count = fits ? static_cast<int64_t>(outs.size()) : kMaxMergeStates + 1;
  r.out = from_ffi(out);
  r.lse = from_ffi(lse);
  r.has_lse = has_lse;
  core::MergeProblem p{};
  return to_ffi(core::validate_merge(r, &p));
}

rust::Vec<TileRowFfi> table_rows(int32_t kernel, bool decode) {
  rust::Vec<TileRowFfi> out;
  const Kernel k = static_cast<Kernel>(kernel);
  for (const TileRow& r : decode ? decode_table(k) : tile_table(k)) {
    TileRowFfi row;
    row.arch = static_cast<int32_t>(r.arch);
    row.max_head_dim = r.max_head_dim;
    row.queries_per_block = r.tile.queries_per_block;
    row.keys_per_block = r.tile.keys_per_block;
    row.tile_max_head_dim = r.tile.max_head_dim;
    row.smem_bytes = r.smem_bytes;
    row.reason = rust::String(r.reason);
    out.push_back(std::move(row));
  }
  return out;
}

rust::Vec<BackwardTileRowFfi> backward_rows() {
  rust::Vec<BackwardTileRowFfi> out;
  for (const BackwardTileRow& r : backward_tile_table()) {
    BackwardTileRowFfi row;
    row.kernel = static_cast<int32_t>(r.kernel);
    row.max_head_dim = r.max_head_dim;
    row.warps = r.warps;
    row.keys_per_block = r.keys_per_block;
    row.rows_per_step = r.rows_per_step;
    row.step_buffers = r.step_buffers;
    row.smem_bytes = r.smem_bytes;
    row.reason = rust::String(r.reason);
    out.push_back(std::move(row));
  }
  return out;
}

RowRef select_row(int32_t kernel, int32_t arch, int64_t head_dim, int64_t query_rows) {
  const Kernel k = static_cast<Kernel>(kernel);
  return row_ref(k, flashcore::select_row(k, static_cast<ArchClass>(arch), head_dim, query_rows));
}

StatusFfi choose_row(int32_t kernel, int64_t head_dim, int64_t query_rows, const CapsFfi& caps,
                     int32_t forced_arch, RowRef& row) {
  const Kernel k = static_cast<Kernel>(kernel);
  std::optional<ArchClass> forced;
  if (forced_arch >= 0) {
    forced = static_cast<ArchClass>(forced_arch);
  }
  const TileRow* chosen = nullptr;
  const Status s = core::choose_row(k, head_dim, query_rows, from_ffi(caps), forced, &chosen);
  row = row_ref(k, chosen);
  return to_ffi(s);
}

int32_t arch_class(int32_t major, int32_t minor, int64_t smem_optin) {
  const std::optional<ArchClass> a = flashcore::arch_class(major, minor, smem_optin);
  return a ? static_cast<int32_t>(*a) : -1;
}

int64_t arch_smem(int32_t arch, bool per_sm) {
  const ArchClass a = static_cast<ArchClass>(arch);
  return per_sm ? smem_per_sm(a) : smem_per_block_optin(a);
}

int64_t wmma_smem_bytes(int32_t queries, int32_t keys, int32_t head_dim) {
  return flashcore::wmma_smem_bytes(Tile{queries, keys, head_dim});
}

int32_t auto_kernel(int32_t arch, int64_t query_rows, int64_t batch_heads, int64_t seq_k,
                    int64_t head_dim, int32_t multiprocessors) {
  return static_cast<int32_t>(flashcore::auto_kernel(static_cast<ArchClass>(arch), query_rows,
                                                     batch_heads, seq_k, head_dim,
                                                     multiprocessors));
}

namespace {

TileRow from_ffi(const TileRowFfi& row) {
  TileRow r{};
  r.arch = static_cast<ArchClass>(row.arch);
  r.max_head_dim = row.max_head_dim;
  r.tile = Tile{row.queries_per_block, row.keys_per_block, row.tile_max_head_dim};
  r.smem_bytes = row.smem_bytes;
  return r;
}

}  // namespace

int32_t kv_splits(int32_t kernel, const TileRowFfi& row, int64_t query_rows, int64_t batch_heads,
                  int64_t seq_k, int32_t multiprocessors) {
  return flashcore::kv_splits(static_cast<Kernel>(kernel), from_ffi(row), query_rows, batch_heads,
                              seq_k, multiprocessors);
}

int32_t sequence_splits(int32_t kernel, const TileRowFfi& row, int64_t query_rows, int64_t heads,
                        rust::Slice<const int64_t> key_counts, int32_t multiprocessors) {
  const core::SequenceSplits s =
      core::sequence_splits(static_cast<Kernel>(kernel), from_ffi(row), query_rows, heads,
                            std::vector<int64_t>(key_counts.begin(), key_counts.end()),
                            multiprocessors);
  return s.keys > 0 ? s.slots : 1;
}

LimitsFfi limits() {
  LimitsFfi l;
  l.max_head_dim = kMaxHeadDim;
  l.head_dim_multiple = kHeadDimMultiple;
  l.decode_max_query_rows = kDecodeMaxQueryRows;
  l.max_merge_states = kMaxMergeStates;
  return l;
}

}  // namespace flashcore::bridge
