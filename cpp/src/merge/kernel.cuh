// The merge kernel: for each query row, combine `count` attention states (out_i, lse_i), each
// computed over its own set of keys, into the state over their union:
//
//   m = max_i lse_i,   w_i = exp(lse_i - m),   out = sum_i w_i out_i / sum_i w_i,
//   lse = m + log(sum_i w_i).
//
// A state whose lse is -inf covers no key: its weight is 0 and its output is never read (it may
// hold anything, NaN included). Every state -inf: out 0, lse -inf. A NaN lse makes the row NaN.
//
// Each thread owns 8 consecutive elements (16 bytes) of one row and accumulates them in f32;
// a block holds whole rows, so that the logsumexp of a row, which all its threads read, is
// written only after the block's barrier: the output may be one of the states (in-place merge).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "element.cuh"
#include "merge/launch.h"
#include "merge/state.cuh"

namespace flashcore::merge {

constexpr int kVector = 8;  // elements per thread: one 16-byte load or store


// `rows_per_block` rows of `head_dim / 8` threads each. The states are read through the launch
// parameters (`__grid_constant__`: indexed in place, never copied to local memory).
template <typename T>
__global__ void merge_kernel(__grid_constant__ const MergeLaunch p, int rows_per_block) {
  const int vectors = static_cast<int>(p.head_dim / kVector);
  const int local = static_cast<int>(threadIdx.x) / vectors;
  const int column = static_cast<int>(threadIdx.x) % vectors * kVector;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + local;
  const bool active = local < rows_per_block && row < p.batch * p.seq * p.heads;
  // Output rows are (batch, seq, head); logsumexps are dense (batch, head, seq).
  const int64_t h = active ? row % p.heads : 0, bs = active ? row / p.heads : 0;
  const int64_t s = bs % p.seq, b = bs / p.seq;
  const int64_t lse_index = (b * p.heads + h) * p.seq + s;

  float merged_lse = 0.f;
  if (active) {
    float m = -INFINITY;
    for (int64_t i = 0; i < p.count; ++i) {
      m = lse_max(p.lses[i][lse_index], m);
    }
    float acc[kVector] = {};
    if (m == -INFINITY) {
      merged_lse = -INFINITY;
    } else {
      float total = 0.f;
      for (int64_t i = 0; i < p.count; ++i) {
        const float w = state_weight(p.lses[i][lse_index], m);
        total += w;
        if (w != 0.f) {  // a state without keys is never read
          const int64_t* st = p.out_strides[i];
          const T* src = static_cast<const T*>(p.outs[i]) + b * st[0] + s * st[1] + h * st[2] +
                         column;
          const uint4 raw = *reinterpret_cast<const uint4*>(src);
          const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int e = 0; e < kVector; ++e) {
            acc[e] += w * to_float(x[e]);
          }
        }
      }
      const float inv = 1.f / total;
#pragma unroll
      for (int e = 0; e < kVector; ++e) {
        acc[e] *= inv;
      }
      merged_lse = merge::merged_lse(m, total);
    }
    uint4 raw;
    T* y = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      y[e] = from_float<T>(acc[e]);
    }
    T* dst = static_cast<T*>(p.out) + b * p.o_stride[0] + s * p.o_stride[1] +
             h * p.o_stride[2] + column;
    *reinterpret_cast<uint4*>(dst) = raw;
  }
  __syncthreads();  // every thread of the block has read its row's logsumexps
  if (active && column == 0 && p.lse != nullptr) {
    p.lse[lse_index] = merged_lse;
  }
}

}  // namespace flashcore::merge
