// The C++ side of the cxx bridge (src/cuda/ffi.rs): CUDA runtime wrappers and the attention entry.
// Every function selects the device by ordinal first and turns every CUDA failure into a
// flashcore::Error, which cxx hands to Rust as an Err.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rust/cxx.h"

namespace flashcore::bridge {

struct DeviceInfo;
struct FmhaCall;

int32_t device_count();
DeviceInfo device_info(int32_t ordinal);
// Keeps memory freed to the device's default pool cached (release threshold = max), so
// stream-ordered allocations after the first are served without the driver.
void retain_pool_memory(int32_t ordinal);

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

// Launches `call.kernel` (0: CUTLASS example 41, 1: WMMA).
void fmha(const FmhaCall& call);
// Host nanoseconds per launch over `iters` back-to-back launches (bench only: the C++ side of the
// Rust-vs-C++ host-overhead comparison).
double fmha_host_ns(const FmhaCall& call, int32_t iters);

}  // namespace flashcore::bridge
