// flashcore — fused multi-head attention forward on NVIDIA GPUs (C++17 interface).
//
// out = softmax(scale * Q K^T + causal mask) V, per batch and query head.
//
// Tensors are device pointers with element strides over the logical dimensions
// [batch, seq, heads, head_dim]; the last dimension must be contiguous. BSHD and BHSD layouts are
// both expressed through the strides. Query head h reads key/value head h / (heads_q / heads_kv)
// (GQA / MQA) without copying K or V.
//
// The Rust crate validates every argument before it calls in here (see src/validate.rs); this
// layer re-checks only what the kernels themselves need (CUTLASS's `check_supported`) and every
// CUDA call. Errors are thrown as flashcore::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace flashcore {

enum class DType : int32_t { F16 = 0, BF16 = 1 };

// Which keys a query row may see. Top-left: key j is visible to query i when j <= i.
// Bottom-right: when j <= i + (seq_k - seq_q) (the last query sees every key).
enum class Causal : int32_t { None = 0, TopLeft = 1, BottomRight = 2 };

enum class ErrorKind : int32_t {
  Cuda = 0,         // a CUDA runtime call or launch failed; `cuda_name` holds e.g. cudaErrorIllegalAddress
  InvalidArgument,  // the kernel rejected the arguments (alignment, unsupported tile)
  NoKernel,         // no kernel was compiled for the requested tile
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& cuda_name, const std::string& message)
      : std::runtime_error(encode(kind, cuda_name, message)), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  // "kind|cuda_name|message": the Rust bridge splits this into a typed error.
  static std::string encode(ErrorKind kind, const std::string& name, const std::string& msg) {
    return std::to_string(static_cast<int>(kind)) + "|" + name + "|" + msg;
  }
  ErrorKind kind_;
};

// The kernel tile: query rows per block, keys per inner iteration, largest head dim.
// (CUTLASS example 41: kQueriesPerBlock, kKeysPerBlock, kMaxK.)
struct Tile {
  int32_t queries_per_block;
  int32_t keys_per_block;
  int32_t max_head_dim;
};

// One attention forward problem. All strides are in elements.
struct FmhaArgs {
  DType dtype;
  const void* q;  // [batch, seq_q, heads_q, head_dim]
  const void* k;  // [batch, seq_k, heads_kv, head_dim]
  const void* v;  // [batch, seq_k, heads_kv, head_dim]
  void* out;      // [batch, seq_q, heads_q, head_dim]
  float* lse;     // optional [batch, heads_q, seq_q], dense, natural log; nullptr for none
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  int64_t q_stride[3];  // batch, seq, head
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  float scale;
  Causal causal;
  Tile tile;
};

// Launches the CUTLASS Ampere/Ada (example 41) kernel for `args.tile` on `stream` (of the current
// device). Returns once the launch is queued; asynchronous faults surface at the next
// synchronisation. Throws flashcore::Error.
void fmha_forward_sm80(const FmhaArgs& args, cudaStream_t stream);

// Launches flashcore's WMMA (FlashAttention-2 style) kernel for `args.tile` on `stream`, with the
// same argument conventions and error behaviour as fmha_forward_sm80.
void fmha_forward_wmma(const FmhaArgs& args, cudaStream_t stream);

}  // namespace flashcore
