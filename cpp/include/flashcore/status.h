// flashcore — the result of every public call: a Status, never an exception. Host-only.
//
// Each code is one variant of the Rust crate's `flashcore::Error` (the Rust side maps a Status to
// its typed error in src/ffi/mod.rs), so both languages report the same failure in the same
// category. Rust has three variants C++ never produces: Rank, StorageTooSmall and CudaNotBuilt.
#pragma once

#include <cstdint>
#include <string>

#include "flashcore/types.h"

namespace flashcore {

enum class Code : int32_t {
  Ok = 0,
  // Argument errors: nothing was launched.
  ShapeMismatch,         // operand's `field` is values[0], expected values[1]
  HeadsNotDivisible,     // values: query heads, key/value heads
  UnsupportedHeadDim,    // values[0]: the head dim (must be a multiple of 8 in 8..=256)
  NonContiguousHeadDim,  // operand's head-dim stride is values[0] (must be 1)
  MisalignedStride,      // operand's `field` stride values[0] is not a multiple of 8 elements
  MisalignedPointer,     // operand's address values[0] is not values[1]-byte aligned
  LseLayout,             // operand (a logsumexp) is not a dense [batch, heads, seq] float tensor
  DeviceMismatch,        // operand is on values[0], expected values[1] (-1: host, else ordinal):
                         // where q is (attention), where out is (merge_states)
  NoVisibleKeys,         // values: rows that see no key, seq_q, seq_k
  InvalidScale,          // the scale is not positive and finite (values[0]: its IEEE bits)
  SizeOverflow,          // operand's extent (shape x strides x element size) overflows 64 bits
  IndexOverflow,         // `field` = values[0] exceeds values[1], the kernel's limit (values[2])
  // Could not run here.
  BackendUnavailable,    // values[0]: the Kernel asked for; `message` says why
  SharedMemoryExceeded,  // values: bytes needed, bytes the device offers per block
  UnsupportedDevice,     // values: compute capability major, minor
  NoDevice,              // values[0]: the ordinal; `message` says why
  // Failures of CUDA or of a kernel's own argument check.
  Cuda,                  // `cuda_name` is e.g. cudaErrorIllegalAddress
  Launch,                // the kernel layer rejected the launch; see `message`
  // Argument errors (continued): nothing was launched.
  StateCount,            // merge_states: values[0] states given, allowed values[1] to values[2]
  InvalidOffsets,        // operand's (cu_seqlens_q / _k) rule `field` fails at entry values[0]:
                         // the entry (or the max length) is values[1], the bound values[2]
  OverlappingOutput,     // operand (an output) shares memory with the Operand values[0], or
                         // with itself when values[0] is 0 (None): two of its elements would
                         // share an address; values[1]: that Operand's list position
  InvalidPageTable,      // a paged KV cache breaks rule `field`: sequence values[0] (-1: none)
                         // has the value values[1] against the bound values[2]
  InvalidSoftcap,        // the softcap is not positive and finite (values[0]: its IEEE bits)
  // Could not run here (continued).
  OutOfDeviceMemory,     // a device allocation of values[0] bytes failed (cudaErrorMemoryAllocation);
                         // the process can go on: nothing was launched, the error is cleared
  // Argument errors (continued): nothing was launched.
  PlanMismatch,          // an AttentionPlan run: operand (Lse) is given where the plan has none,
                         // or missing where it has one, or (Operand::None) the plan is empty
  InvalidWindow,         // the sliding window's side `field` (WindowLeft / WindowRight) is
                         // values[0], which is negative
  InvalidAlibiSlope,     // ALiBi slope values[0] (index into the host copy) is not finite
                         // (values[1]: its IEEE bits)
  UnsupportedBiasType,   // the bias's dtype is values[0], not a BiasType
};

// Which tensor a Status is about. State and StateLse are the output and the logsumexp of one of
// merge_states' inputs; its position in the list is then values[2] (free in every code that
// names an operand). CuSeqlensQ / CuSeqlensK are a variable-length batch's offsets (Sequences).
// DOut is the backward pass's incoming gradient of the output; DQ, DK and DV its outputs.
enum class Operand : int32_t {
  None = 0, Q, K, V, Out, Lse, State, StateLse, CuSeqlensQ, CuSeqlensK, BlockTable, SeqlensK,
  AlibiSlopes, Bias, DOut, DQ, DK, DV
};

// Which dimension, stride or limit a Status is about.
enum class Field : int32_t {
  None = 0,
  Batch,
  Seq,
  Heads,
  HeadDim,
  SeqQ,
  SeqK,
  BatchTimesSeqQ,
  BatchStride,
  SeqStride,
  HeadStride,
  WorkUnits,  // query blocks x batch x heads (the Hopper kernel's scheduler counts them in 32 bits)
  // The rules of InvalidOffsets:
  FirstOffset,  // entry 0 (values[1]) must be 0
  OffsetOrder,  // entry values[0] (values[1]) is below the entry before it (values[2])
  LastOffset,   // entry `batch` (values[1]) must be the token count (values[2])
  MaxSeqLen,    // sequence values[0] has length values[1], above max_seqlen (values[2]); with
                // values[0] = -1: max_seqlen (values[1]) is negative or above the token count
  Sequences,    // the sequence count of a variable-length batch (ShapeMismatch, IndexOverflow)
  // The rules of InvalidPageTable:
  PageSize,      // the page size (values[1]) is not a power of two from 16 to 1024
  KeysBeyondPages,  // sequence values[0] has values[1] keys, more than its pages (or than
                    // max_seqlen_k) hold (values[2]); values[0] = -1: max_seqlen_k itself
  PageIndex,     // sequence values[0] uses page values[1], outside [0, num_pages = values[2])
  // The sides of a sliding window (InvalidWindow).
  WindowLeft,
  WindowRight,
};

struct Status {
  Code code = Code::Ok;
  Operand operand = Operand::None;
  Field field = Field::None;
  int64_t values[3] = {0, 0, 0};  // what each code puts here is listed beside the code
  std::string cuda_name;          // Code::Cuda and Code::OutOfDeviceMemory only
  std::string message;            // a full human-readable description (empty when ok)

  bool ok() const noexcept { return code == Code::Ok; }
};

// Stable lower-case names ("shape_mismatch", "q", "head_dim", ...).
const char* name(Code code) noexcept;
const char* name(Operand operand) noexcept;
const char* name(Field field) noexcept;
const char* name(Kernel kernel) noexcept;

}  // namespace flashcore
