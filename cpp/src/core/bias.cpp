// An additive bias's checks: see bias.h.
#include "core/bias.h"

namespace flashcore::core {

int32_t bias_element_bytes(BiasType type) {
  switch (type) {
    case BiasType::F16:
    case BiasType::BF16: return 2;
    case BiasType::F32: return 4;
  }
  return 0;
}

Failed check_bias_extent(const Request& r) {
  if (bias_element_bytes(r.bias_type) == 0) {
    return fail(Code::UnsupportedBiasType, Operand::Bias, Field::None,
                static_cast<int64_t>(r.bias_type));
  }
  return check_extent(Operand::Bias, r.bias);
}

Failed check_bias(const Request& r, int64_t sequences, int64_t seq_q, int64_t seq_k) {
  const TensorDesc& t = r.bias;
  const int32_t bytes = t.element_bytes;
  FLASHCORE_TRY(expect_location(Operand::Bias, t, r.q.location));
  const int64_t expected[4] = {sequences, seq_q, r.q.shape[2], seq_k};
  constexpr Field kFields[4] = {Field::Batch, Field::SeqQ, Field::Heads, Field::SeqK};
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] != expected[i] && t.shape[i] != 1) {
      return fail(Code::ShapeMismatch, Operand::Bias, kFields[i], t.shape[i], expected[i]);
    }
  }
  if (t.location != kHost && t.address % static_cast<uint64_t>(bytes) != 0) {
    return fail(Code::MisalignedPointer, Operand::Bias, Field::None,
                static_cast<int64_t>(t.address), bytes);
  }
  return std::nullopt;
}

}  // namespace flashcore::core
