// Conversions between the bridge's plain structs (generated from src/ffi/mod.rs) and the C++
// library's types. Host-only; included by bridge_core.cpp and bridge.cpp.
#pragma once

#include "core/validate.h"
#include "flashcore/src/ffi/mod.rs.h"

namespace flashcore::bridge {

inline core::TensorDesc from_ffi(const DescFfi& d) {
  core::TensorDesc t;
  t.address = d.address;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = d.shape[i];
    t.stride[i] = d.stride[i];
  }
  t.location = d.location;
  t.element_bytes = d.element_bytes;
  return t;
}

// One offsets array, with its host copy when `host` is not empty. A host copy whose length is
// not count + 1 is never read: the count becomes -1, which validation refuses.
inline core::OffsetsDesc from_ffi(const OffsetsFfi& o, rust::Slice<const int32_t> host) {
  core::OffsetsDesc d;
  d.address = o.address;
  d.location = o.location;
  d.count = o.count;
  d.max_len = o.max_len;
  if (!host.empty()) {
    const bool fits = o.count >= 0 && host.size() == static_cast<size_t>(o.count) + 1;
    d.host = fits ? host.data() : nullptr;
    d.count = fits ? o.count : -1;
  }
  return d;
}

// The request, with a variable-length batch's host offsets, or a paged call's host block table
// and key lengths, when given (empty slices: none).
inline core::Request from_ffi(const RequestFfi& r, rust::Slice<const int32_t> host_q = {},
                              rust::Slice<const int32_t> host_k = {}) {
  core::Request out;
  out.dtype = static_cast<DType>(r.dtype);
  out.q = from_ffi(r.q);
  out.k = from_ffi(r.k);
  out.v = from_ffi(r.v);
  out.out = from_ffi(r.out);
  out.lse = from_ffi(r.lse);
  out.has_lse = r.has_lse;
  if (r.has_scale) {
    out.options.scale = r.scale;
  }
  if (r.has_softcap) {
    out.options.softcap = r.softcap;
  }
  if (r.window_left >= 0) {
    out.options.window_left = r.window_left;
  }
  if (r.window_right >= 0) {
    out.options.window_right = r.window_right;
  }
  out.options.causal = static_cast<Causal>(r.causal);
  out.options.backend = static_cast<Backend>(r.backend);
  if (r.forced_arch >= 0) {
    out.options.force_arch_class = static_cast<ArchClass>(r.forced_arch);
  }
  out.varlen = r.varlen;
  if (r.varlen) {
    out.cu_q = from_ffi(r.cu_q, host_q);
    out.cu_k = from_ffi(r.cu_k, host_k);
  }
  out.paged = r.paged;
  if (r.paged) {  // a paged call's host arrays: the block table and the key lengths
    const PagesFfi& g = r.pages;
    core::PagesDesc& d = out.pages;
    d.table = g.table, d.seqlens = g.seqlens;
    d.table_location = g.table_location, d.seqlens_location = g.seqlens_location;
    d.count = g.count, d.page_size = g.page_size, d.pages_per_seq = g.pages_per_seq;
    d.max_seqlen_k = g.max_seqlen_k;
    const bool sized = g.count >= 0 && g.pages_per_seq >= 0 &&
                       host_q.size() == static_cast<size_t>(g.count * g.pages_per_seq) &&
                       host_k.size() == static_cast<size_t>(g.count);
    d.host_table = sized && !host_k.empty() ? host_q.data() : nullptr;
    d.host_seqlens = sized && !host_k.empty() ? host_k.data() : nullptr;
  }
  out.has_alibi = r.has_alibi;
  if (r.has_alibi) {  // the Rust crate checked its host slopes when it made them
    out.alibi.address = r.alibi.address;
    out.alibi.location = r.alibi.location;
    out.alibi.batch = r.alibi.batch;
    out.alibi.heads = r.alibi.heads;
  }
  out.has_bias = r.has_bias;
  if (r.has_bias) {
    out.bias_type = static_cast<BiasType>(r.bias_dtype);
    out.bias = from_ffi(r.bias);
  }
  return out;
}

inline ProblemFfi to_ffi(const core::Problem& p) {
  ProblemFfi out;
  out.batch = p.batch;
  out.seq_q = p.seq_q;
  out.seq_k = p.seq_k;
  out.heads_q = p.heads_q;
  out.heads_kv = p.heads_kv;
  out.head_dim = p.head_dim;
  out.scale = p.scale;
  out.causal = static_cast<int32_t>(p.causal);
  out.location = p.location;
  out.varlen = p.varlen;
  out.paged = p.paged;
  out.window_left = p.window_left;
  out.window_right = p.window_right;
  out.alibi = p.alibi;
  out.bias = p.bias;
  out.token_rows = p.token_rows;
  return out;
}

inline StatusFfi to_ffi(const Status& s) {
  StatusFfi out;
  out.code = static_cast<int32_t>(s.code);
  out.operand = static_cast<int32_t>(s.operand);
  out.field = static_cast<int32_t>(s.field);
  for (int i = 0; i < 3; ++i) {
    out.values[i] = s.values[i];
  }
  if (!s.ok()) {  // strings cross only on failure: the success path stays allocation-free
    out.cuda_name = rust::String(s.cuda_name);
    out.message = rust::String(s.message);
  }
  return out;
}

inline core::DeviceCaps from_ffi(const CapsFfi& c) {
  core::DeviceCaps caps;
  caps.major = c.major;
  caps.minor = c.minor;
  caps.smem_per_block_optin = c.smem_per_block_optin;
  caps.multiprocessors = c.multiprocessors;
  return caps;
}

// The row `ref` names in `kernel`'s tables, or nullptr.
inline const TileRow* row_of(Kernel kernel, const RowRef& ref) {
  const Table t = ref.decode ? decode_table(kernel) : tile_table(kernel);
  return ref.index >= 0 && static_cast<size_t>(ref.index) < t.count ? t.begin() + ref.index
                                                                     : nullptr;
}

// Which table `row` is in and where (index -1: none).
inline RowRef row_ref(Kernel kernel, const TileRow* row) {
  RowRef ref;
  ref.decode = false;
  ref.index = -1;
  if (row == nullptr) {
    return ref;
  }
  for (const bool decode : {false, true}) {
    const Table t = decode ? decode_table(kernel) : tile_table(kernel);
    if (row >= t.begin() && row < t.end()) {
      ref.decode = decode;
      ref.index = static_cast<int32_t>(row - t.begin());
    }
  }
  return ref;
}

}  // namespace flashcore::bridge
