// The problem shape of flashcore's Hopper kernel, as CUTLASS example 88's mainloop collective reads
// it (get<0..4>) plus modes of ours:
//
//   (batch, (group, heads_kv), seq_q, seq_k, head_dim, causal_offset, window_offset, diagonal,
//    q_start, k_start, key_first, lead)
//
// - The head mode is nested: query head h = hkv * group + g is the flat index of (g, hkv) in
//   (group, heads_kv), so K and V take stride 0 over `group` and GQA/MQA need no copies (CuTe
//   drops stride-0 modes from the TMA descriptor).
// - causal_offset: key j is visible to query row i when j - i <= causal_offset (and j < seq_k).
//   0 is top-left causal, seq_k - seq_q bottom-right, and seq_k (every j - i < seq_k) no mask.
//   A sliding window's right side moves it (core::Problem's band).
// - window_offset: key j is visible to query row i only when j - i >= window_offset: a sliding
//   window's left side; -seq_q bounds nothing (j - i > -seq_q for every row and key).
// - diagonal: the causal alignment's diagonal, j - i = 0 top-left and seq_k - seq_q otherwise,
//   from which ALiBi measures its distance |i + diagonal - j|.
// - q_start, k_start: the tokens where the sequence's queries and keys start along the sequence
//   axis: 0 in a dense batch; in a variable-length batch, whose sequences lie packed in tensors
//   of one batch entry, the sequence's offsets (each work unit has its own problem).
// - key_first: the unit's first key counted within its sequence: a key split's first key, else
//   0. An additive bias indexes its keys from the sequence's first (bias.cuh).
// - lead: query rows that pad the sequence at its start (see lead_rows), 0 but under a causal
//   mask; seq_q, q_start and the offsets count them.
// The fusion (mask.cuh) is default-constructed inside the collective, so the offsets travel in
// the problem shape rather than in the fusion.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"

namespace flashcore::sm90 {

using ProblemShape =
    cute::tuple<int, cute::tuple<int, int>, int, int, int, int, int, int, int, int, int, int>;

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
template <class P>
CUTLASS_HOST_DEVICE int diagonal(P const& p) { return cute::get<7>(p); }
template <class P>
CUTLASS_HOST_DEVICE int q_start(P const& p) { return cute::get<8>(p); }
template <class P>
CUTLASS_HOST_DEVICE int k_start(P const& p) { return cute::get<9>(p); }
template <class P>
CUTLASS_HOST_DEVICE int key_first(P const& p) { return cute::get<10>(p); }
template <class P>
CUTLASS_HOST_DEVICE int lead(P const& p) { return cute::get<11>(p); }

// A call's band rule, the same for every sequence of a batch (core::Problem's band): key j is
// visible to query i when i + diagonal - left <= j <= i + diagonal + right, the diagonal being 0
// top-left and seq_k - seq_q otherwise; a causal mask bounds the right side at 0 and a side of
// -1 bounds nothing.
struct Band {
  bool top_left = false;
  bool causal = false;
  int64_t left = -1, right = -1;
};

// A causal or window offset (a bound on j - i) clamped to [-seq_q, seq_k], which bounds nothing
// more (j - i lies in (-seq_q, seq_k)), so that it fits an int for any window.
CUTLASS_HOST_DEVICE int clamp_offset(int64_t offset, int64_t seq_q, int64_t seq_k) {
  return int(cute::max(-seq_q, cute::min(seq_k, offset)));
}

// The problem of `seq_q` queries and `seq_k` keys under `band`, starting at tokens `q_start` and
// `k_start`.
CUTLASS_HOST_DEVICE ProblemShape make_problem(int batch, cute::tuple<int, int> heads, int seq_q,
                                              int seq_k, int head_dim, Band const& band,
                                              int q_start = 0, int k_start = 0) {
  const int64_t diag = band.top_left ? 0 : int64_t(seq_k) - seq_q;
  const int64_t upper = band.causal ? diag : band.right >= 0 ? diag + band.right : seq_k;
  const int64_t lower = band.left >= 0 ? diag - band.left : -int64_t(seq_q);
  return ProblemShape{batch,
                      heads,
                      seq_q,
                      seq_k,
                      head_dim,
                      clamp_offset(upper, seq_q, seq_k),
                      clamp_offset(lower, seq_q, seq_k),
                      int(diag),
                      q_start,
                      k_start,
                      0,
                      0};
}

// The part of `p` that keys [first, first + count) of its sequence make: a split of the keys
// (split-KV). Its keys start `first` tokens later and number at most `count` (none past the
// sequence's end); the band and the diagonal move with them, so each key keeps its visibility,
// its ALiBi distance and its bias column.
CUTLASS_HOST_DEVICE ProblemShape key_split(ProblemShape p, int64_t first, int64_t count) {
  const int64_t keys = cute::max(int64_t(0), cute::min(count, int64_t(seq_k(p)) - first));
  cute::get<5>(p) = clamp_offset(causal_offset(p) - first, seq_q(p), keys);
  cute::get<6>(p) = clamp_offset(window_offset(p) - first, seq_q(p), keys);
  cute::get<7>(p) = int(diagonal(p) - first);
  cute::get<9>(p) = int(k_start(p) + first);
  cute::get<10>(p) = int(key_first(p) + first);
  cute::get<3>(p) = int(keys);
  return p;
}

// Where a sequence's last query block would be partial, `p` with the block's missing rows, in
// whole warpgroups (64 rows), moved to the sequence's start: `rows` leading rows that no query
// holds. Under a causal mask the last block is the longest, and now runs with every warpgroup;
// the one short of rows is the first, the shortest (docs/HOPPER.md, round 48). Every row keeps
// its keys, its band and its ALiBi distance: seq_q, q_start, the offsets and the diagonal count
// the leading rows, whose warpgroups compute and store nothing (mainloop.cuh, kernel.cuh), and
// whose Q loads fall before the sequence's first token (TMA zero-fills them in a dense batch,
// or reads the tokens before in a variable-length one).
template <int kBlockRows>
CUTLASS_HOST_DEVICE ProblemShape lead_rows(ProblemShape p) {
  const int rows = (kBlockRows - seq_q(p) % kBlockRows) % kBlockRows / 64 * 64;
  cute::get<2>(p) = seq_q(p) + rows;
  cute::get<5>(p) = causal_offset(p) - rows;
  cute::get<6>(p) = clamp_offset(int64_t(window_offset(p)) - rows, seq_q(p), seq_k(p));
  cute::get<7>(p) = diagonal(p) - rows;
  cute::get<8>(p) = q_start(p) - rows;
  cute::get<11>(p) = rows;
  return p;
}

// `p`'s seq_q and q_start without lead_rows' leading rows, which is all the epilogue reads.
CUTLASS_HOST_DEVICE ProblemShape own_rows(ProblemShape p) {
  cute::get<2>(p) = seq_q(p) - lead(p);
  cute::get<8>(p) = q_start(p) + lead(p);
  cute::get<11>(p) = 0;
  return p;
}

}  // namespace flashcore::sm90
