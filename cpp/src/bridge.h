// The C++ side of the Rust crate's cxx bridge (src/ffi/mod.rs). Host-only functions
// (validation, planning, tables) are in bridge_core.cpp and always built; the CUDA functions
// (bridge.cpp) only with the crate's `cuda` feature. CUDA wrappers select the device by ordinal
// first and throw detail::Failure, which cxx hands to Rust as an Err.
#pragma once

#include <cstddef>
#include <cstdint>

#include <memory>

#include "prepared.h"
#include "rust/cxx.h"

namespace flashcore::bridge {

struct DescFfi;
struct OffsetsFfi;
struct RequestFfi;
struct ProblemFfi;
struct StatusFfi;
struct TileRowFfi;
struct BackwardTileRowFfi;
struct BackwardRanFfi;
struct RowRef;
struct CapsFfi;
struct LimitsFfi;
struct LaunchedFfi;
struct DeviceInfo;
struct PoolUsage;
struct RunAddressesFfi;

// ---- host-only (bridge_core.cpp) ----
StatusFfi validate(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                   rust::Slice<const int32_t> host_k, ProblemFfi& problem);
// The ALiBi slopes' values (core::check_alibi_values), checked once when Rust makes them.
StatusFfi check_alibi_slopes(rust::Slice<const float> slopes);
// A backward call (core::validate_backward): the forward call's request (its logsumexp required;
// a variable-length batch's offsets with their host copies) and the gradients dout, dq, dk, dv.
StatusFfi validate_backward(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                            rust::Slice<const int32_t> host_k, const DescFfi& dout,
                            const DescFfi& dq, const DescFfi& dk, const DescFfi& dv,
                            ProblemFfi& problem);
StatusFfi validate_merge(int32_t dtype, rust::Slice<const DescFfi> outs,
                         rust::Slice<const DescFfi> lses, const DescFfi& out, const DescFfi& lse,
                         bool has_lse);
rust::Vec<TileRowFfi> table_rows(int32_t kernel, bool decode);
rust::Vec<BackwardTileRowFfi> backward_rows();
RowRef select_row(int32_t kernel, int32_t arch, int64_t head_dim, int64_t query_rows);
StatusFfi choose_row(int32_t kernel, int64_t head_dim, int64_t query_rows, const CapsFfi& caps,
                     int32_t forced_arch, RowRef& row);
int32_t arch_class(int32_t major, int32_t minor, int64_t smem_optin);
int64_t arch_smem(int32_t arch, bool per_sm);
int64_t wmma_smem_bytes(int32_t queries, int32_t keys, int32_t head_dim);
int32_t auto_kernel(int32_t arch, int64_t query_rows, int64_t batch_heads, int64_t seq_k,
                    int64_t head_dim, int32_t multiprocessors);
int32_t kv_splits(int32_t kernel, const TileRowFfi& row, int64_t query_rows, int64_t batch_heads,
                  int64_t seq_k, int32_t multiprocessors);
int32_t sequence_splits(int32_t kernel, const TileRowFfi& row, int64_t query_rows, int64_t heads,
                        rust::Slice<const int64_t> key_counts, int32_t multiprocessors);
LimitsFfi limits();

// ---- CUDA (bridge.cpp) ----
// One bit per kernel family this build compiled (bit `Kernel`).
uint32_t compiled_kernels();
int32_t device_count();
DeviceInfo device_info(int32_t ordinal);
// Keeps memory freed to the device's default pool cached (release threshold = max), so
// stream-ordered allocations after the first are served without the driver.
void retain_pool_memory(int32_t ordinal);
// The default pool's reserved and used bytes (current and high-water marks).
PoolUsage pool_usage(int32_t ordinal);
// Returns the default pool's unused memory to the driver, keeping at least `keep` bytes.
void trim_pool(int32_t ordinal, size_t keep);
// cudaMemGetInfo's free bytes of device `ordinal`.
size_t free_memory(int32_t ordinal);

size_t stream_create(int32_t ordinal);
void stream_destroy(int32_t ordinal, size_t stream);
void stream_synchronize(int32_t ordinal, size_t stream);
void stream_wait_event(int32_t ordinal, size_t stream, size_t event);

size_t event_create(int32_t ordinal);
void event_destroy(int32_t ordinal, size_t event);
void event_record(int32_t ordinal, size_t event, size_t stream);
void event_synchronize(int32_t ordinal, size_t event);
float event_elapsed_ms(int32_t ordinal, size_t start, size_t end);

size_t malloc_async(int32_t ordinal, size_t bytes, size_t stream);
void free_async(int32_t ordinal, size_t ptr, size_t stream);
void copy_to_device(int32_t ordinal, size_t dst, rust::Slice<const uint8_t> src, size_t stream);
void copy_to_host(int32_t ordinal, rust::Slice<uint8_t> dst, size_t src, size_t stream);
void copy_device(int32_t ordinal, size_t dst, size_t src, size_t bytes, size_t stream);

// Stream capture into a CUDA graph (relaxed mode: only the capturing stream is affected).
void capture_begin(int32_t ordinal, size_t stream);
// Ends the capture on `stream` and instantiates what it recorded: the executable graph (the
// recorded graph itself is destroyed). Throws, with the capture ended, where it was invalidated.
size_t capture_end(int32_t ordinal, size_t stream);
void graph_launch(int32_t ordinal, size_t exec, size_t stream);
void graph_destroy(int32_t ordinal, size_t exec);

LaunchedFfi attention(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                      rust::Slice<const int32_t> host_k, const CapsFfi& caps, int32_t ordinal,
                      size_t stream);
// Validates and plans `request` (with the host copies of its offsets or key counts) for a
// device with `caps`, as attention() does, and keeps the result for runs on device `ordinal`
// (the request without its host copies, which no run reads). `out` says what every run
// launches, or why there is no plan; then the result is null.
std::shared_ptr<detail::Prepared> prepare_plan(const RequestFfi& request,
                                               rust::Slice<const int32_t> host_q,
                                               rust::Slice<const int32_t> host_k,
                                               const CapsFfi& caps, int32_t ordinal,
                                               LaunchedFfi& out) noexcept;
// A run of `call` on the tensors at `a` (whose dims, strides and places the caller matched to
// the plan) on `stream` of device `ordinal`: detail::run_prepared, as the C++
// flashcore::AttentionPlan::run does (addresses checked, then the launch).
StatusFfi run_plan(const detail::Prepared& call, const RunAddressesFfi& a, int32_t ordinal,
                   size_t stream);
// Host nanoseconds per iteration of `iters` iterations from a C++ loop (bench only); `mode`: 0 the
// launcher alone, 1 the public attention_forward, 2 a planned run (address check + launcher).
StatusFfi attention_host_ns(const RequestFfi& request, const CapsFfi& caps, int32_t ordinal,
                            size_t stream, int32_t iters, int32_t mode, double& ns);
LaunchedFfi cpp_attention_forward(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                                  rust::Slice<const int32_t> host_k, int32_t ordinal,
                                  size_t stream);
// Through the public C++ API (flashcore::merge_states), which validates again.
StatusFfi merge_states(int32_t dtype, rust::Slice<const DescFfi> outs,
                       rust::Slice<const DescFfi> lses, const DescFfi& out, const DescFfi& lse,
                       bool has_lse, int32_t ordinal, size_t stream);
// Through the public C++ API (flashcore::attention_backward), which validates: the forward
// call `request` (with its logsumexp; host_q / host_k as for validate) and the gradients dout,
// dq, dk, dv.
// On success, `row` is the index of the row of backward_tile_table() that ran.
BackwardRanFfi attention_backward(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                                  rust::Slice<const int32_t> host_k, const DescFfi& dout,
                                  const DescFfi& dq, const DescFfi& dk, const DescFfi& dv,
                                  int32_t ordinal, size_t stream);
size_t cpp_malloc(int32_t ordinal, size_t bytes);
void cpp_free(int32_t ordinal, size_t ptr);
void cpp_upload(int32_t ordinal, size_t dst, rust::Slice<const uint8_t> src);

}  // namespace flashcore::bridge
