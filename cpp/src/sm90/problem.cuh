// The problem shape of flashcore's Hopper kernel, as CUTLASS example 88's mainloop collective reads
// it (get<0..4>) plus two modes of ours:
//
//   (batch, (group, heads_kv), seq_q, seq_k, head_dim, causal_offset, window_offset)
//
// - The head mode is nested: query head h = hkv * group + g is the flat index of (g, hkv) in
//   (group, heads_kv), so K and V take stride 0 over `group` and GQA/MQA need no copies (CuTe
//   drops stride-0 modes from the TMA descriptor).
// - causal_offset: key j is visible to query row i when j - i <= causal_offset (and j < seq_k).
//   0 is top-left causal, seq_k - seq_q bottom-right, and seq_k (every j - i < seq_k) no mask.
//   A sliding window's right side moves it (core::Problem's band).
// - window_offset: key j is visible to query row i only when j - i >= window_offset: a sliding
//   window's left side; -seq_q bounds nothing (j - i > -seq_q for every row and key).
//   The fusion (mask.cuh) is default-constructed inside the collective, so the offsets travel in
//   the problem shape rather than in the fusion.
#pragma once

#include "cute/tensor.hpp"

namespace flashcore::sm90 {

using ProblemShape = cute::tuple<int, cute::tuple<int, int>, int, int, int, int, int>;

// Strides in elements, CuTe style: (seq, head_dim = 1, (batch, (group, heads_kv))).
using StrideQO = cute::tuple<int, cute::_1, cute::tuple<int64_t, cute::tuple<int64_t, int64_t>>>;
using StrideKV = cute::tuple<int, cute::_1, cute::tuple<int64_t, cute::tuple<cute::_0, int64_t>>>;

template <class P>
CUTLASS_HOST_DEVICE int seq_q(P const& p) { return cute::get<2>(p); }
template <class P>
CUTLASS_HOST_DEVICE int seq_k(P const& p) { return cute::get<3>(p); }
template <class P>
CUTLASS_HOST_DEVICE int causal_offset(P const& p) { return cute::get<5>(p); }
template <class P>
CUTLASS_HOST_DEVICE int window_offset(P const& p) { return cute::get<6>(p); }

}  // namespace flashcore::sm90
