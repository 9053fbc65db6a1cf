// Offsets of a variable-length batch: see varlen.h.
#include "core/varlen.h"

namespace flashcore::core {
namespace {

Failed check_one(Operand op, const OffsetsDesc& o, int64_t tokens, int32_t location) {
  FLASHCORE_TRY(check_word_array(op, o.address, o.location, location));
  if (o.count < 0) {
    return fail(Code::SizeOverflow, op, Field::Sequences, o.count, 0, 0,
                "negative sequence count");
  }
  if (o.max_len < 0 || o.max_len > tokens) {
    return fail(Code::InvalidOffsets, op, Field::MaxSeqLen, -1, o.max_len, tokens);
  }
  if (o.host == nullptr) {
    return std::nullopt;
  }
  if (o.host[0] != 0) {
    return fail(Code::InvalidOffsets, op, Field::FirstOffset, 0, o.host[0], 0);
  }
  for (int64_t b = 0; b < o.count; ++b) {
    const int64_t from = o.host[b], to = o.host[b + 1];
    if (to < from) {
      return fail(Code::InvalidOffsets, op, Field::OffsetOrder, b + 1, to, from);
    }
    if (to - from > o.max_len) {
      return fail(Code::InvalidOffsets, op, Field::MaxSeqLen, b, to - from, o.max_len);
    }
  }
  if (o.host[o.count] != tokens) {
    return fail(Code::InvalidOffsets, op, Field::LastOffset, o.count, o.host[o.count], tokens);
  }
  return std::nullopt;
}

}  // namespace

Failed check_offsets(const Request& r) {
  const int32_t location = r.q.location;
  FLASHCORE_TRY(check_one(Operand::CuSeqlensQ, r.cu_q, r.q.shape[1], location));
  FLASHCORE_TRY(check_one(Operand::CuSeqlensK, r.cu_k, r.k.shape[1], location));
  if (r.cu_k.count != r.cu_q.count) {
    return fail(Code::ShapeMismatch, Operand::CuSeqlensK, Field::Sequences, r.cu_k.count,
                r.cu_q.count);
  }
  return std::nullopt;
}

Failed check_sequence_keys(const Request& r) {
  const int32_t* q = r.cu_q.host;
  const int32_t* k = r.cu_k.host;
  if (q == nullptr || k == nullptr || r.q.shape[2] == 0) {
    return std::nullopt;
  }
  for (int64_t b = 0; b < r.cu_q.count; ++b) {
    const int64_t sq = q[b + 1] - q[b], sk = k[b + 1] - k[b];
    const int64_t blind = blind_rows(r.options, sq, sk);
    if (blind > 0) {
      return fail(Code::NoVisibleKeys, Operand::None, Field::Sequences, blind, sq, sk,
                  "sequence " + std::to_string(b));
    }
  }
  return std::nullopt;
}

}  // namespace flashcore::core
