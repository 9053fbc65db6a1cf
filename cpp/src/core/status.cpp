// Status names and messages (status.h), composed in one place.
#include <cstring>
#include <string>

#include "core/validate.h"

namespace flashcore {

const char* name(Code code) noexcept {
  switch (code) {
    case Code::Ok: return "ok";
    case Code::ShapeMismatch: return "shape_mismatch";
    case Code::HeadsNotDivisible: return "heads_not_divisible";
    case Code::UnsupportedHeadDim: return "unsupported_head_dim";
    case Code::NonContiguousHeadDim: return "non_contiguous_head_dim";
    case Code::MisalignedStride: return "misaligned_stride";
    case Code::MisalignedPointer: return "misaligned_pointer";
    case Code::LseLayout: return "lse_layout";
    case Code::DeviceMismatch: return "device_mismatch";
    case Code::NoVisibleKeys: return "no_visible_keys";
    case Code::InvalidScale: return "invalid_scale";
    case Code::SizeOverflow: return "size_overflow";
    case Code::IndexOverflow: return "index_overflow";
    case Code::BackendUnavailable: return "backend_unavailable";
    case Code::SharedMemoryExceeded: return "shared_memory_exceeded";
    case Code::UnsupportedDevice: return "unsupported_device";
    case Code::NoDevice: return "no_device";
    case Code::Cuda: return "cuda";
    case Code::Launch: return "launch";
    case Code::StateCount: return "state_count";
    case Code::InvalidOffsets: return "invalid_offsets";
    case Code::OverlappingOutput: return "overlapping_output";
    case Code::InvalidPageTable: return "invalid_page_table";
    case Code::InvalidSoftcap: return "invalid_softcap";
    case Code::OutOfDeviceMemory: return "out_of_device_memory";
    case Code::PlanMismatch: return "plan_mismatch";
    case Code::InvalidWindow: return "invalid_window";
    case Code::InvalidAlibiSlope: return "invalid_alibi_slope";
    case Code::UnsupportedBiasType: return "unsupported_bias_type";
  }
  return "unknown";
}

const char* name(Operand operand) noexcept {
  switch (operand) {
    case Operand::None: return "";
    case Operand::Q: return "q";
    case Operand::K: return "k";
    case Operand::V: return "v";
    case Operand::Out: return "out";
    case Operand::Lse: return "lse";
    case Operand::State: return "state out";
    case Operand::StateLse: return "state lse";
    case Operand::CuSeqlensQ: return "cu_seqlens_q";
    case Operand::CuSeqlensK: return "cu_seqlens_k";
    case Operand::BlockTable: return "block_table";
    case Operand::SeqlensK: return "seqlens_k";
    case Operand::AlibiSlopes: return "alibi_slopes";
    case Operand::Bias: return "bias";
    case Operand::DOut: return "dout";
    case Operand::DQ: return "dq";
    case Operand::DK: return "dk";
    case Operand::DV: return "dv";
  }
  return "unknown";
}

const char* name(Field field) noexcept {
  switch (field) {
    case Field::None: return "";
    case Field::Batch: return "batch";
    case Field::Seq: return "seq";
    case Field::Heads: return "heads";
    case Field::HeadDim: return "head_dim";
    case Field::SeqQ: return "seq_q";
    case Field::SeqK: return "seq_k";
    case Field::BatchTimesSeqQ: return "batch * seq_q";
    case Field::BatchStride: return "batch stride";
    case Field::SeqStride: return "seq stride";
    case Field::HeadStride: return "head stride";
    case Field::WorkUnits: return "work units (query blocks x batch x heads)";
    case Field::FirstOffset: return "first offset";
    case Field::OffsetOrder: return "offset order";
    case Field::LastOffset: return "last offset";
    case Field::MaxSeqLen: return "max_seqlen";
    case Field::Sequences: return "sequences";
    case Field::PageSize: return "page_size";
    case Field::KeysBeyondPages: return "keys_beyond_pages";
    case Field::PageIndex: return "page_index";
    case Field::WindowLeft: return "window_left";
    case Field::WindowRight: return "window_right";
  }
  return "unknown";
}

const char* name(Kernel kernel) noexcept {
  switch (kernel) {
    case Kernel::CutlassSm80: return "cutlass-sm80";
    case Kernel::Wmma: return "wmma";
    case Kernel::CutlassSm90: return "cutlass-sm90";
  }
  return "unknown";
}

namespace core {
namespace {

std::string where(int64_t location) {
  return location == kHost ? std::string("host") : "cuda:" + std::to_string(location);
}

// The operand as messages name it: "q", ..., or "states[3].out" / "states[3].lse".
std::string operand_name(const Status& s) {
  switch (s.operand) {
    case Operand::State: return "states[" + std::to_string(s.values[2]) + "].out";
    case Operand::StateLse: return "states[" + std::to_string(s.values[2]) + "].lse";
    default: return name(s.operand);
  }
}

// What an InvalidOffsets status says (status.h lists the values of each rule).
std::string offsets_rule(const Status& s) {
  const auto v = [&](int i) { return std::to_string(s.values[i]); };
  switch (s.field) {
    case Field::FirstOffset:
      return "entry 0 is " + v(1) + ", must be 0";
    case Field::OffsetOrder:
      return "entry " + v(0) + " (" + v(1) + ") is below the entry before it (" + v(2) + ")";
    case Field::LastOffset:
      return "the last entry (" + v(0) + ") is " + v(1) + ", must be the token count " + v(2);
    case Field::MaxSeqLen:
      return s.values[0] < 0 ? "max_seqlen " + v(1) + " is negative or above the token count " + v(2)
                             : "sequence " + v(0) + " has length " + v(1) + ", above max_seqlen " +
                                   v(2);
    default:
      return "invalid";
  }
}

// The float whose IEEE bits a status value holds (InvalidScale, InvalidSoftcap, InvalidAlibiSlope),
// as text.
std::string float_of(int64_t value) {
  float f = 0;
  const uint32_t bits = static_cast<uint32_t>(value);
  std::memcpy(&f, &bits, sizeof(f));
  return std::to_string(f);
}

// What an InvalidPageTable status says (status.h lists the values of each rule).
std::string pages_rule(const Status& s) {
  const auto v = [&](int i) { return std::to_string(s.values[i]); };
  switch (s.field) {
    case Field::PageSize:
      return "page size " + v(1) + " is not a power of two from 16 to 1024";
    case Field::KeysBeyondPages:
      return s.values[0] < 0 ? "max_seqlen_k " + v(1) + " is negative or above the " + v(2) +
                                   " keys a sequence's pages hold"
                             : "sequence " + v(0) + " has " + v(1) + " keys, above the " + v(2) +
                                   " its pages (or max_seqlen_k) allow";
    case Field::PageIndex:
      return "sequence " + v(0) + " uses page " + v(1) + ", outside the cache's " + v(2) +
             " pages";
    case Field::Sequences:
      return "variable-length queries with a paged cache are not supported yet";
    default:
      return "invalid";
  }
}

std::string message(const Status& s, const std::string& detail) {
  const std::string op = operand_name(s), field = name(s.field);
  const auto v = [&](int i) { return std::to_string(s.values[i]); };
  switch (s.code) {
    case Code::ShapeMismatch:
      return op + ": " + field + " is " + v(0) + ", expected " + v(1);
    case Code::HeadsNotDivisible:
      return v(1) + " key/value heads do not divide " + v(0) + " query heads";
    case Code::UnsupportedHeadDim:
      return "head dim " + v(0) + " is not supported (must be a multiple of 8, from 8 to 256)";
    case Code::NonContiguousHeadDim:
      return op + ": the head-dim stride is " + v(0) + "; the last dimension must be contiguous";
    case Code::MisalignedStride:
      return op + ": stride " + v(0) + " of dimension " + field + " is not a multiple of 8 elements";
    case Code::MisalignedPointer:
      return op + ": device pointer " + v(0) + " is not " + v(1) + "-byte aligned";
    case Code::LseLayout:
      return op + " must be a dense [batch, heads, seq] float tensor (BHSD strides, head dim 1)";
    case Code::DeviceMismatch:
      return op + " is on " + where(s.values[0]) +
             (s.operand == Operand::Q ? ", but the current device is " : ", expected ") +
             where(s.values[1]);
    case Code::NoVisibleKeys:
      return v(0) + " query rows would attend to no key (seq_q " + v(1) + ", seq_k " + v(2) + ")" +
             (detail.empty() ? "" : " in " + detail);
    case Code::InvalidScale:
      return "softmax scale " + float_of(s.values[0]) + " is not a positive finite number";
    case Code::SizeOverflow:
      return op + ": " + (detail.empty() ? "the addressed extent overflows 64 bits" : detail) +
             (field.empty() ? "" : " (dimension " + field + ")");
    case Code::IndexOverflow:
      return field + " = " + v(0) + " exceeds the " + name(static_cast<Kernel>(s.values[2])) +
             " backend's limit of " + v(1);
    case Code::BackendUnavailable:
      return std::string("backend ") + name(static_cast<Kernel>(s.values[0])) +
             " is unavailable: " + detail;
    case Code::SharedMemoryExceeded:
      return "tile needs " + v(0) + " bytes of shared memory per block, the device offers " + v(1);
    case Code::UnsupportedDevice:
      return "compute capability " + v(0) + "." + v(1) + " is not supported (needs 8.0 or later)";
    case Code::NoDevice:
      return "no CUDA device " + v(0) + ": " + detail;
    case Code::StateCount:
      return "merge_states takes " + v(1) + " to " + v(2) + " states, got " + v(0);
    case Code::InvalidOffsets:
      return op + ": " + offsets_rule(s);
    case Code::InvalidPageTable:
      return "paged KV cache: " + pages_rule(s);
    case Code::InvalidSoftcap:
      return "softcap " + float_of(s.values[0]) + " is not a positive finite number";
    case Code::InvalidWindow:
      return "sliding window: " + field + " is " + v(0) + ", a window side must not be negative";
    case Code::InvalidAlibiSlope:
      return "ALiBi slope " + v(0) + " is " + float_of(s.values[1]) + ", not finite";
    case Code::UnsupportedBiasType:
      return "bias element type " + v(0) + " is none of F16 (0), BF16 (1) and F32 (2)";
    case Code::PlanMismatch:
      return s.operand == Operand::None ? "the plan is empty (made by no successful create)"
                                        : op + " is given where the plan has none, or missing "
                                               "where it has one";
    case Code::OverlappingOutput:
      return s.values[0] == 0
                 ? op + ": two of its elements share an address (its strides, ordered, must each "
                        "exceed the span of the smaller ones)"
                 : op + " overlaps the memory of " + name(static_cast<Operand>(s.values[0])) +
                       (s.values[0] >= int64_t(Operand::State) &&
                                s.values[0] <= int64_t(Operand::StateLse)
                            ? " " + v(1)
                            : std::string());
    case Code::Ok:
    case Code::Cuda:
    case Code::Launch:
    case Code::OutOfDeviceMemory:  // raised by the CUDA layer, which writes its own message
      break;
  }
  return detail;
}

}  // namespace

Status out_of_host_memory() noexcept {
  Status s;
  s.code = Code::Launch;
  s.message = "out of memory";  // short enough for the small-string buffer: no allocation
  return s;
}

Status fail(Code code, Operand operand, Field field, int64_t a, int64_t b, int64_t c,
            std::string detail) {
  Status s;
  s.code = code;
  s.operand = operand;
  s.field = field;
  s.values[0] = a;
  s.values[1] = b;
  s.values[2] = c;
  s.message = message(s, detail);
  return s;
}

}  // namespace core
}  // namespace flashcore
