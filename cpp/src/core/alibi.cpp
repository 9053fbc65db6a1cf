// ALiBi slopes' checks: see alibi.h.
#include "core/alibi.h"

#include <cmath>
#include <cstring>

namespace flashcore::core {

Failed check_alibi_values(const float* host, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(host[i])) {
      uint32_t bits = 0;
      std::memcpy(&bits, &host[i], sizeof(bits));
      return fail(Code::InvalidAlibiSlope, Operand::AlibiSlopes, Field::None, i, bits);
    }
  }
  return std::nullopt;
}

Failed check_alibi(const Request& r, int64_t sequences) {
  const AlibiDesc& a = r.alibi;
  FLASHCORE_TRY(check_word_array(Operand::AlibiSlopes, a.address, a.location, r.q.location));
  if (a.batch != 1 && a.batch != sequences) {
    return fail(Code::ShapeMismatch, Operand::AlibiSlopes, Field::Batch, a.batch, sequences);
  }
  if (a.heads != r.q.shape[2]) {
    return fail(Code::ShapeMismatch, Operand::AlibiSlopes, Field::Heads, a.heads, r.q.shape[2]);
  }
  if (a.host != nullptr) {
    return check_alibi_values(a.host, a.batch * a.heads);
  }
  return std::nullopt;
}

}  // namespace flashcore::core
