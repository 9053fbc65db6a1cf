// Describing a public API call for validation (internal, CUDA side): the current device, and each
// operand's address, shape, strides, element size and where it lives, asked of the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/bias.h"
#include "core/validate.h"

namespace flashcore::detail {

// The current device of the calling thread, or Code::NoDevice when CUDA cannot say.
inline Status current_device(int* device) {
  const cudaError_t e = cudaGetDevice(device);
  if (e != cudaSuccess) {
    return core::fail(Code::NoDevice, Operand::None, Field::None, 0, 0, 0,
                      std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
  }
  return {};
}

// Whether an operand of dims `shape` has no element (its pointer is never dereferenced).
inline bool no_elements(const int64_t shape[4]) {
  return shape[0] == 0 || shape[1] == 0 || shape[2] == 0 || shape[3] == 0;
}

// Where `data` lives: the device that owns it, the host, or (for an operand with no elements)
// `current`, where the call expects it.
inline int32_t location_of(const void* data, const int64_t shape[4], int32_t current) {
  if (no_elements(shape)) {
    return current;
  }
  if (data == nullptr) {
    return core::kHost;
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, data) != cudaSuccess) {
    (void)cudaGetLastError();  // not a pointer CUDA knows: clear the sticky-free error
    return core::kHost;
  }
  const bool device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  return device ? attr.device : core::kHost;
}

template <typename Ref>
inline core::TensorDesc describe(const Ref& t, int32_t element_bytes, int32_t current) {
  core::TensorDesc d;
  d.address = reinterpret_cast<uint64_t>(t.data);
  for (int i = 0; i < 4; ++i) {
    d.shape[i] = t.shape[i];
    d.stride[i] = t.stride[i];
  }
  d.location = location_of(t.data, t.shape, current);
  d.element_bytes = element_bytes;
  return d;
}

// A paged KV cache's block table and key lengths (their placement from CUDA's pointer
// attributes, as for tensors; an empty array is where the call runs).
inline core::PagesDesc describe_pages(const Pages& pages, int32_t current) {
  core::PagesDesc d;
  d.table = reinterpret_cast<uint64_t>(pages.block_table);
  d.seqlens = reinterpret_cast<uint64_t>(pages.seqlens_k);
  const int64_t table_shape[4] = {pages.batch, pages.pages_per_seq, 1, 1};
  const int64_t seqlens_shape[4] = {pages.batch, 1, 1, 1};
  d.table_location = location_of(pages.block_table, table_shape, current);
  d.seqlens_location = location_of(pages.seqlens_k, seqlens_shape, current);
  d.count = pages.batch;
  d.page_size = pages.page_size;
  d.pages_per_seq = pages.pages_per_seq;
  d.max_seqlen_k = pages.max_seqlen_k;
  d.host_table = pages.host_block_table;
  d.host_seqlens = pages.host_seqlens_k;
  return d;
}

// ALiBi slopes (their placement as for tensors).
inline core::AlibiDesc describe_alibi(const AlibiSlopes& slopes, int32_t current) {
  core::AlibiDesc d;
  d.address = reinterpret_cast<uint64_t>(slopes.data);
  const int64_t shape[4] = {slopes.batch, slopes.heads, 1, 1};
  d.location = location_of(slopes.data, shape, current);
  d.batch = slopes.batch;
  d.heads = slopes.heads;
  d.host = slopes.host;
  return d;
}

// An additive bias (its element size from its type: 0 for a value that is none).
inline core::TensorDesc describe_bias(const Bias& bias, int32_t current) {
  return describe(bias.tensor, core::bias_element_bytes(bias.dtype), current);
}

}  // namespace flashcore::detail

namespace flashcore::detail {

// One offsets array of a variable-length batch (`seqs.batch` + 1 int32 entries at `device`).
inline core::OffsetsDesc describe_offsets(const int32_t* device, const int32_t* host,
                                          const Sequences& seqs, int64_t max_len,
                                          int32_t current) {
  core::OffsetsDesc d;
  d.address = reinterpret_cast<uint64_t>(device);
  const int64_t shape[4] = {1, seqs.batch + 1, 1, 1};
  d.location = location_of(device, shape, current);
  d.count = seqs.batch;
  d.host = host;
  d.max_len = max_len;
  return d;
}

}  // namespace flashcore::detail
