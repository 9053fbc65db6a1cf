// Host-only tests of the C++ core (validation and planning, cpp/src/core/): the inputs that only C++
// callers can produce (negative sizes and strides, null or raw addresses, any scale bits), which
// the Rust API cannot express and so its tests cannot reach. No CUDA needed:
//   g++ -std=c++17 -Icpp/include -Icpp/src cpp/src/core/*.cpp cpp/tests/core_test.cpp && ./a.out
// (run by .ci/run). Exits non-zero, naming each failed check, if any fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <cstdlib>
#include <new>

#include "core/alibi.h"
#include "core/backward.h"
#include "core/merge.h"
#include "core/splits.h"
#include "core/validate.h"


// Every allocation through operator new in this process (the test is single-threaded): the
// host hot path (validation and planning of a valid call) must make none.
static long g_allocations = 0;

void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) {
    return p;
  }
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using flashcore::Causal;
using flashcore::Code;
using flashcore::Field;
using flashcore::Kernel;
using flashcore::Operand;
using flashcore::Status;
using flashcore::core::kHost;
using flashcore::core::Problem;
using flashcore::core::Request;
using flashcore::core::TensorDesc;

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// A dense BSHD operand [b, s, h, d] on device 0 at a 16-byte aligned address: `address`, or
// (0) one 2^36 bytes past the last operand made so, so that operands never overlap.
TensorDesc bshd(int64_t b, int64_t s, int64_t h, int64_t d, uint64_t address = 0) {
  static uint64_t next = uint64_t{1} << 36;
  TensorDesc t;
  t.address = address != 0 ? address : (next += uint64_t{1} << 36);
  t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
  flashcore::bshd_strides(t.shape, t.stride);
  t.location = 0;
  return t;
}

// A valid call: 2 x 100 queries, 8 heads, 130 keys on 2 kv heads, d = 64.
Request valid() {
  Request r;
  r.q = bshd(2, 100, 8, 64);
  r.k = bshd(2, 130, 2, 64);
  r.v = bshd(2, 130, 2, 64);
  r.out = bshd(2, 100, 8, 64);
  return r;
}

Status check(const Request& r) {
  Problem p{};
  return flashcore::core::validate(r, &p);
}

void expect_code(const Request& r, Code code, Operand op, const std::string& what) {
  const Status s = check(r);
  expect(s.code == code && s.operand == op,
         what + ": got " + flashcore::name(s.code) + " for " + flashcore::name(s.operand) +
             " (" + s.message + ")");
  expect(s.ok() || !s.message.empty(), what + ": an error carries a message");
}

void valid_call_passes() {
  Problem p{};
  const Status s = flashcore::core::validate(valid(), &p);
  expect(s.ok(), "the valid call passes: " + s.message);
  expect(p.batch == 2 && p.seq_q == 100 && p.seq_k == 130 && p.heads_q == 8 && p.heads_kv == 2 &&
             p.head_dim == 64,
         "the problem describes the call");
  expect(std::fabs(p.scale - 0.125f) < 1e-7f, "the default scale is 1/sqrt(d)");
}

void negative_sizes_and_strides() {
  for (int dim = 0; dim < 4; ++dim) {
    Request r = valid();
    r.k.shape[dim] = -1;
    const Status s = check(r);
    expect(s.code == Code::SizeOverflow && s.operand == Operand::K &&
               s.message.find("negative") != std::string::npos,
           "negative k dim " + std::to_string(dim) + ": " + s.message);
    Request t = valid();
    t.out.stride[dim] = -8;
    expect_code(t, Code::SizeOverflow, Operand::Out, "negative out stride " + std::to_string(dim));
  }
  Request r = valid();
  r.has_lse = true;
  r.lse = bshd(2, 100, 8, 1);
  r.lse.shape[3] = -1;
  expect_code(r, Code::SizeOverflow, Operand::Lse, "negative lse dim");
}

void extents_that_overflow() {
  Request r = valid();
  r.v.stride[0] = std::numeric_limits<int64_t>::max() / 2;
  expect_code(r, Code::SizeOverflow, Operand::V, "a batch stride whose extent overflows");
  Request big = valid();
  big.q.stride[1] = std::numeric_limits<int64_t>::max() / 100;  // fits in elements, not in bytes
  expect_code(big, Code::SizeOverflow, Operand::Q, "an extent that overflows in bytes");
}

void addresses_and_locations() {
  Request r = valid();
  r.v.address += 8;  // 8-byte aligned only
  expect_code(r, Code::MisalignedPointer, Operand::V, "misaligned v");
  Request host_k = valid();
  host_k.k.location = kHost;
  expect_code(host_k, Code::DeviceMismatch, Operand::K, "k on the host, q on device 0");
  Request other = valid();
  other.out.location = 1;
  expect_code(other, Code::DeviceMismatch, Operand::Out, "out on device 1");
  Request on_host = valid();
  uint64_t address = 0x10002;  // host tensors have no alignment rule
  for (TensorDesc* t : {&on_host.q, &on_host.k, &on_host.v, &on_host.out}) {
    t->location = kHost;
    t->address = (address += 0x1000000);
  }
  expect(check(on_host).ok(), "host operands at any address validate");
}

void scales() {
  for (float bad : {0.0f, -0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    Request r = valid();
    r.options.scale = bad;
    expect_code(r, Code::InvalidScale, Operand::None, "scale " + std::to_string(bad));
  }
  for (float ok : {1e-40f, 1e-3f, 2.0f}) {
    Request r = valid();
    r.options.scale = ok;
    expect(check(r).ok(), "scale " + std::to_string(ok) + " is accepted");
  }
}

void heads_and_head_dims() {
  Request r = valid();
  r.k = r.v = bshd(2, 130, 3, 64);
  expect_code(r, Code::HeadsNotDivisible, Operand::None, "8 query heads on 3 kv heads");
  for (int64_t d : {int64_t{4}, int64_t{100}, int64_t{264}}) {
    Request t;
    t.q = t.out = bshd(1, 16, 1, d);
    t.k = t.v = bshd(1, 16, 1, d);
    expect_code(t, Code::UnsupportedHeadDim, Operand::None, "head dim " + std::to_string(d));
  }
}

void planning() {
  const int64_t limit = flashcore::kDecodeMaxQueryRows;
  using flashcore::ArchClass;
  using flashcore::auto_kernel;
  expect(auto_kernel(ArchClass::Sm90, 1, 4096, 2048, 128, 132) == Kernel::CutlassSm80,
         "Auto: one query on many units runs CUTLASS's decode row");
  // Decode by units on 132 SMs: the Hopper kernel up to two per SM (split below one), without
  // it WMMA below two per SM (split), CUTLASS's decode row beyond.
  const uint32_t without_sm90 = ~(1u << int(Kernel::CutlassSm90));
  const std::tuple<int64_t, Kernel, Kernel> decode[] = {
      {1, Kernel::CutlassSm90, Kernel::Wmma},
      {115, Kernel::CutlassSm90, Kernel::Wmma},
      {116, Kernel::CutlassSm90, Kernel::Wmma},
      {132, Kernel::CutlassSm90, Kernel::Wmma},
      {263, Kernel::CutlassSm90, Kernel::Wmma},
      {264, Kernel::CutlassSm90, Kernel::CutlassSm80},
      {265, Kernel::CutlassSm80, Kernel::CutlassSm80},
  };
  for (const auto& [units, with, without] : decode) {
    expect(auto_kernel(ArchClass::Sm90, 4, units, 8192, 128, 132) == with &&
               auto_kernel(ArchClass::Sm90, 4, units, 8192, 128, 132, without_sm90) == without &&
               auto_kernel(ArchClass::Sm80, limit, units, 8192, 128, 132) == without,
           "Auto: decode on " + std::to_string(units) + " units");
  }
  expect(auto_kernel(ArchClass::Sm86Sm89, limit, 4096, 4096, 128, 58) == Kernel::CutlassSm80,
         "Auto: the decode limit");
  expect(auto_kernel(ArchClass::Sm86Sm89, limit + 1, 4096, 4096, 128, 58) == Kernel::Wmma,
         "Auto: above it, WMMA on an L4");
  expect(auto_kernel(ArchClass::Sm90, 4096, 64, 4096, 64, 132) == Kernel::CutlassSm90,
         "Auto: the Hopper kernel on a filled H200");
  expect(auto_kernel(ArchClass::Sm90, 512, 8, 512, 64, 132) == Kernel::Wmma,
         "Auto: WMMA on a small problem on an H200");
  // Below one unit per SM, the Hopper kernel from kSm90SmallPrefillFlops on (2^30 flops:
  // 1 x 8 x 1024 x 64 takes 2^31, 1 x 8 x 512 x 64 and 4 x 8 x 256 x 64 2^29).
  expect(auto_kernel(ArchClass::Sm90, 1024, 8, 1024, 64, 132) == Kernel::CutlassSm90 &&
             auto_kernel(ArchClass::Sm90, 512, 16, 512, 128, 132) == Kernel::CutlassSm90 &&
             auto_kernel(ArchClass::Sm90, 256, 32, 256, 64, 132) == Kernel::Wmma &&
             auto_kernel(ArchClass::Sm90, 512, 8, 1024, 64, 132) == Kernel::CutlassSm90 &&
             auto_kernel(ArchClass::Sm90, 512, 8, 1023, 64, 132) == Kernel::Wmma,
         "Auto: the Hopper kernel on small prefills of at least 2^30 flops");
  expect(auto_kernel(ArchClass::Sm86Sm89, 1024, 8, 1 << 20, 256, 58) == Kernel::Wmma,
         "Auto: WMMA on an L4 whatever the flops");
  const uint32_t no_sm90 = ~(1u << int(Kernel::CutlassSm90));
  expect(auto_kernel(ArchClass::Sm90, 4096, 64, 4096, 64, 132, no_sm90) == Kernel::Wmma,
         "Auto: WMMA on an H200 when the Hopper kernel was not built");
  expect(auto_kernel(ArchClass::Sm90, std::numeric_limits<int64_t>::max(),
                     std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                     256, 132) == Kernel::CutlassSm90,
         "Auto: no overflow at the limits");
  Request r = valid();
  Problem p{};
  expect(flashcore::core::validate(r, &p).ok(), "valid for planning");
  flashcore::core::DeviceCaps l4{8, 9, 99 * 1024, ~0u, 58};
  flashcore::core::Plan plan{};
  Status s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.row->arch == flashcore::ArchClass::Sm86Sm89,
         "an L4 runs WMMA's sm_89 row: " + s.message);
  flashcore::core::DeviceCaps volta{7, 0, 96 * 1024};
  expect(flashcore::core::plan(r, p, volta, &plan).code == Code::UnsupportedDevice,
         "compute capability 7.0 is refused");
  // Newer than every SASS (the driver compiles the PTX): the class by shared memory, never the
  // Hopper kernel's.
  expect(flashcore::arch_class(10, 0, 227 * 1024) == ArchClass::Sm80 &&
             flashcore::arch_class(12, 0, 99 * 1024) == ArchClass::Sm86Sm89 &&
             flashcore::arch_class(13, 0, 163 * 1024) == ArchClass::Sm80 &&
             !flashcore::arch_class(12, 0, 64 * 1024) && !flashcore::arch_class(7, 5, 227 * 1024),
         "the classes of compute capability 10.0 and later follow their shared memory");
  flashcore::core::DeviceCaps b200{10, 0, 227 * 1024, ~0u, 148};
  Request big = r;
  big.q = big.k = big.v = bshd(4, 1024, 16, 64);
  big.out = bshd(4, 1024, 16, 64);
  Problem big_p{};
  s = flashcore::core::validate(big, &big_p);
  s = s.ok() ? flashcore::core::plan(big, big_p, b200, &plan) : s;
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.row->arch == ArchClass::Sm80,
         "a B200 runs WMMA's sm_80 row where an H200 runs the Hopper kernel: " + s.message);
  big.options.backend = flashcore::Backend::CutlassSm90;
  expect(flashcore::core::plan(big, big_p, b200, &plan).code == Code::BackendUnavailable,
         "the Hopper kernel forced on a B200 is refused");
  // No queries, in BHSD (the head stride of a Q of no tokens is 0): nothing to launch, so the
  // Hopper kernel's TMA strides are not checked.
  Request empty = big;
  empty.q = bshd(4, 0, 16, 64);
  empty.out = bshd(4, 0, 16, 64);
  flashcore::bhsd_strides(empty.q.shape, empty.q.stride);  // heads 0 elements apart
  flashcore::bhsd_strides(empty.out.shape, empty.out.stride);
  Problem empty_p{};
  s = flashcore::core::validate(empty, &empty_p);
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  s = s.ok() ? flashcore::core::plan(empty, empty_p, h200, &plan) : s;
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "an empty problem forced on the Hopper kernel plans: " + s.message);
  r.options.causal = Causal::BottomRight;
  r.q = bshd(2, 200, 8, 64);
  r.out = bshd(2, 200, 8, 64);  // 70 rows would see no key
  expect_code(r, Code::NoVisibleKeys, Operand::None, "bottom-right with seq_q > seq_k");
}

// The Hopper family: compute capability 9.0 only, only when compiled, and its 32-bit work count.
void planning_sm90() {
  using flashcore::Backend;
  using flashcore::core::DeviceCaps;
  Request r = valid();
  r.options.backend = Backend::CutlassSm90;
  Problem p{};
  expect(flashcore::core::validate(r, &p).ok(), "valid for planning");
  flashcore::core::Plan plan{};
  const DeviceCaps h200{9, 0, 227 * 1024};
  Status s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.row->tile.queries_per_block == 192,
         "an H200 runs the sm90 d=64 row (three warpgroups): " + s.message);
  // Auto on an H200 (132 SMs): WMMA for 16 work units, the Hopper kernel for 512.
  Request autos = r;
  autos.options.backend = Backend::Auto;
  const DeviceCaps h200_sms{9, 0, 227 * 1024, ~0u, 132};
  expect(flashcore::core::plan(autos, p, h200_sms, &plan).ok() && plan.kernel == Kernel::Wmma,
         "Auto on a small problem on an H200 runs WMMA");
  autos.q = autos.k = autos.v = bshd(4, 1024, 16, 64);
  autos.out = bshd(4, 1024, 16, 64);
  Problem big_p{};
  expect(flashcore::core::validate(autos, &big_p).ok(), "a 4x16x1024 problem validates");
  expect(flashcore::core::plan(autos, big_p, h200_sms, &plan).ok() &&
             plan.kernel == Kernel::CutlassSm90,
         "Auto on a filled H200 runs the Hopper kernel");
  // A variable-length prefill takes the dense rule by its longest sequence: 2 sequences of 300
  // queries on 600 keys, 8 heads, 48 units: at d = 64 2^29.5 flops (WMMA), at d = 128 2^30.5
  // (the Hopper kernel).
  {
    const int32_t cu_q[] = {0, 300, 600}, cu_k[] = {0, 600, 1200};
    for (const int64_t d : {64, 128}) {
      Request batch = autos;
      batch.q = bshd(1, 600, 8, d);
      batch.out = bshd(1, 600, 8, d);
      batch.k = batch.v = bshd(1, 1200, 2, d);
      batch.varlen = true;
      batch.cu_q = {0x20000, 0, 2, cu_q, 300};
      batch.cu_k = {0x30000, 0, 2, cu_k, 600};
      Problem batch_p{};
      const Kernel want = d == 64 ? Kernel::Wmma : Kernel::CutlassSm90;
      s = flashcore::core::validate(batch, &batch_p);
      expect(s.ok() && flashcore::core::plan(batch, batch_p, h200_sms, &plan).ok() &&
                 plan.kernel == want,
             "Auto on a small variable-length prefill at d = " + std::to_string(d) + ": " +
                 s.message);
    }
  }
  // Under Auto, what only the Hopper kernel cannot run falls back to WMMA: a broadcast K, or the
  // sm_90 rows forced on another GPU.
  Request broadcast_auto = autos;
  broadcast_auto.k.stride[0] = 0;
  expect(flashcore::core::plan(broadcast_auto, big_p, h200_sms, &plan).ok() &&
             plan.kernel == Kernel::Wmma,
         "Auto with a stride-0 K on a filled H200 runs WMMA");
  Request forced_class = autos;
  forced_class.options.force_arch_class = flashcore::ArchClass::Sm90;
  const DeviceCaps a100{8, 0, 163 * 1024, ~0u, 108};
  expect(flashcore::core::plan(forced_class, big_p, a100, &plan).ok() && plan.kernel == Kernel::Wmma,
         "Auto with the sm_90 rows forced on an A100 runs WMMA");
  forced_class.options.backend = Backend::CutlassSm90;
  s = flashcore::core::plan(forced_class, big_p, a100, &plan);
  expect(s.code == Code::BackendUnavailable && s.message.find("sm_90a") != std::string::npos,
         "the Hopper kernel forced on an A100, even with its class forced: " + s.message);
  const DeviceCaps l4{8, 9, 99 * 1024};
  s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.code == Code::BackendUnavailable && s.values[0] == int64_t(Kernel::CutlassSm90),
         "an L4 cannot run the sm90 kernel: " + s.message);
  r.options.force_arch_class = flashcore::ArchClass::Sm86Sm89;
  expect(flashcore::core::plan(r, p, h200, &plan).code == Code::BackendUnavailable,
         "the sm90 kernel has no sm_89 rows to force");
  r.options.force_arch_class.reset();
  DeviceCaps without = h200;
  without.kernels = ~(1u << int(Kernel::CutlassSm90));
  s = flashcore::core::plan(r, p, without, &plan);
  expect(s.code == Code::BackendUnavailable && s.message.find("did not compile") != std::string::npos,
         "a build without sm_90 refuses the sm90 kernel: " + s.message);
  expect(flashcore::kernel_of(Backend::Auto) == std::nullopt &&
             flashcore::kernel_of(Backend::CutlassSm90) == Kernel::CutlassSm90 &&
             flashcore::kernel_of(Backend::Wmma) == Kernel::Wmma,
         "Backend = Kernel + 1");
  // A broadcast K (stride 0 over batch) cannot be described to TMA: refused before any launch.
  Request broadcast = r;
  broadcast.k.stride[0] = 0;
  expect(flashcore::core::validate(broadcast, &p).ok(), "a broadcast K validates");
  s = flashcore::core::plan(broadcast, p, h200, &plan);
  expect(s.code == Code::BackendUnavailable && s.operand == Operand::K,
         "the sm90 kernel refuses a stride-0 K: " + s.message);
  broadcast.options.backend = Backend::Wmma;
  expect(flashcore::core::plan(broadcast, p, h200, &plan).ok(), "WMMA takes a stride-0 K");
  // 2^16 heads x 2^15 batches x 2 query blocks: more work units than an int counts (Q with
  // stride 0 describes it without memory; the output, which may not overlap itself, is dense
  // far above the other operands).
  Request big;
  big.options.backend = Backend::CutlassSm90;
  big.q = bshd(32768, 129, 65535, 64);
  big.q.stride[0] = big.q.stride[1] = big.q.stride[2] = 0;
  big.out = bshd(32768, 129, 65535, 64, uint64_t{1} << 56);
  big.k = big.v = bshd(32768, 1, 1, 64);
  expect(flashcore::core::validate(big, &p).ok(), "the big problem validates");
  s = flashcore::core::plan(big, p, h200, &plan);
  expect(s.code == Code::IndexOverflow && s.field == Field::WorkUnits,
         "too many sm90 work units: " + s.message);
}

}  // namespace

// merge_states' validation: the count, each state's own error naming its position, the
// addresses only C++ callers can give.
void merging() {
  using flashcore::core::MergeProblem;
  using flashcore::core::MergeRequest;
  // A dense BHSD logsumexp [b, s, h, 1] of floats on device 0.
  auto lse = [](int64_t b, int64_t s, int64_t h, uint64_t address) {
    TensorDesc t = bshd(b, s, h, 1, address);
    flashcore::bhsd_strides(t.shape, t.stride);
    t.element_bytes = 4;
    return t;
  };
  TensorDesc outs[3] = {bshd(2, 5, 4, 64, 0x10000), bshd(2, 5, 4, 64, 0x20000),
                        bshd(2, 5, 4, 64, 0x30000)};
  TensorDesc lses[3] = {lse(2, 5, 4, 0x40000), lse(2, 5, 4, 0x50000), lse(2, 5, 4, 0x60000)};
  MergeRequest r;
  r.outs = outs;
  r.lses = lses;
  r.count = 3;
  r.out = bshd(2, 5, 4, 64, 0x70000);
  r.lse = lse(2, 5, 4, 0x80000);
  r.has_lse = true;
  auto run = [](const MergeRequest& m) {
    MergeProblem p{};
    Status s = flashcore::core::validate_merge(m, &p);
    return std::make_pair(s, p);
  };
  auto [ok, p] = run(r);
  expect(ok.ok() && p.batch == 2 && p.seq == 5 && p.heads == 4 && p.head_dim == 64 &&
             p.count == 3 && p.location == 0,
         "a valid merge passes: " + ok.message);

  for (int64_t count : {int64_t{0}, int64_t{-1}, flashcore::kMaxMergeStates + 1}) {
    MergeRequest bad = r;
    bad.count = count;
    const Status s = run(bad).first;
    expect(s.code == Code::StateCount && s.values[0] == count && s.values[1] == 1 &&
               s.values[2] == flashcore::kMaxMergeStates,
           "state count " + std::to_string(count) + ": " + s.message);
  }
  // Each state's error names it: operand State / StateLse, position in values[2].
  {
    TensorDesc o[3] = {outs[0], outs[1], outs[2]};
    o[2].location = 1;
    MergeRequest bad = r;
    bad.outs = o;
    const Status s = run(bad).first;
    expect(s.code == Code::DeviceMismatch && s.operand == Operand::State && s.values[2] == 2 &&
               s.message.find("states[2].out") != std::string::npos,
           "a state on another device: " + s.message);
  }
  {
    TensorDesc l[3] = {lses[0], lses[1], lses[2]};
    l[1].stride[2] = 1;  // BSHD-ordered logsumexp
    l[1].stride[1] = 4;
    MergeRequest bad = r;
    bad.lses = l;
    const Status s = run(bad).first;
    expect(s.code == Code::LseLayout && s.operand == Operand::StateLse && s.values[2] == 1,
           "a state's BSHD logsumexp: " + s.message);
  }
  {
    TensorDesc l[3] = {lses[0], lses[1], lses[2]};
    l[0].address = 0x40002;  // not a float address
    MergeRequest bad = r;
    bad.lses = l;
    const Status s = run(bad).first;
    expect(s.code == Code::MisalignedPointer && s.operand == Operand::StateLse &&
               s.values[1] == 4 && s.values[2] == 0,
           "a misaligned state logsumexp: " + s.message);
  }
  {
    TensorDesc o[3] = {outs[0], outs[1], outs[2]};
    o[1].stride[0] = -8;
    MergeRequest bad = r;
    bad.outs = o;
    const Status s = run(bad).first;
    expect(s.code == Code::SizeOverflow && s.operand == Operand::State && s.values[2] == 1,
           "a negative state stride: " + s.message);
  }
  {
    MergeRequest in_place = r;
    in_place.out = outs[1];
    in_place.lse = lses[1];
    expect(run(in_place).first.ok(), "merging in place into state 1");
    MergeRequest bad = r;
    bad.out.address = outs[1].address + 128;  // over part of state 1
    Status s = run(bad).first;
    expect(s.code == Code::OverlappingOutput && s.operand == Operand::Out &&
               s.values[0] == int64_t(Operand::State) && s.values[1] == 1,
           "an output over part of state 1: " + s.message);
    bad = r;
    bad.lse.address = lses[2].address + 4;
    s = run(bad).first;
    expect(s.code == Code::OverlappingOutput && s.operand == Operand::Lse &&
               s.values[0] == int64_t(Operand::StateLse) && s.values[1] == 2,
           "a logsumexp over part of state 2's: " + s.message);
    bad = r;
    bad.out.stride[1] = 0;
    s = run(bad).first;
    expect(s.code == Code::OverlappingOutput && s.values[0] == 0, "a self-overlapping output");
  }
  {
    MergeRequest bad = r;
    bad.out.address = 0x70008;
    const Status s = run(bad).first;
    expect(s.code == Code::MisalignedPointer && s.operand == Operand::Out && s.values[1] == 16,
           "a misaligned output: " + s.message);
  }
  {
    MergeRequest bad = r;
    bad.lse.shape[1] = 6;
    const Status s = run(bad).first;
    expect(s.code == Code::ShapeMismatch && s.operand == Operand::Lse,
           "a logsumexp of another length: " + s.message);
  }
}

// A variable-length batch of three sequences (query lengths 5, 0, 7; key lengths 9, 4, 7) packed
// into batch-1 tensors, offsets on device 0 with host copies of `q_host` / `k_host`.
Request varlen(const int32_t* q_host, const int32_t* k_host) {
  Request r;
  r.q = bshd(1, 12, 8, 64);
  r.out = bshd(1, 12, 8, 64);
  r.k = r.v = bshd(1, 20, 2, 64);
  r.varlen = true;
  r.cu_q = {0x20000, 0, 3, q_host, 7};
  r.cu_k = {0x30000, 0, 3, k_host, 9};
  return r;
}

void variable_lengths() {
  const int32_t q[] = {0, 5, 5, 12}, k[] = {0, 9, 13, 20};
  Problem p{};
  Status s = flashcore::core::validate(varlen(q, k), &p);
  expect(s.ok() && p.varlen && p.batch == 3 && p.seq_q == 7 && p.seq_k == 9 && !p.packs_heads(),
         "a valid variable-length batch: " + s.message);
  expect(flashcore::core::validate(varlen(nullptr, nullptr), &p).ok(),
         "without host copies only placement is checked");

  const int32_t first[] = {1, 5, 5, 12}, order[] = {0, 5, 4, 12}, last[] = {0, 5, 5, 11},
                longer[] = {0, 1, 1, 12};
  const std::pair<const int32_t*, Field> bad_q[] = {{first, Field::FirstOffset},
                                                    {order, Field::OffsetOrder},
                                                    {last, Field::LastOffset},
                                                    {longer, Field::MaxSeqLen}};
  for (const auto& [host, field] : bad_q) {
    s = check(varlen(host, k));
    expect(s.code == Code::InvalidOffsets && s.operand == Operand::CuSeqlensQ && s.field == field,
           std::string("offsets breaking ") + flashcore::name(field) + ": " + s.message);
  }
  s = check(varlen(order, k));
  expect(s.values[0] == 2 && s.values[1] == 4 && s.values[2] == 5,
         "the decreasing entry is named: " + s.message);
  s = check(varlen(q, last));  // k's last entry is not k's token count (20)
  expect(s.code == Code::InvalidOffsets && s.operand == Operand::CuSeqlensK &&
             s.field == Field::LastOffset && s.values[2] == 20,
         "k offsets short of the key tokens: " + s.message);

  Request r = varlen(q, k);
  r.cu_q.max_len = 13;
  s = check(r);
  expect(s.code == Code::InvalidOffsets && s.field == Field::MaxSeqLen && s.values[0] == -1,
         "max_seqlen above the token count: " + s.message);
  r = varlen(nullptr, nullptr);
  r.cu_k.location = kHost;
  expect_code(r, Code::DeviceMismatch, Operand::CuSeqlensK, "key offsets on the host");
  r = varlen(nullptr, nullptr);
  r.cu_q.address = 0x20002;
  expect_code(r, Code::MisalignedPointer, Operand::CuSeqlensQ, "offsets not 4-byte aligned");
  r = varlen(nullptr, nullptr);
  r.cu_k.count = 2;
  expect_code(r, Code::ShapeMismatch, Operand::CuSeqlensK, "two offset arrays of other counts");
  r = varlen(q, k);
  r.q.shape[0] = r.out.shape[0] = 2;
  expect_code(r, Code::ShapeMismatch, Operand::Q, "packed tensors have batch 1");

  // Each sequence has its own causal alignment: bottom-right with 7 queries on 7 keys is fine,
  // 5 queries on 4 keys is not (the second sequence here).
  const int32_t q2[] = {0, 5, 10, 12}, k2[] = {0, 9, 13, 20};
  r = varlen(q2, k2);
  r.cu_q.max_len = 5;
  r.options.causal = Causal::BottomRight;
  s = check(r);
  expect(s.code == Code::NoVisibleKeys && s.values[0] == 1 && s.values[1] == 5 &&
             s.values[2] == 4 && s.message.find("sequence 1") != std::string::npos,
         "a sequence with more queries than keys, bottom-right: " + s.message);
  r.options.causal = Causal::TopLeft;
  expect(check(r).ok(), "the same batch top-left");
  const int32_t no_keys[] = {0, 9, 9, 20};
  r = varlen(q2, no_keys);  // sequence 1: 5 queries, no key
  r.cu_k.max_len = 11;
  expect_code(r, Code::NoVisibleKeys, Operand::None, "queries of a sequence without keys");
  const int32_t empty_q[] = {0, 5, 5, 12}, keys[] = {0, 9, 9, 20};
  r = varlen(empty_q, keys);  // the sequence without keys has no queries either: fine
  r.cu_k.max_len = 11;
  expect(check(r).ok(), "a sequence without queries or keys");

  // Planning: Auto runs a small batch on WMMA; the Hopper kernel runs it where forced on
  // compute capability 9.0; example 41 runs it where forced.
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  const flashcore::core::DeviceCaps l4{8, 9, 99 * 1024, ~0u, 58};
  r = varlen(q, k);
  flashcore::core::validate(r, &p);
  flashcore::core::Plan plan{};
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == 1,
         "Auto plans the Hopper kernel for a small variable-length batch of at most 32 queries "
         "per sequence on an H200 (the decode rule)");
  s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.splits == 1,
         "Auto plans WMMA for a small variable-length batch off Hopper");
  r.options.backend = flashcore::Backend::CutlassSm90;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == 1,
         "the Hopper kernel forced on a variable-length batch: " + s.message);
  s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.code == Code::BackendUnavailable && s.message.find("sm_90a") != std::string::npos,
         "the Hopper kernel forced on a variable-length batch off Hopper: " + s.message);
  r.options.backend = flashcore::Backend::CutlassSm80;
  for (const auto& caps : {h200, l4}) {
    s = flashcore::core::plan(r, p, caps, &plan);
    expect(s.ok() && plan.kernel == Kernel::CutlassSm80 && plan.splits == 1,
           "example 41 forced on a variable-length batch: " + s.message);
  }
  r.options.softcap = 30.0f;
  s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.code == Code::BackendUnavailable && s.values[0] == int(Kernel::CutlassSm80) &&
             s.message.find("softcap") != std::string::npos,
         "example 41 forced on a variable-length batch with a softcap: " + s.message);
  r.options.softcap.reset();
  // A batch whose longest sequence's 128-row blocks fill the SMs (16 x 3 sequences x 8 heads):
  // Auto runs the Hopper kernel on compute capability 9.0 and WMMA elsewhere.
  r = varlen(nullptr, nullptr);
  r.q = bshd(1, 4096, 8, 64);
  r.out = bshd(1, 4096, 8, 64);
  r.k = r.v = bshd(1, 4096, 2, 64);
  r.cu_q.max_len = r.cu_k.max_len = 2048;
  s = flashcore::core::validate(r, &p);
  expect(s.ok(), "a long variable-length batch without host copies: " + s.message);
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "Auto plans the Hopper kernel for a long variable-length batch: " + s.message);
  s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto plans WMMA for a long variable-length batch off Hopper: " + s.message);
  // A decode step of three sequences (one query each, the longest 32k keys, 8 query heads on 2
  // kv heads). Packed BSHD tensors: each sequence's 4 query heads of a kv head are the rows of
  // one unit (token_rows 8: a token is 8 head strides), 6 units, split by the longest
  // sequence's keys on the Hopper kernel under Auto and on WMMA forced.
  r = varlen(nullptr, nullptr);
  r.q = bshd(1, 3, 8, 128);
  r.out = bshd(1, 3, 8, 128);
  r.k = r.v = bshd(1, 40000, 2, 128);
  r.cu_q.max_len = 1;
  r.cu_k.max_len = 32768;
  s = flashcore::core::validate(r, &p);
  expect(s.ok() && p.packs_heads() && p.token_rows == 8 && p.query_rows() == 4 &&
             p.batch_heads() == 6,
         "a variable-length decode batch packs its heads: " + s.message);
  const flashcore::TileRow* hopper_row = nullptr;
  const flashcore::TileRow* wmma_row = nullptr;
  expect(flashcore::core::choose_row(Kernel::CutlassSm90, 128, 4, h200, {}, &hopper_row).ok() &&
             flashcore::core::choose_row(Kernel::Wmma, 128, 4, h200, {}, &wmma_row).ok(),
         "the decode rows at d = 128");
  const int32_t hopper_splits = flashcore::kv_splits(Kernel::CutlassSm90, *hopper_row, 4, 6,
                                                     32768, 132);
  const int32_t wmma_splits = flashcore::kv_splits(Kernel::Wmma, *wmma_row, 4, 6, 32768, 132);
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == hopper_splits &&
             hopper_splits > 5,
         "Auto splits a packed variable-length decode batch on the Hopper kernel: " +
             std::to_string(plan.splits));
  r.options.backend = flashcore::Backend::Wmma;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.splits == wmma_splits && wmma_splits > 11,
         "WMMA splits a packed variable-length decode batch: " + std::to_string(plan.splits));
  // Unpacked: a top-left mask (the one query sees key 0 only), or a token stride that is no
  // whole number of head strides (8 x 128 + 64 elements): 24 (sequence, query head) units,
  // 132 / 24 = 5 splits on the Hopper kernel, 264 / 24 = 11 on WMMA (two decode blocks per SM).
  r.options.backend = flashcore::Backend::Auto;
  r.options.causal = Causal::TopLeft;
  s = flashcore::core::validate(r, &p);
  expect(s.ok() && !p.packs_heads() && p.batch_heads() == 24,
         "a top-left variable-length decode batch does not pack: " + s.message);
  r.options.causal = Causal::None;
  r.q.stride[1] = r.out.stride[1] = 8 * 128 + 64;
  s = flashcore::core::validate(r, &p);
  expect(s.ok() && !p.packs_heads() && p.token_rows == 0 && p.batch_heads() == 24,
         "a variable-length batch with padded tokens does not pack: " + s.message);
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == 5,
         "Auto splits an unpacked variable-length decode batch on the Hopper kernel: " +
             std::to_string(plan.splits));
  r.options.backend = flashcore::Backend::Wmma;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.splits == 11,
         "WMMA splits an unpacked variable-length decode batch: " + std::to_string(plan.splits));
  // 64 such sequences: 512 unpacked units, more than two per SM: CUTLASS's decode row, as for
  // a dense decode batch, one split. Packed, 128 units: the Hopper kernel, as for a dense decode
  // batch of 128 units; past two units per SM (an L4's 58 SMs) packed heads stay on WMMA.
  r.options.backend = flashcore::Backend::Auto;
  r.q.shape[1] = r.out.shape[1] = 64;
  r.cu_q.count = r.cu_k.count = 64;
  s = flashcore::core::validate(r, &p);
  if (s.ok()) {
    s = flashcore::core::plan(r, p, h200, &plan);
  }
  expect(s.ok() && plan.kernel == Kernel::CutlassSm80 && plan.splits == 1 &&
             plan.row->tile.queries_per_block == 32,
         "Auto runs a wide unpacked variable-length decode batch on CUTLASS's decode row: " +
             s.message);
  r.options.softcap = 30.0f;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto runs it on WMMA with a softcap, which example 41 does not apply: " + s.message);
  r.options.softcap.reset();
  r.q = bshd(1, 64, 8, 128);
  r.out = bshd(1, 64, 8, 128);
  s = flashcore::core::validate(r, &p);
  if (s.ok()) {
    s = flashcore::core::plan(r, p, h200, &plan);
  }
  expect(s.ok() && p.batch_heads() == 128 && plan.kernel == Kernel::CutlassSm90,
         "Auto runs a packed variable-length decode batch of 128 units on the Hopper kernel: " +
             s.message);
  s = flashcore::core::plan(r, p, l4, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto runs it on WMMA on an L4 (packed heads): " + s.message);
  const flashcore::core::DeviceCaps few_sms{9, 0, 227 * 1024, ~0u, 60};
  s = flashcore::core::plan(r, p, few_sms, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == 1,
         "Auto runs packed heads past two units per SM on the Hopper kernel: " + s.message);
  r.q.shape[1] = r.out.shape[1] = 14;
  r.cu_q.count = r.cu_k.count = 14;
  s = flashcore::core::validate(r, &p);
  if (s.ok()) {
    s = flashcore::core::plan(r, p, l4, &plan);
  }
  expect(s.ok() && p.batch_heads() == 28 && plan.kernel == Kernel::Wmma,
         "Auto runs 14 packed sequences on WMMA on an L4: " + s.message);
}

// Per-sequence key splits (core/splits.h): a decode batch whose key counts the host knows
// splits each sequence by its own keys, the shortest splits whose units fit one wave.
void sequence_key_splits() {
  using flashcore::core::sequence_splits;
  using flashcore::core::SequenceSplits;
  const flashcore::TileRow* h128 =
      flashcore::select_row(Kernel::CutlassSm90, flashcore::ArchClass::Sm90, 128, 4);
  const flashcore::TileRow* w128 =
      flashcore::select_row(Kernel::Wmma, flashcore::ArchClass::Sm90, 128, 4);
  expect(h128 != nullptr && h128->tile.keys_per_block == 128 && w128 != nullptr,
         "the d = 128 decode rows");
  // 32k, 4k, 1000 and 300 keys on 8 kv heads (4 packed rows each), 132 SMs: splits of 2816
  // keys (22 tiles) give 12 + 2 + 1 + 1 splits, 128 units; 2688 would give 13 + 2 + 1 + 1, 136.
  const std::vector<int64_t> mixed = {32768, 4096, 1000, 300};
  SequenceSplits s = sequence_splits(Kernel::CutlassSm90, *h128, 4, 8, mixed, 132);
  expect(s.keys == 2816 && s.slots == 12 &&
             s.first == std::vector<uint16_t>({0, 12, 14, 15, 16}),
         "Hopper: a mixed batch splits by each sequence's keys: " + std::to_string(s.keys));
  // One sequence: the dense rule's 16 splits of 2048 keys.
  s = sequence_splits(Kernel::CutlassSm90, *h128, 4, 8, {32768}, 132);
  expect(s.keys == 2048 && s.slots == 16 && s.first == std::vector<uint16_t>({0, 16}),
         "Hopper: 1 x 32k keys: 16 splits");
  // WMMA: two decode blocks per SM (264), whole 32-key tiles; the shortest splits that fit.
  const int64_t tile = w128->tile.keys_per_block;
  s = sequence_splits(Kernel::Wmma, *w128, 4, 8, mixed, 132);
  auto units = [&](int64_t keys) {
    int64_t n = 0;
    for (int64_t k : mixed) {
      n += std::max<int64_t>(1, (k + keys - 1) / keys);
    }
    return 8 * n;
  };
  expect(s.keys > 0 && s.keys % tile == 0 && s.keys >= flashcore::kMinKeysPerSplit &&
             units(s.keys) <= 264 && units(s.keys - tile) > 264 &&
             s.slots == (32768 + s.keys - 1) / s.keys && s.first.size() == 5 &&
             s.first.back() * 8 == units(s.keys),
         "WMMA: the shortest splits whose units fit two blocks per SM: " +
             std::to_string(s.keys));
  // Sequences without keys (a sequence with no queries) still count one unit; so does a
  // negative count (a host copy the validator refused elsewhere is never planned, but the rule
  // stays total).
  s = sequence_splits(Kernel::CutlassSm90, *h128, 4, 8, {32768, 0, -5}, 132);
  expect(s.keys > 0 && s.first[2] - s.first[1] == 1 && s.first[3] - s.first[2] == 1,
         "a sequence without keys: one unit");
  // No split: units that (nearly) fill the SMs, prefill, example 41, too many sequences, short
  // sequences, no sequences.
  expect(sequence_splits(Kernel::CutlassSm90, *h128, 4, 8, std::vector<int64_t>(16, 8192), 132)
                 .keys == 0,
         "16 x 8k: no split");
  expect(sequence_splits(Kernel::CutlassSm90, *h128, 64, 8, mixed, 132).keys == 0, "prefill");
  expect(sequence_splits(Kernel::CutlassSm80, *h128, 4, 8, mixed, 132).keys == 0, "example 41");
  expect(sequence_splits(Kernel::Wmma, *w128, 4, 1,
                         std::vector<int64_t>(flashcore::kMaxSplitSequences + 1, 100000), 132)
                 .keys == 0,
         "more sequences than the kernels' table");
  expect(sequence_splits(Kernel::CutlassSm90, *h128, 4, 8, {600, 300}, 132).keys == 0,
         "no sequence long enough for two splits");
  expect(sequence_splits(Kernel::CutlassSm90, *h128, 4, 8, {}, 132).keys == 0, "no sequences");
  // At most kMaxKvSplits splits of the longest.
  s = sequence_splits(Kernel::Wmma, *w128, 4, 1, {int64_t{1} << 30}, 132);
  expect(s.slots == flashcore::kMaxKvSplits, "at most 64 splits");

  // The plan: a variable-length decode batch with host copies carries the per-sequence splits;
  // without them it splits by the longest.
  const int32_t q[] = {0, 1, 2, 3, 4}, k[] = {0, 32768, 36864, 37864, 38164};
  Request r;
  r.q = bshd(1, 4, 32, 128);
  r.out = bshd(1, 4, 32, 128);
  r.k = r.v = bshd(1, 38164, 8, 128);
  r.varlen = true;
  r.cu_q = {0x20000, 0, 4, q, 1};
  r.cu_k = {0x30000, 0, 4, k, 32768};
  Problem p{};
  flashcore::core::Plan plan{Kernel::CutlassSm80, nullptr};
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  Status st = flashcore::core::validate(r, &p);
  expect(st.ok() && p.packs_heads(), "a packed mixed decode batch: " + st.message);
  st = flashcore::core::plan(r, p, h200, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm90 && plan.split_keys == 2816 &&
             plan.splits == 12 && plan.split_first == std::vector<uint16_t>({0, 12, 14, 15, 16}),
         "the plan splits each sequence by its keys: " + st.message);
  r.cu_q.host = r.cu_k.host = nullptr;
  st = flashcore::core::plan(r, p, h200, &plan);
  expect(st.ok() && plan.split_keys == 0 && plan.split_first.empty() && plan.splits == 4,
         "without host copies, by the longest: " + std::to_string(plan.splits));
  expect(plan.sequence_order.empty(), "a split batch keeps its order");
}

// The Hopper kernel's walk over a wide decode batch of unequal sequences (core/splits.h
// sequence_order): longest first, where the host knows the key counts and the unsplit units
// outnumber the SMs.
void sequence_walk_order() {
  using flashcore::core::sequence_order;
  const std::vector<int64_t> keys = {300, 4096, 1000, 4096, 0, 2048};
  const uint16_t longest_first[] = {1, 3, 5, 2, 0, 4}, batch_order[] = {0, 1, 2, 3, 4, 5};
  std::vector<uint16_t> order = sequence_order(Kernel::CutlassSm90, 4, 1, 48, 6, keys, 32);
  expect(order.size() == 6 && std::equal(order.begin(), order.end(), longest_first),
         "longest first, ties in batch order");
  order = sequence_order(Kernel::CutlassSm90, 4, 1, 48, 6, {}, 32);
  expect(order.size() == 6 && std::equal(order.begin(), order.end(), batch_order),
         "without key counts, batch order");
  expect(sequence_order(Kernel::CutlassSm90, 4, 1, 32, 6, keys, 32).empty(), "one wave");
  expect(sequence_order(Kernel::CutlassSm90, 4, 2, 96, 6, keys, 32).empty(), "split keys");
  expect(sequence_order(Kernel::Wmma, 4, 1, 48, 6, keys, 32).empty(), "WMMA");
  expect(sequence_order(Kernel::CutlassSm90, 64, 1, 48, 6, keys, 32).empty(), "prefill");
  expect(sequence_order(Kernel::CutlassSm90, 4, 1, 2570, 257, std::vector<int64_t>(257, 9), 32)
             .empty(),
         "more sequences than the table holds");

  // The plan: 40 one-query sequences of unequal lengths, GQA 32:8 packed (320 units) on 132
  // SMs: the Hopper kernel, no split, longest first; without host copies, batch order.
  int32_t q[41], k[41];
  for (int32_t b = 0; b <= 40; ++b) {
    q[b] = b;
    k[b] = b * 1000 + (b > 0 ? (b * 37) % 700 : 0);
  }
  Request r;
  r.q = bshd(1, 40, 32, 128);
  r.out = bshd(1, 40, 32, 128);
  r.k = r.v = bshd(1, k[40], 8, 128);
  r.varlen = true;
  r.cu_q = {0x20000, 0, 40, q, 1};
  int32_t longest = 0;
  for (int b = 0; b < 40; ++b) {
    longest = std::max(longest, k[b + 1] - k[b]);
  }
  r.cu_k = {0x30000, 0, 40, k, longest};
  Problem p{};
  flashcore::core::Plan plan{};
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  Status st = flashcore::core::validate(r, &p);
  if (st.ok()) {
    st = flashcore::core::plan(r, p, h200, &plan);
  }
  bool descending = plan.sequence_order.size() == 40;
  for (size_t i = 1; descending && i < 40; ++i) {
    const int a = plan.sequence_order[i - 1], b = plan.sequence_order[i];
    descending = k[a + 1] - k[a] >= k[b + 1] - k[b];
  }
  expect(st.ok() && p.batch_heads() == 320 && plan.kernel == Kernel::CutlassSm90 &&
             plan.splits == 1 && descending,
         "a wide packed decode batch walks longest first on the Hopper kernel: " + st.message);
  const flashcore::core::DeviceCaps l4{8, 9, 99 * 1024, ~0u, 58};
  st = flashcore::core::plan(r, p, l4, &plan);
  expect(st.ok() && plan.kernel == Kernel::Wmma && plan.sequence_order.empty(),
         "packed on an L4: WMMA, batch order: " + st.message);
  r.cu_q.host = r.cu_k.host = nullptr;
  st = flashcore::core::plan(r, p, h200, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm90 && plan.sequence_order.size() == 40 &&
             plan.sequence_order[39] == 39,
         "without host copies, batch order: " + st.message);
  // Unpacked (a token stride of 32 heads and a half): 1280 (sequence, query head) units. With
  // the host copies the Hopper kernel walks them longest first; without them, or off Hopper,
  // example 41's decode row.
  r.q.stride[1] = r.out.stride[1] = 32 * 128 + 64;
  r.q.stride[0] = r.out.stride[0] = 40 * r.q.stride[1];
  r.cu_q.host = q;
  r.cu_k.host = k;
  st = flashcore::core::validate(r, &p);
  if (st.ok()) {
    st = flashcore::core::plan(r, p, h200, &plan);
  }
  expect(st.ok() && !p.packs_heads() && plan.kernel == Kernel::CutlassSm90 &&
             plan.sequence_order.size() == 40,
         "unpacked with host copies: the Hopper kernel, longest first: " + st.message);
  st = flashcore::core::plan(r, p, l4, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm80, "unpacked on an L4: " + st.message);
  r.cu_q.host = r.cu_k.host = nullptr;
  st = flashcore::core::plan(r, p, h200, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm80,
         "unpacked without host copies: example 41: " + st.message);

  // A dense decode batch of 64 sequences (512 packed units) on the Hopper kernel: batch order,
  // a sequence's heads side by side.
  Request dense;
  dense.q = bshd(64, 1, 32, 128);
  dense.out = bshd(64, 1, 32, 128);
  dense.k = dense.v = bshd(64, 2048, 8, 128);
  dense.options.backend = flashcore::Backend::CutlassSm90;
  st = flashcore::core::validate(dense, &p);
  if (st.ok()) {
    st = flashcore::core::plan(dense, p, h200, &plan);
  }
  expect(st.ok() && plan.splits == 1 && plan.sequence_order.size() == 64 &&
             plan.sequence_order[63] == 63,
         "a wide dense decode walks in batch order: " + st.message);
  // Auto: the Hopper kernel where its blocks walk the batch (at most kMaxSplitSequences
  // sequences) on an H200; example 41 past that, on an L4 and without the Hopper kernels.
  dense.options.backend = flashcore::Backend::Auto;
  st = flashcore::core::plan(dense, p, h200, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm90 && plan.sequence_order.size() == 64,
         "Auto walks a wide dense decode on the Hopper kernel: " + st.message);
  st = flashcore::core::plan(dense, p, l4, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm80, "a wide dense decode on an L4");
  flashcore::core::DeviceCaps no_sm90 = h200;
  no_sm90.kernels &= ~(1u << uint32_t(Kernel::CutlassSm90));
  st = flashcore::core::plan(dense, p, no_sm90, &plan);
  expect(st.ok() && plan.kernel == Kernel::CutlassSm80, "a wide dense decode without sm_90");
  dense.q = bshd(flashcore::kMaxSplitSequences + 1, 1, 32, 128);
  dense.out = bshd(flashcore::kMaxSplitSequences + 1, 1, 32, 128);
  dense.k = dense.v = bshd(flashcore::kMaxSplitSequences + 1, 512, 8, 128);
  st = flashcore::core::validate(dense, &p);
  if (st.ok()) {
    st = flashcore::core::plan(dense, p, h200, &plan);
  }
  expect(st.ok() && plan.kernel == Kernel::CutlassSm80 && plan.sequence_order.empty(),
         "a dense decode too wide to walk: example 41: " + st.message);
}

// Split-KV decoding: which problems split their keys, into how many blocks, and that the plan
// carries the count (WMMA, dense) and never for a variable-length batch.
void key_splits() {
  using flashcore::kv_splits;
  using flashcore::wmma_blocks_per_sm;
  // The sm_90 decode row at d = 128: 16 x 32 keys, 39,168 bytes: 5 blocks per SM by shared
  // memory (228 KB), 8 by registers (one warp).
  const flashcore::TileRow* row =
      flashcore::select_row(Kernel::Wmma, flashcore::ArchClass::Sm90, 128, 4);
  expect(row != nullptr && row->tile.queries_per_block == 16 && row->smem_bytes == 39168,
         "WMMA's sm_90 decode row at d = 128");
  expect(wmma_blocks_per_sm(*row) == 5, "5 decode blocks per SM");
  const flashcore::TileRow& r128 = *row;
  expect(kv_splits(Kernel::Wmma, r128, 4, 8, 32768, 132) == 33, "1 x 8 kv heads x 32k keys: 33");
  expect(kv_splits(Kernel::Wmma, r128, 4, 128, 8192, 132) == 2, "16 x 8 kv heads x 8k keys: 2");
  expect(kv_splits(Kernel::Wmma, r128, 4, 256, 4096, 132) == 1, "32 x 8 kv heads x 4k keys: 1");
  expect(kv_splits(Kernel::Wmma, r128, 4, 512, 2048, 132) == 1, "units that fill the SMs: 1");
  expect(kv_splits(Kernel::Wmma, r128, 17, 64, 8192, 132) == 2, "two query blocks per unit");
  expect(kv_splits(Kernel::Wmma, r128, 4, 8, 1500, 132) == 2, "each split streams >= 512 keys");
  expect(kv_splits(Kernel::Wmma, r128, 4, 8, 511, 132) == 1, "too few keys to split");
  expect(kv_splits(Kernel::Wmma, r128, 4, 1, 1 << 30, 132) == flashcore::kMaxKvSplits, "<= 64");
  expect(kv_splits(Kernel::Wmma, r128, 33, 8, 32768, 132) == 1, "more rows than decode: 1");
  expect(kv_splits(Kernel::CutlassSm80, r128, 4, 8, 32768, 132) == 1, "example 41 never splits");
  // The Hopper kernel: one 128-row block per SM.
  const flashcore::TileRow* h128 =
      flashcore::select_row(Kernel::CutlassSm90, flashcore::ArchClass::Sm90, 128, 4);
  expect(h128 != nullptr && kv_splits(Kernel::CutlassSm90, *h128, 4, 8, 32768, 132) == 16,
         "Hopper: 1 x 8 kv heads x 32k keys: 132 / 8 = 16");
  expect(kv_splits(Kernel::CutlassSm90, *h128, 4, 64, 8192, 132) == 2, "Hopper: 8 x 8k: 2");
  expect(kv_splits(Kernel::CutlassSm90, *h128, 4, 128, 8192, 132) == 1, "Hopper: 16 x 8k: 1");
  expect(kv_splits(Kernel::CutlassSm90, *h128, 4, 8, 1500, 132) == 2, "Hopper: >= 512 keys");
  expect(kv_splits(Kernel::CutlassSm90, *h128, 64, 8, 32768, 132) == 1, "Hopper: prefill: 1");
  expect(kv_splits(Kernel::Wmma, r128, 4, 0, 32768, 132) == 1, "no units");
  expect(kv_splits(Kernel::Wmma, r128, 4, int64_t{1} << 40, 32768, 132) == 1, "huge batch: 1");
  // The main d = 128 row (128 x 32, four warps): 2 blocks per SM by registers.
  const flashcore::TileRow* main128 =
      flashcore::select_row(Kernel::Wmma, flashcore::ArchClass::Sm90, 128, 4096);
  expect(main128 != nullptr && wmma_blocks_per_sm(*main128) == 2, "2 main-row blocks per SM");
  // An L4 (sm_89, 100 KB per SM, 58 SMs) holds 2 decode blocks per SM.
  const flashcore::TileRow* l4 =
      flashcore::select_row(Kernel::Wmma, flashcore::ArchClass::Sm86Sm89, 128, 4);
  expect(l4 != nullptr && wmma_blocks_per_sm(*l4) == 2 &&
             kv_splits(Kernel::Wmma, *l4, 4, 8, 32768, 58) == 14,
         "L4: 2 decode blocks per SM, 116 / 8 = 14 splits");

  Request r;  // one query, 32 heads on 8 kv heads, 32k keys: packed into 4 rows of 8 units
  r.q = bshd(1, 1, 32, 128);
  r.out = bshd(1, 1, 32, 128);
  r.k = r.v = bshd(1, 32768, 8, 128);
  r.options.backend = flashcore::Backend::Wmma;
  Problem p{};
  expect(flashcore::core::validate(r, &p).ok(), "a decode problem validates");
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  flashcore::core::Plan plan{};
  Status s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.splits == 33 && plan.row == row,
         "WMMA plans its decode row, 33 splits: " + std::to_string(plan.splits));
  r.options.backend = flashcore::Backend::Auto;
  s = flashcore::core::plan(r, p, h200, &plan);
  const flashcore::TileRow* hopper128 =
      flashcore::select_row(Kernel::CutlassSm90, flashcore::ArchClass::Sm90, 128, 4);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == 16 &&
             plan.row == hopper128,
         "Auto splits 8 units 16 ways on the Hopper kernel: " + std::to_string(plan.splits));
  s = flashcore::core::plan(r, p, flashcore::core::DeviceCaps{8, 9, 99 * 1024, ~0u, 58}, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma && plan.splits == 14,
         "Auto splits 8 units on WMMA's decode row off Hopper: " + std::to_string(plan.splits));
  r.q = bshd(64, 1, 32, 128);
  r.out = bshd(64, 1, 32, 128);  // 512 units: the Hopper kernel's walk, unsplit
  r.k = r.v = bshd(64, 2048, 8, 128);
  expect(flashcore::core::validate(r, &p).ok(), "a wide decode batch validates");
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90 && plan.splits == 1,
         "Auto walks 512 decode units on the Hopper kernel, unsplit");
}

// Outputs that share memory with themselves, each other or an input are refused; interleaved
// views of one buffer that share no element are not.
void overlapping_outputs() {
  auto overlap = [](const Status& s, Operand op, Operand other, const std::string& what) {
    expect(s.code == Code::OverlappingOutput && s.operand == op &&
               s.values[0] == static_cast<int64_t>(other),
           what + ": " + (s.ok() ? std::string("accepted") : s.message));
  };
  Request r = valid();
  r.out.stride[1] = 0;  // every query row of a head at one address (the report)
  overlap(check(r), Operand::Out, Operand::None, "an output with seq stride 0");
  r = valid();
  r.out.stride[2] = 32;  // heads 32 elements apart, rows of 64: neighbours share half a row
  overlap(check(r), Operand::Out, Operand::None, "interleaved heads");
  r = valid();
  r.out.stride[1] = 16, r.out.stride[2] = 24;  // injective, but not nested: refused too
  r.out.shape[1] = 3, r.out.shape[2] = 2, r.out.shape[3] = 8;
  r.q.shape[1] = 3, r.q.shape[2] = 2, r.q.shape[3] = 8;
  r.k.shape[2] = r.v.shape[2] = 1, r.k.shape[3] = r.v.shape[3] = 8;
  overlap(check(r), Operand::Out, Operand::None, "interleaved seq and heads");
  r = valid();
  flashcore::bhsd_strides(r.out.shape, r.out.stride);
  expect(check(r).ok(), "a BHSD output beside BSHD inputs");

  r = valid();
  r.out = r.q;
  overlap(check(r), Operand::Out, Operand::Q, "out is q");
  r = valid();
  r.out.address = r.k.address + 64 * 2 * 3;  // over k's fourth head
  r.out.shape[1] = 1;                         // ... with one query row
  r.q.shape[1] = 1;
  overlap(check(r), Operand::Out, Operand::K, "out over part of k");
  r = valid();
  r.lse = bshd(2, 100, 8, 1);
  flashcore::bhsd_strides(r.lse.shape, r.lse.stride);
  r.lse.element_bytes = 4;
  r.lse.address = r.out.address + 64;
  r.has_lse = true;
  overlap(check(r), Operand::Lse, Operand::Out, "lse inside out");

  // One buffer [batch, seq, 4, heads, d] packing q, k, v and the output at slots 0-3: the views
  // interleave (their address ranges intersect) but share no element.
  Request packed;
  const int64_t b = 2, sq = 50, h = 4, d = 64;
  const uint64_t base = uint64_t{1} << 40;
  for (auto [t, slot] : {std::pair{&packed.q, 0}, std::pair{&packed.k, 1}, std::pair{&packed.v, 2},
                         std::pair{&packed.out, 3}}) {
    *t = bshd(b, sq, h, d, base + static_cast<uint64_t>(slot * h * d * 2));
    t->stride[0] = sq * 4 * h * d, t->stride[1] = 4 * h * d, t->stride[2] = d;
  }
  expect(check(packed).ok(), "q, k, v and out packed in one buffer: " + check(packed).message);
  Request shifted = packed;
  shifted.out.address = base + 2 * h * d * 2 + d * 2;  // slot 2 from its second head: over v
  overlap(check(shifted), Operand::Out, Operand::V, "out one head into v's slot");

  // A planned run checks each run's addresses again.
  Request planned = valid();
  expect(flashcore::core::check_addresses(planned).ok(), "a planned run's fresh tensors");
  planned.out.address = planned.v.address;
  overlap(flashcore::core::check_addresses(planned), Operand::Out, Operand::V,
          "a planned run whose out is v");
  planned = valid();
  planned.q.address += 8;
  expect(flashcore::core::check_addresses(planned).code == Code::MisalignedPointer,
         "a planned run's misaligned q");
}

// Validating and planning a valid call, and checking a planned run's addresses, allocate
// nothing on the host (no Status message, no container): a small dense problem (WMMA), one-query
// GQA decode (split keys) and a problem that fills an H200 (the Hopper kernel).
void no_allocation_on_the_hot_path() {
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  Request dense = valid();
  Request decode;
  decode.q = bshd(1, 1, 32, 128);
  decode.out = bshd(1, 1, 32, 128);
  decode.k = decode.v = bshd(1, 32768, 8, 128);
  Request auto_h200 = valid();
  auto_h200.q = bshd(8, 2048, 16, 128);
  auto_h200.out = bshd(8, 2048, 16, 128);
  auto_h200.k = auto_h200.v = bshd(8, 2048, 16, 128);
  const long before = g_allocations;
  bool ok = true;
  for (int i = 0; i < 100; ++i) {
    for (const Request* r : {&dense, &decode, &auto_h200}) {
      Problem p{};
      flashcore::core::Plan plan{};
      ok = ok && flashcore::core::validate(*r, &p).ok() &&
           flashcore::core::plan(*r, p, h200, &plan).ok() &&
           flashcore::core::check_addresses(*r).ok();
    }
  }
  const long made = g_allocations - before;  // before expect() makes its message strings
  expect(ok, "the calls validate and plan");
  expect(made == 0,
         "validation and planning allocated " + std::to_string(made) + " times");
}

// A paged KV cache: each rule, placement and shape, the host copies' contents, visible keys,
// and planning (Auto: the dense rule, the Hopper kernel or WMMA; the Hopper kernel forced).
void paged_cache() {
  using flashcore::core::PagesDesc;
  static const int32_t table[2 * 4] = {3, 0, 9, 1, 5, 2, 7, 8};  // 2 sequences x 4 pages
  static const int32_t keys[2] = {40, 64};                       // pages 16 keys each
  auto paged = [] {
    Request r;
    r.q = bshd(2, 1, 8, 64);
    r.out = bshd(2, 1, 8, 64);
    r.k = bshd(10, 16, 2, 64);  // 10 pages of 16 keys
    r.v = bshd(10, 16, 2, 64);
    r.paged = true;
    PagesDesc& g = r.pages;
    g.table = 0x100000, g.seqlens = 0x200000;
    g.table_location = g.seqlens_location = 0;
    g.count = 2, g.page_size = 16, g.pages_per_seq = 4, g.max_seqlen_k = 64;
    g.host_table = table, g.host_seqlens = keys;
    return r;
  };
  auto pages_error = [](const Request& r, Field rule, int64_t seq, const std::string& what) {
    const Status s = check(r);
    expect(s.code == Code::InvalidPageTable && s.field == rule && s.values[0] == seq,
           what + ": " + (s.ok() ? std::string("accepted") : s.message));
  };
  Request r = paged();
  Problem p{};
  Status s = flashcore::core::validate(r, &p);
  expect(s.ok() && p.paged && p.seq_k == 64 && p.batch == 2 && !p.varlen,
         "a valid paged decode: " + s.message);
  for (const int64_t size : {0, 8, 24, 2048}) {
    r = paged();
    r.pages.page_size = size;
    pages_error(r, Field::PageSize, -1, "page size " + std::to_string(size));
  }
  r = paged();
  r.k.shape[1] = r.v.shape[1] = 32;
  expect_code(r, Code::ShapeMismatch, Operand::K, "pages of 32 keys in K, 16 in the table");
  r = paged();
  r.pages.table_location = kHost;
  expect_code(r, Code::DeviceMismatch, Operand::BlockTable, "a block table on the host");
  r = paged();
  r.pages.seqlens += 2;
  expect_code(r, Code::MisalignedPointer, Operand::SeqlensK, "key lengths not 4-byte aligned");
  r = paged();
  r.pages.count = 3;
  expect_code(r, Code::ShapeMismatch, Operand::BlockTable, "a table for 3 sequences, q has 2");
  r = paged();
  r.pages.max_seqlen_k = 65;
  pages_error(r, Field::KeysBeyondPages, -1, "max_seqlen_k beyond 4 pages of 16");
  r = paged();
  r.pages.max_seqlen_k = 50;
  pages_error(r, Field::KeysBeyondPages, 1, "sequence 1's 64 keys above max_seqlen_k 50");
  static const int32_t far[8] = {3, 0, 10, 1, 5, 2, 7, 8};  // sequence 0 reaches page 10
  r = paged();
  r.pages.host_table = far;
  pages_error(r, Field::PageIndex, 0, "page 10 of a 10-page cache");
  static const int32_t unused[8] = {3, 0, 9, -1, 5, 2, 7, 8};  // column 3 unused by 40 keys
  r = paged();
  r.pages.host_table = unused;
  expect(check(r).ok(), "an out-of-range entry past a sequence's keys is never read");
  static const int32_t negative[8] = {3, 0, 9, 1, 5, -2, 7, 8};
  r = paged();
  r.pages.host_table = negative;
  pages_error(r, Field::PageIndex, 1, "a negative page");
  static const int32_t empty_seq[2] = {40, 0};
  r = paged();
  r.pages.host_seqlens = empty_seq;
  expect_code(r, Code::NoVisibleKeys, Operand::None, "a sequence without keys has a query");
  r = paged();
  r.pages.host_table = nullptr, r.pages.host_seqlens = nullptr;
  r.pages.max_seqlen_k = 64;
  expect(check(r).ok(), "without host copies only placement and shapes are checked");
  r = paged();
  r.varlen = true;
  pages_error(r, Field::Sequences, -1, "variable-length queries with a paged cache");

  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  r = paged();
  flashcore::core::validate(r, &p);
  flashcore::core::Plan plan{};
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "Auto reads a small paged decode with the Hopper kernel on an H200: " + s.message);
  const flashcore::core::DeviceCaps a100{8, 0, 163 * 1024, ~0u, 108};
  s = flashcore::core::plan(r, p, a100, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto reads a paged cache with the WMMA kernel on an A100: " + s.message);
  {
    // 300 sequences x 2 kv heads: a dense decode this wide runs CUTLASS's decode row, which
    // reads no pages, so Auto takes WMMA (no host copies: the device holds the table).
    Request wide = paged();
    wide.q = bshd(300, 1, 8, 64);
    wide.out = bshd(300, 1, 8, 64);
    wide.pages.count = 300;
    wide.pages.host_table = nullptr;
    wide.pages.host_seqlens = nullptr;
    Problem wp{};
    s = flashcore::core::validate(wide, &wp);
    if (s.ok()) {
      s = flashcore::core::plan(wide, wp, h200, &plan);
    }
    expect(s.ok() && plan.kernel == Kernel::Wmma,
           "Auto reads a wide paged decode with the WMMA kernel on an H200: " + s.message);
    // Pages of 64: the Hopper kernel copies whole 64-key slabs and reads them faster.
    Request wide64 = wide;
    wide64.k = bshd(10, 64, 2, 64);
    wide64.v = bshd(10, 64, 2, 64);
    wide64.pages.page_size = 64;
    wide64.pages.pages_per_seq = 1;
    s = flashcore::core::validate(wide64, &wp);
    if (s.ok()) {
      s = flashcore::core::plan(wide64, wp, h200, &plan);
    }
    expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
           "Auto reads a wide decode in pages of 64 with the Hopper kernel on an H200: " +
               s.message);
    s = flashcore::core::plan(wide64, wp, a100, &plan);
    expect(s.ok() && plan.kernel == Kernel::Wmma,
           "Auto reads a wide decode in pages of 64 with the WMMA kernel on an A100: " +
               s.message);
    flashcore::core::DeviceCaps h200_without_sm90 = h200;
    h200_without_sm90.kernels &= ~(1u << uint32_t(Kernel::CutlassSm90));
    s = flashcore::core::plan(wide64, wp, h200_without_sm90, &plan);
    expect(s.ok() && plan.kernel == Kernel::Wmma,
           "a build without the Hopper kernels reads pages of 64 with WMMA: " + s.message);
  }
  r.options.backend = flashcore::Backend::CutlassSm90;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "the Hopper kernel, forced, reads a paged cache: " + s.message);
  r.options.backend = flashcore::Backend::CutlassSm80;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.code == Code::BackendUnavailable &&
             s.values[0] == int64_t(Kernel::CutlassSm80),
         "example 41 reads no paged cache, forced: " + s.message);
}

// Score modifiers. Logit softcapping: a cap that is not positive and finite is refused. A sliding
// window: a negative side is refused naming it; the rows it leaves without keys are counted
// exactly (against a row-by-row count); a side as wide as the problem bounds nothing. Both plan
// on the WMMA kernel under Auto; forcing another family is refused.
void score_modifiers() {
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    Request r = valid();
    r.options.softcap = bad;
    expect_code(r, Code::InvalidSoftcap, Operand::None, "softcap " + std::to_string(bad));
  }
  for (const Field side : {Field::WindowLeft, Field::WindowRight}) {
    Request r = valid();
    (side == Field::WindowLeft ? r.options.window_left : r.options.window_right) = -3;
    const Status s = check(r);
    expect(s.code == Code::InvalidWindow && s.field == side && s.values[0] == -3,
           std::string("a negative ") + flashcore::name(side) + ": " + s.message);
  }

  // Blind rows, against the definition row by row.
  using flashcore::Causal;
  int cases = 0;
  for (const Causal causal : {Causal::None, Causal::TopLeft, Causal::BottomRight}) {
    for (const int64_t sq : {1, 5, 17}) {
      for (const int64_t sk : {0, 1, 4, 17, 30}) {
        for (const int64_t left : {-1, 0, 1, 3, 40}) {
          for (const int64_t right : {-1, 0, 2, 40}) {
            flashcore::Options o;
            o.causal = causal;
            if (left >= 0) o.window_left = left;
            if (right >= 0) o.window_right = right;
            int64_t want = 0;
            for (int64_t i = 0; i < sq; ++i) {
              const int64_t off = causal == Causal::TopLeft ? 0 : sk - sq;
              int64_t lo = left >= 0 ? i + off - left : 0;
              int64_t hi = causal != Causal::None ? i + off : right >= 0 ? i + off + right : sk - 1;
              lo = std::max<int64_t>(lo, 0);
              hi = std::min<int64_t>(hi, sk - 1);
              want += lo > hi ? 1 : 0;
            }
            const int64_t got = flashcore::core::blind_rows(o, sq, sk);
            ++cases;
            expect(got == want, "blind rows " + std::to_string(got) + " != " +
                                    std::to_string(want) + " (sq " + std::to_string(sq) +
                                    ", sk " + std::to_string(sk) + ", left " +
                                    std::to_string(left) + ", right " + std::to_string(right) +
                                    ", causal " + std::to_string(int(causal)) + ")");
          }
        }
      }
    }
  }
  expect(cases == 900, "every blind-row case ran");
  Request r = valid();  // 100 queries, 130 keys: bottom-right row 0 sees keys 30 - left ..
  r.options.window_right = 0;
  r.options.window_left = 0;
  r.q.shape[1] = r.out.shape[1] = 140;  // rows 0-9 lie before key 0
  r.q.stride[0] = r.out.stride[0] = 140 * 8 * 64;
  Status s = check(r);
  expect(s.code == Code::NoVisibleKeys && s.values[0] == 10,
         "a window leaves 10 rows without keys: " + s.message);

  r = valid();
  r.options.softcap = 30.0f;
  r.options.window_left = 16;
  Problem p{};
  expect(flashcore::core::validate(r, &p).ok() && p.window_left == 16 && p.window_right == -1,
         "softcap 30 and a left window of 16 validate");
  r.options.window_left = 230;  // >= seq_q + seq_k: bounds nothing
  expect(flashcore::core::validate(r, &p).ok() && p.window_left == -1,
         "a window wider than the problem is unbounded");
  r = valid();
  r.q.shape[1] = r.out.shape[1] = 1;  // one-query GQA: packed, unless windowed
  expect(flashcore::core::validate(r, &p).ok() && p.packs_heads(), "decode packs heads");
  r.options.window_left = 64;
  expect(flashcore::core::validate(r, &p).ok() && !p.packs_heads(),
         "a windowed decode does not pack heads (each head's one row has its own band)");

  // A window, a softcap or both run where Auto runs the plain call, WMMA or the Hopper kernel
  // (which bounds the band itself and has a softcap schedule per tile); forced, both families
  // take them and CUTLASS example 41 refuses them.
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  for (const bool large : {false, true}) {
    for (const int modifiers : {1, 2, 3}) {  // 1: a window, 2: a softcap, 3: both
      const bool window = (modifiers & 1) != 0, softcap = (modifiers & 2) != 0;
      r = valid();
      if (large) {  // enough query blocks to fill the H200: Auto runs the Hopper kernel
        r.q = bshd(4, 4096, 32, 128);
        r.out = bshd(4, 4096, 32, 128);
        r.k = bshd(4, 4096, 8, 128);
        r.v = bshd(4, 4096, 8, 128);
      }
      if (window) r.options.window_left = 8;
      if (softcap) r.options.softcap = 50.0f;
      const std::string what = "(large " + std::to_string(large) + ", window " +
                               std::to_string(window) + ", softcap " + std::to_string(softcap) +
                               "): ";
      expect(flashcore::core::validate(r, &p).ok(), "a modified call validates " + what);
      flashcore::core::Plan plan{};
      s = flashcore::core::plan(r, p, h200, &plan);
      const Kernel expected = large ? Kernel::CutlassSm90 : Kernel::Wmma;
      expect(s.ok() && plan.kernel == expected, "Auto's kernel " + what + s.message);
      for (const auto forced : {flashcore::Backend::CutlassSm80, flashcore::Backend::CutlassSm90,
                                flashcore::Backend::Wmma}) {
        r.options.backend = forced;
        s = flashcore::core::plan(r, p, h200, &plan);
        if (forced != flashcore::Backend::CutlassSm80) {
          expect(s.ok() && plan.kernel == *flashcore::kernel_of(forced),
                 "a family with these modifiers, forced, takes them " + what + s.message);
        } else {
          expect(s.code == Code::BackendUnavailable &&
                     s.values[0] == int64_t(*flashcore::kernel_of(forced)),
                 "a family without these modifiers, forced, refuses them " + what + s.message);
        }
      }
    }
  }
}

// ALiBi slopes: each bad description gets its own code before any launch; with slopes, a
// one-query GQA call is not head-packed and Auto runs WMMA (other families refused).
void alibi_slopes() {
  const auto with_slopes = [](int64_t batch, int64_t heads) {
    Request r = valid();
    r.has_alibi = true;
    r.alibi.address = uint64_t{1} << 40;
    r.alibi.location = 0;
    r.alibi.batch = batch;
    r.alibi.heads = heads;
    return r;
  };
  Problem p{};
  for (const int64_t batch : {1, 2}) {
    expect(flashcore::core::validate(with_slopes(batch, 8), &p).ok() && p.alibi,
           "slopes of [" + std::to_string(batch) + ", 8] validate");
  }
  Request r = with_slopes(3, 8);
  Status s = check(r);
  expect(s.code == Code::ShapeMismatch && s.operand == Operand::AlibiSlopes &&
             s.field == Field::Batch && s.values[0] == 3 && s.values[1] == 2,
         "slopes for 3 sequences on a batch of 2: " + s.message);
  r = with_slopes(1, 2);
  s = check(r);
  expect(s.code == Code::ShapeMismatch && s.field == Field::Heads && s.values[0] == 2 &&
             s.values[1] == 8,
         "slopes for the kv heads, not the query heads: " + s.message);
  r = with_slopes(1, 8);
  r.alibi.location = flashcore::core::kHost;
  expect_code(r, Code::DeviceMismatch, Operand::AlibiSlopes, "host slopes on a device call");
  r = with_slopes(1, 8);
  r.alibi.address += 2;
  expect_code(r, Code::MisalignedPointer, Operand::AlibiSlopes, "slopes 2 bytes off");
  float host[8] = {1, 0.5f, 0.25f, 0, -1, 3, 2, 1};
  r = with_slopes(1, 8);
  r.alibi.host = host;
  expect(check(r).ok(), "finite host slopes (zero and negative included) pass");
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    host[5] = bad;
    s = check(r);
    expect(s.code == Code::InvalidAlibiSlope && s.operand == Operand::AlibiSlopes &&
               s.values[0] == 5,
           "a non-finite slope is named by index: " + s.message);
  }
  const auto checked = flashcore::core::check_alibi_values(host, 5);
  expect(!checked, "the first five slopes are finite");

  r = with_slopes(1, 8);
  r.q.shape[1] = r.out.shape[1] = 1;
  expect(flashcore::core::validate(r, &p).ok() && !p.packs_heads(),
         "a decode with slopes does not pack heads (each head has its own slope)");
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  r = with_slopes(2, 8);
  flashcore::core::validate(r, &p);
  flashcore::core::Plan plan{};
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto applies ALiBi with WMMA on a call too small for the Hopper kernel: " + s.message);
  r.options.backend = flashcore::Backend::CutlassSm80;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.code == Code::BackendUnavailable, "example 41 forced with ALiBi: " + s.message);
  r.options.backend = flashcore::Backend::CutlassSm90;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "the Hopper kernel, forced, applies ALiBi: " + s.message);
  // A call that fills the H200: Auto runs it on the Hopper kernel, ALiBi or not.
  r = with_slopes(1, 32);
  r.q = bshd(4, 4096, 32, 128);
  r.out = bshd(4, 4096, 32, 128);
  r.k = bshd(4, 4096, 8, 128);
  r.v = bshd(4, 4096, 8, 128);
  expect(flashcore::core::validate(r, &p).ok(), "a large call with slopes validates");
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "Auto applies ALiBi with the Hopper kernel on a call that fills it: " + s.message);
}

void additive_bias() {
  // valid(): batch 2, 100 queries, 8 query heads, 130 keys. A torch-like dense f32 bias
  // [2, 8, 100, 130] (BHSD order) at its own address.
  const auto with_bias = [](int64_t b, int64_t sq, int64_t h, int64_t sk) {
    Request r = valid();
    r.has_bias = true;
    r.bias_type = flashcore::BiasType::F32;
    r.bias.address = (uint64_t{1} << 41) + (uint64_t{1} << 20);  // between bshd()s addresses
    r.bias.location = 0;
    r.bias.element_bytes = 4;
    const int64_t shape[4] = {b, sq, h, sk};
    const int64_t stride[4] = {h * sq * sk, sk, sq * sk, 1};
    for (int i = 0; i < 4; ++i) {
      r.bias.shape[i] = shape[i];
      r.bias.stride[i] = stride[i];
    }
    return r;
  };
  Problem p{};
  expect(flashcore::core::validate(with_bias(2, 100, 8, 130), &p).ok() && p.bias,
         "a full bias validates");
  expect(check(with_bias(1, 100, 1, 130)).ok(), "a bias broadcast over batch and heads");
  expect(check(with_bias(1, 1, 1, 1)).ok(), "a bias broadcast over every axis");
  Request r = with_bias(2, 100, 8, 130);
  r.bias.stride[0] = r.bias.stride[2] = 0;  // broadcast through strides
  expect(check(r).ok(), "a bias broadcast by zero strides");
  const struct {
    int64_t shape[4];
    Field field;
  } wrong[] = {{{3, 100, 8, 130}, Field::Batch},
               {{2, 130, 8, 130}, Field::SeqQ},
               {{2, 100, 2, 130}, Field::Heads},
               {{2, 100, 8, 100}, Field::SeqK}};
  for (const auto& w : wrong) {
    Status s = check(with_bias(w.shape[0], w.shape[1], w.shape[2], w.shape[3]));
    expect(s.code == Code::ShapeMismatch && s.operand == Operand::Bias && s.field == w.field,
           std::string("a bias with a wrong ") + flashcore::name(w.field) + ": " + s.message);
  }
  r = with_bias(2, 100, 8, 130);
  r.bias_type = static_cast<flashcore::BiasType>(7);
  Status s = check(r);
  expect(s.code == Code::UnsupportedBiasType && s.values[0] == 7,
         "an element type that is no BiasType: " + s.message);
  r = with_bias(2, 100, 8, 130);
  r.bias.location = flashcore::core::kHost;
  expect_code(r, Code::DeviceMismatch, Operand::Bias, "a host bias on a device call");
  r = with_bias(2, 100, 8, 130);
  r.bias.address += 2;
  expect_code(r, Code::MisalignedPointer, Operand::Bias, "an f32 bias 2 bytes off");
  r.bias_type = flashcore::BiasType::BF16;
  r.bias.element_bytes = 2;
  expect(check(r).ok(), "a bf16 bias 2 bytes off is aligned");
  r = with_bias(2, 100, 8, 130);
  r.bias.stride[3] = -1;
  expect_code(r, Code::SizeOverflow, Operand::Bias, "a negative bias stride");
  r = with_bias(2, 100, 8, 130);
  r.bias.stride[0] = int64_t{1} << 62;
  expect_code(r, Code::SizeOverflow, Operand::Bias, "a bias whose extent overflows");
  r = with_bias(2, 100, 8, 130);
  r.bias.address = r.out.address;
  s = check(r);
  expect(s.code == Code::OverlappingOutput && s.operand == Operand::Out &&
             s.values[0] == static_cast<int64_t>(Operand::Bias),
         "an output over the bias: " + s.message);
  expect(flashcore::core::check_addresses(r).code == Code::OverlappingOutput,
         "a planned run checks the bias's overlap with its new output");

  r = with_bias(2, 1, 8, 130);
  r.q.shape[1] = r.out.shape[1] = 1;
  expect(flashcore::core::validate(r, &p).ok() && !p.packs_heads(),
         "a decode with a bias does not pack heads (each head has its own bias row)");
  const flashcore::core::DeviceCaps h200{9, 0, 227 * 1024, ~0u, 132};
  r = with_bias(2, 100, 8, 130);
  flashcore::core::validate(r, &p);
  flashcore::core::Plan plan{};
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto applies a bias with WMMA where the Hopper kernel's units do not fill the chip: " +
             s.message);
  r.options.backend = flashcore::Backend::CutlassSm80;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.code == Code::BackendUnavailable, "CUTLASS example 41 with a bias, forced: " + s.message);
  r.options.backend = flashcore::Backend::CutlassSm90;
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "the Hopper kernel with a bias, forced on an H200: " + s.message);
  const flashcore::core::DeviceCaps a100{8, 0, 163 * 1024, ~0u, 108};
  s = flashcore::core::plan(r, p, a100, &plan);
  expect(s.code == Code::BackendUnavailable,
         "the Hopper kernel with a bias, forced on an A100: " + s.message);
  r = with_bias(16, 2048, 8, 2048);  // 16 x 8 heads x 16 query blocks of 128
  r.q = bshd(16, 2048, 8, 64);
  r.k = bshd(16, 2048, 2, 64);
  r.v = bshd(16, 2048, 2, 64);
  r.out = bshd(16, 2048, 8, 64);
  r.bias.address = bshd(1, 1, 1, 8).address;  // a slot of its own: the bias takes 2 GiB
  r.options.backend = flashcore::Backend::Auto;
  expect(flashcore::core::validate(r, &p).ok(), "a 16 x 2048 x 2048 call with a bias validates");
  s = flashcore::core::plan(r, p, h200, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "Auto applies a bias that fills the chip with the Hopper kernel: " + s.message);
  // A build without the Hopper bias kernels (the `sm90-bias` feature off): Auto applies the bias
  // with WMMA, a forced Hopper kernel is refused, and a call without a bias still runs there.
  flashcore::core::DeviceCaps no_bias = h200;
  no_bias.sm90_bias = false;
  s = flashcore::core::plan(r, p, no_bias, &plan);
  expect(s.ok() && plan.kernel == Kernel::Wmma,
         "Auto applies a bias with WMMA where the Hopper bias kernels were not built: " + s.message);
  r.options.backend = flashcore::Backend::CutlassSm90;
  s = flashcore::core::plan(r, p, no_bias, &plan);
  expect(s.code == Code::BackendUnavailable && s.values[0] == int64_t(Kernel::CutlassSm90) &&
             s.message.find("sm90-bias") != std::string::npos,
         "the Hopper kernel with a bias, forced, without its bias kernels: " + s.message);
  r.has_bias = false;
  r.options.backend = flashcore::Backend::Auto;
  expect(flashcore::core::validate(r, &p).ok(), "the same call without a bias validates");
  s = flashcore::core::plan(r, p, no_bias, &plan);
  expect(s.ok() && plan.kernel == Kernel::CutlassSm90,
         "a call without a bias runs on the Hopper kernel without its bias kernels: " + s.message);
}

// The Hopper kernel's last wave in pieces: which walks cut their last wave's units (the units
// must hold kSm90TailUnitTiles key tiles, the idle tail kSm90TailIdleTiles per block), and how
// many.
void last_wave_in_pieces() {
  using flashcore::sm90_tail_units;
  // 2 x 16 heads x 8192 tokens at d = 128: 2048 units of 64 key tiles, 132 blocks, 68 left over.
  expect(sm90_tail_units(2048, 132, 64) == 68, "2x16x8192x128: 68 units in pieces");
  // 8 x 16 x 2048 at d = 128: the same walk of units of 16 key tiles, too short to cut
  // (measured: plan.h).
  expect(sm90_tail_units(2048, 132, 16) == 0, "units of 16 key tiles stay whole");
  expect(sm90_tail_units(2048, 132, 31) == 0 && sm90_tail_units(2048, 132, 32) == 68,
         "the length bound is 32 key tiles");
  // 130 of 132 blocks busy for the last wave: 2 idle blocks x 64 tiles are below 4 per block.
  expect(sm90_tail_units(130 + 132, 132, 64) == 0, "a short idle tail stays whole");
  expect(sm90_tail_units(1980, 132, 64) == 0, "whole waves: nothing to cut");
  expect(sm90_tail_units(100, 132, 64) == 0, "fewer units than blocks: one wave");
  expect(sm90_tail_units(133, 132, 1000) == 1, "one unit left over");
  expect(sm90_tail_units(140, 132, 32) == 0 && sm90_tail_units(141, 132, 32) == 9,
         "fewer than two key tiles per block: whole");
  expect(sm90_tail_units(2048, 0, 64) == 0 && sm90_tail_units(2048, 132, 0) == 0,
         "no blocks or no key tiles: nothing");
}

// The backward pass: the forward call's rules (its logsumexp required), then each gradient's
// extent, location, shape and strides, then overlaps, each with its own operand.
void backward() {
  using flashcore::core::BackwardRequest;
  const auto valid_backward = [] {
    BackwardRequest r{valid(), bshd(2, 100, 8, 64), bshd(2, 100, 8, 64), bshd(2, 130, 2, 64),
                      bshd(2, 130, 2, 64)};
    r.forward.lse = bshd(2, 100, 8, 1);
    flashcore::bhsd_strides(r.forward.lse.shape, r.forward.lse.stride);
    r.forward.lse.element_bytes = 4;
    return r;
  };
  const auto run = [](const BackwardRequest& r) {
    Problem p{};
    return flashcore::core::validate_backward(r, &p);
  };
  const auto refused = [&](const BackwardRequest& r, Code code, Operand op, const std::string& what) {
    const Status s = run(r);
    expect(s.code == code && s.operand == op && !s.message.empty(),
           "backward, " + what + ": got " + flashcore::name(s.code) + " for " +
               flashcore::name(s.operand) + " (" + s.message + ")");
  };
  Problem p{};
  const Status ok = flashcore::core::validate_backward(valid_backward(), &p);
  expect(ok.ok() && p.batch == 2 && p.seq_q == 100 && p.seq_k == 130 && p.heads_kv == 2,
         "a valid backward call passes and describes its problem: " + ok.message);

  BackwardRequest r = valid_backward();
  r.forward.has_lse = false;  // ignored: the logsumexp is always an operand
  expect(run(r).ok(), "backward: has_lse is implied");
  r.forward.lse.shape[1] = 7;
  refused(r, Code::ShapeMismatch, Operand::Lse, "a logsumexp of other heads");
  r = valid_backward();
  r.forward.k.shape[3] = 32;
  refused(r, Code::ShapeMismatch, Operand::K, "a forward rule (k's head dim)");
  r = valid_backward();
  r.forward.paged = true;
  refused(r, Code::BackendUnavailable, Operand::None, "a paged cache");

  r = valid_backward();
  r.dq.stride[0] = -1;
  refused(r, Code::SizeOverflow, Operand::DQ, "a negative dq stride");
  r = valid_backward();
  r.dv.location = kHost;
  refused(r, Code::DeviceMismatch, Operand::DV, "dv on the host");
  r = valid_backward();
  r.dout.shape[2] = 2;
  refused(r, Code::ShapeMismatch, Operand::DOut, "dout shaped like k");
  r = valid_backward();
  r.dk.shape[1] = 100;
  refused(r, Code::ShapeMismatch, Operand::DK, "dk shaped like q");
  r = valid_backward();
  r.dq.stride[3] = 2;
  refused(r, Code::NonContiguousHeadDim, Operand::DQ, "dq's head dim strided");
  r = valid_backward();
  r.dk.address += 8;
  refused(r, Code::MisalignedPointer, Operand::DK, "dk 8 bytes off");

  const auto overlap = [&](const BackwardRequest& r, Operand op, Operand other,
                           const std::string& what) {
    const Status s = run(r);
    expect(s.code == Code::OverlappingOutput && s.operand == op &&
               s.values[0] == static_cast<int64_t>(other),
           "backward, " + what + ": " + (s.ok() ? std::string("accepted") : s.message));
  };
  r = valid_backward();
  r.dq.stride[1] = 0;
  overlap(r, Operand::DQ, Operand::None, "dq with seq stride 0");
  r = valid_backward();
  r.dq = r.dout;
  overlap(r, Operand::DQ, Operand::DOut, "dq is dout");
  r = valid_backward();
  r.dk = r.forward.k;
  overlap(r, Operand::DK, Operand::K, "dk is k");
  r = valid_backward();
  r.dv.address = r.forward.out.address;
  overlap(r, Operand::DV, Operand::Out, "dv over the forward output");
  r = valid_backward();
  r.dv = r.dk;
  overlap(r, Operand::DV, Operand::DK, "dv is dk");
  r = valid_backward();
  r.dq.address = r.forward.lse.address;
  overlap(r, Operand::DQ, Operand::Lse, "dq over the logsumexp");

  // The GPU backward pass's plan: Auto, Wmma or CutlassSm90 (the Hopper kernel where it covers
  // the call); compute capability 8.0 on; a tile row that takes the call and fits the shared
  // memory; the grid's limits.
  flashcore::core::DeviceCaps l4;
  l4.major = 8, l4.minor = 9, l4.smem_per_block_optin = 99 * 1024;
  const auto plan = [&](const BackwardRequest& b, const flashcore::core::DeviceCaps& caps) {
    Problem q{};
    const Status v = flashcore::core::validate_backward(b, &q);
    return v.ok() ? flashcore::core::plan_backward(b, q, caps) : v;
  };
  r = valid_backward();
  expect(plan(r, l4).ok(), "backward plans on an L4: " + plan(r, l4).message);
  using flashcore::BackwardKernel;
  using flashcore::core::kBackwardTiles;
  const flashcore::BackwardTable table = flashcore::backward_tile_table();
  expect(table.rows == kBackwardTiles &&
             table.count == size_t(flashcore::core::kBackwardTileCount),
         "the public backward table is core's");
  // Each tier's WMMA rows from the largest shared memory down (the Hopper rows, first in their
  // tiers, take only the calls they cover); the narrow rows fit an L4.
  for (int i = 0; i < flashcore::core::kBackwardTileCount; ++i) {
    const auto& t = kBackwardTiles[i];
    expect(t.kernel != BackwardKernel::Narrow || t.smem_bytes <= 99 * 1024,
           "a narrow row fits an L4");
    for (int j = i + 1; j < flashcore::core::kBackwardTileCount; ++j) {
      const auto& u = kBackwardTiles[j];
      expect(u.max_head_dim != t.max_head_dim || t.kernel == BackwardKernel::Hopper ||
                 u.smem_bytes < t.smem_bytes,
             "a tier's WMMA rows descend in shared memory");
      expect(u.max_head_dim != t.max_head_dim || u.kernel != BackwardKernel::Hopper,
             "a tier's Hopper row comes first");
    }
  }
  r.forward.options.backend = flashcore::Backend::Wmma;
  expect(plan(r, l4).ok(), "backward forced on wmma");
  r.forward.options.backend = flashcore::Backend::CutlassSm80;
  Status s = plan(r, l4);
  expect(s.code == Code::BackendUnavailable && s.values[0] == int64_t(Kernel::CutlassSm80),
         "backward forced on example 41: " + s.message);
  r.forward.options.backend = flashcore::Backend::CutlassSm90;
  s = plan(r, l4);
  expect(s.code == Code::BackendUnavailable && s.values[0] == int64_t(Kernel::CutlassSm90),
         "the Hopper backward forced on an L4: " + s.message);
  r = valid_backward();
  flashcore::core::DeviceCaps t4 = l4;
  t4.major = 7, t4.minor = 5, t4.smem_per_block_optin = 64 * 1024;
  expect(plan(r, t4).code == Code::UnsupportedDevice, "backward on compute capability 7.5");
  flashcore::core::DeviceCaps small = l4;
  small.smem_per_block_optin = kBackwardTiles[2].smem_bytes - 1;  // a byte short
  expect(kBackwardTiles[2].max_head_dim == 64 && r.forward.q.shape[3] == 64 &&
             kBackwardTiles[2].kernel == BackwardKernel::Narrow,
         "the smallest row of 64");
  expect(plan(r, small).code == Code::SharedMemoryExceeded, "backward beyond shared memory");
  // The row that runs on compute capability 9.0 with `smem` bytes per block, head dim
  // `head_dim`, `forced` class, `backend`, and (`hopper`) a build with the Hopper kernels; -1
  // where no row fits. Without the Hopper kernels: the wide kernel where its shared memory
  // fits, an H100 / H200 (227 KB) at head dims 64 and 128, an A100 (164 KB) at 64 only, an L4
  // (99 KB) never below 256; at 256 the wide kernel's 64-row steps on an H100 / H200, its
  // 32-row steps on an A100, its 4-warp row on an L4.
  const auto tile_on = [&](int64_t head_dim, int64_t smem,
                           std::optional<flashcore::ArchClass> forced = std::nullopt,
                           bool hopper = false,
                           flashcore::Backend backend = flashcore::Backend::Auto) {
    BackwardRequest b = valid_backward();
    b.forward.options.force_arch_class = forced;
    b.forward.options.backend = backend;
    for (flashcore::core::TensorDesc* t : {&b.forward.q, &b.forward.k, &b.forward.v,
                                           &b.forward.out, &b.dout, &b.dq, &b.dk, &b.dv}) {
      t->shape[3] = head_dim;
      t->stride[2] = head_dim, t->stride[1] = head_dim * t->shape[2];
      t->stride[0] = t->stride[1] * t->shape[1];
    }
    flashcore::core::DeviceCaps caps = l4;
    caps.major = 9, caps.minor = 0, caps.smem_per_block_optin = smem;
    caps.multiprocessors = 132;  // more than the call's blocks: Auto keeps the WMMA rows
    if (!hopper) {
      caps.kernels &= ~(1u << int(Kernel::CutlassSm90));
    }
    Problem q{};
    int tile = -1;
    const Status v = flashcore::core::validate_backward(b, &q);
    const Status p = v.ok() ? flashcore::core::plan_backward(b, q, caps, &tile) : v;
    if (p.code == Code::SharedMemoryExceeded) {
      return -1;
    }
    expect(p.ok(), "backward plan, head dim " + std::to_string(head_dim) + ": " + p.message);
    expect(tile >= 0 && kBackwardTiles[tile].max_head_dim == flashcore::core::backward_tier(head_dim),
           "a row of the head dim's tier");
    return tile;
  };
  const auto wide_on = [&](int64_t head_dim, int64_t smem,
                           std::optional<flashcore::ArchClass> forced = std::nullopt) {
    const int tile = tile_on(head_dim, smem, forced);
    return tile >= 0 && kBackwardTiles[tile].kernel == BackwardKernel::Wide;
  };
  expect(wide_on(128, 227 * 1024) && wide_on(64, 227 * 1024), "wide on an H200");
  expect(!wide_on(128, 164 * 1024) && wide_on(64, 164 * 1024), "wide at 64 only on an A100");
  expect(!wide_on(128, 99 * 1024) && !wide_on(64, 99 * 1024), "narrow on an L4");
  expect(kBackwardTiles[4].kernel == BackwardKernel::Wide && wide_on(128, kBackwardTiles[4].smem_bytes) &&
             !wide_on(128, kBackwardTiles[4].smem_bytes - 1),
         "wide exactly where its shared memory fits");
  expect(tile_on(256, 227 * 1024) == 6 && tile_on(256, 164 * 1024) == 7 &&
             tile_on(256, 99 * 1024) == 8,
         "head dim 256: 64-row steps on an H200, 32-row steps on an A100, 4 warps on an L4");
  expect(tile_on(200, kBackwardTiles[6].smem_bytes) == 6 &&
             tile_on(136, kBackwardTiles[6].smem_bytes - 1) == 7 &&
             tile_on(256, kBackwardTiles[7].smem_bytes - 1) == 8 &&
             tile_on(256, kBackwardTiles[8].smem_bytes - 1) == -1,
         "head dims 136 to 256: the tier's rows exactly where they fit");
  expect(tile_on(256, 227 * 1024, flashcore::ArchClass::Sm80) == 7 &&
             tile_on(256, 227 * 1024, flashcore::ArchClass::Sm86Sm89) == 8,
         "head dim 256 with an A100's and an L4's class forced on an H200");
  // A forced class plans as that class would on the device: an L4's narrow kernel, an A100's.
  expect(!wide_on(128, 227 * 1024, flashcore::ArchClass::Sm86Sm89) &&
             !wide_on(64, 227 * 1024, flashcore::ArchClass::Sm86Sm89),
         "an L4's kernel forced on an H200");
  expect(!wide_on(128, 227 * 1024, flashcore::ArchClass::Sm80) &&
             wide_on(64, 227 * 1024, flashcore::ArchClass::Sm80),
         "an A100's kernels forced on an H200");
  expect(wide_on(128, 227 * 1024, flashcore::ArchClass::Sm90), "an H200's own class forced");
  // With the Hopper kernels built: their rows at 64 and 128 with CutlassSm90 forced (also with
  // the H200's own class forced); under Auto or Wmma the WMMA rows.
  const auto sm90 = flashcore::Backend::CutlassSm90;
  expect(kBackwardTiles[0].kernel == BackwardKernel::Hopper &&
             kBackwardTiles[3].kernel == BackwardKernel::Hopper,
         "the Hopper rows at 64 and 128");
  expect(tile_on(64, 227 * 1024, std::nullopt, true, sm90) == 0 &&
             tile_on(128, 227 * 1024, std::nullopt, true, sm90) == 3 &&
             tile_on(96, 227 * 1024, flashcore::ArchClass::Sm90, true, sm90) == 3 &&
             tile_on(8, 227 * 1024, std::nullopt, true, sm90) == 0,
         "the Hopper rows on an H200");
  expect(tile_on(128, 227 * 1024, std::nullopt, true, flashcore::Backend::Wmma) == 4 &&
             tile_on(128, 227 * 1024, std::nullopt, true) == 4 &&
             tile_on(64, 227 * 1024, std::nullopt, true) == 1 &&
             tile_on(128, 227 * 1024, flashcore::ArchClass::Sm80, true) == 5 &&
             tile_on(256, 227 * 1024, std::nullopt, true) == 6,
         "the WMMA rows under Wmma, and under Auto for a grid smaller than the GPU");
  expect(tile_on(64, 227 * 1024, std::nullopt, true, flashcore::Backend::Auto) == 1,
         "Auto at 64 for a grid smaller than the GPU");
  // Auto: the Hopper rows where the grid (here 2 key blocks x 2 sequences x 2 kv heads = 8
  // blocks) has a block per SM, or the SM count is unknown.
  {
    Problem q{};
    int tile = -1;
    const BackwardRequest b = valid_backward();  // head dim 64
    BackwardRequest b128 = b;
    for (TensorDesc* t : {&b128.forward.q, &b128.forward.k, &b128.forward.v, &b128.forward.out,
                          &b128.dout, &b128.dq, &b128.dk, &b128.dv}) {
      t->shape[3] = 128;
      flashcore::bshd_strides(t->shape, t->stride);
    }
    flashcore::core::DeviceCaps caps = l4;
    caps.major = 9, caps.minor = 0, caps.smem_per_block_optin = 227 * 1024;
    const auto auto_tile = [&](const BackwardRequest& req, int32_t sms) {
      caps.multiprocessors = sms;
      tile = -1;
      const Status v = flashcore::core::validate_backward(req, &q);
      const Status got = v.ok() ? flashcore::core::plan_backward(req, q, caps, &tile) : v;
      expect(got.ok(), "Auto's backward plan: " + got.message);
      return tile;
    };
    expect(auto_tile(b128, 8) == 3 && auto_tile(b128, 0) == 3 && auto_tile(b128, 9) == 4,
           "Auto: the Hopper row at 128 from a block per SM");
    expect(auto_tile(b, 8) == 0 && auto_tile(b, 9) == 1, "Auto at 64");
    BackwardRequest capped = b128;
    capped.forward.options.softcap = 30.0f;
    expect(auto_tile(capped, 1) == 4, "Auto: the wide row for a call the Hopper kernel lacks");
  }
  // Forced on what it does not cover: BackendUnavailable, whatever else would run.
  const auto hopper_forced = [&](BackwardRequest b, flashcore::core::DeviceCaps caps) {
    b.forward.options.backend = flashcore::Backend::CutlassSm90;
    const Status got = plan(b, caps);
    return got.code == Code::BackendUnavailable &&
           got.values[0] == int64_t(Kernel::CutlassSm90) && !got.message.empty();
  };
  flashcore::core::DeviceCaps h200 = l4;
  h200.major = 9, h200.minor = 0, h200.smem_per_block_optin = 227 * 1024;
  r = valid_backward();
  r.forward.options.backend = flashcore::Backend::CutlassSm90;
  expect(plan(r, h200).ok(), "the Hopper backward forced on an H200: " + plan(r, h200).message);
  for (TensorDesc* t : {&r.forward.q, &r.forward.k, &r.forward.v, &r.forward.out, &r.dout, &r.dq,
                        &r.dk, &r.dv}) {
    t->shape[3] = 256;
    flashcore::bshd_strides(t->shape, t->stride);
  }
  expect(hopper_forced(r, h200), "the Hopper backward forced at head dim 256");
  h200.smem_per_block_optin = kBackwardTiles[0].smem_bytes - 1;
  r = valid_backward();
  r.forward.options.backend = flashcore::Backend::CutlassSm90;
  s = plan(r, h200);
  expect(s.code == Code::SharedMemoryExceeded && s.values[0] == kBackwardTiles[0].smem_bytes,
         "the Hopper backward forced, a byte short at 64: " + s.message);
  h200.smem_per_block_optin = 227 * 1024;
  flashcore::core::DeviceCaps unbuilt = h200;
  unbuilt.kernels &= ~(1u << int(Kernel::CutlassSm90));
  expect(hopper_forced(valid_backward(), unbuilt), "the Hopper backward forced, not built");
  r = valid_backward();
  r.forward.options.force_arch_class = flashcore::ArchClass::Sm86Sm89;
  expect(hopper_forced(r, h200), "the Hopper backward forced with an L4's class");
  r = valid_backward();
  r.forward.options.softcap = 30.0f;
  expect(hopper_forced(r, h200), "the Hopper backward forced with a softcap");
  r = valid_backward();
  r.forward.k.stride[0] = 0, r.forward.v.stride[0] = 0;  // one K and V for both batch entries
  expect(plan(r, h200).ok() && hopper_forced(r, h200),
         "the Hopper backward forced on broadcast K and V (stride 0: no TMA descriptor)");
  for (TensorDesc* t : {&r.forward.q, &r.forward.k, &r.forward.v, &r.forward.out, &r.dout, &r.dq,
                        &r.dk, &r.dv}) {
    t->shape[3] = 256;
    flashcore::bshd_strides(t->shape, t->stride);
  }
  flashcore::core::DeviceCaps smaller = l4;
  smaller.smem_per_block_optin = kBackwardTiles[8].smem_bytes - 1;
  s = plan(r, smaller);
  expect(s.code == Code::SharedMemoryExceeded && s.values[0] == kBackwardTiles[8].smem_bytes &&
             s.values[1] == smaller.smem_per_block_optin,
         "backward at head dim 256 a byte short of the smallest row: " + s.message);
  // The valid call with `heads` query and kv heads and `keys` keys per sequence, each tensor in
  // its own 2^47 bytes of address space (k at 2^20 keys x 2^16 heads takes 2^45).
  const auto with_heads = [&](int64_t heads, int64_t keys) {
    BackwardRequest b = valid_backward();
    uint64_t address = uint64_t{1} << 48;
    const auto place = [&](TensorDesc* t, int64_t seq) {
      t->shape[1] = seq, t->shape[2] = heads;
      flashcore::bshd_strides(t->shape, t->stride);
      t->address = (address += uint64_t{1} << 47);
    };
    for (TensorDesc* t : {&b.forward.k, &b.forward.v, &b.dk, &b.dv}) {
      place(t, keys);
    }
    for (TensorDesc* t : {&b.forward.q, &b.forward.out, &b.dout, &b.dq}) {
      place(t, t->shape[1]);
    }
    b.forward.lse.shape[2] = heads;
    flashcore::bhsd_strides(b.forward.lse.shape, b.forward.lse.stride);
    b.forward.lse.address = (address += uint64_t{1} << 47);
    return b;
  };
  // 2^14 key blocks x 2 sequences x 2^16 kv heads: 2^31 blocks, one past the grid's x.
  s = plan(with_heads(65536, int64_t{1} << 20), l4);
  expect(s.code == Code::IndexOverflow && s.field == Field::WorkUnits &&
             s.values[0] == int64_t{1} << 31 && s.values[1] == INT32_MAX,
         "backward over 2^31 key blocks: " + s.message);
  // 70000 kv heads plan (the grid's y and z axes, which held kv heads and sequences before
  // session 66, end at 65535).
  s = plan(with_heads(70000, 130), l4);
  expect(s.ok(), "backward with 70000 kv heads: " + s.message);
}

int main() {
  valid_call_passes();
  negative_sizes_and_strides();
  extents_that_overflow();
  addresses_and_locations();
  overlapping_outputs();
  paged_cache();
  score_modifiers();
  alibi_slopes();
  additive_bias();
  no_allocation_on_the_hot_path();
  scales();
  heads_and_head_dims();
  planning();
  planning_sm90();
  merging();
  variable_lengths();
  key_splits();
  sequence_key_splits();
  sequence_walk_order();
  last_wave_in_pieces();
  backward();
  if (failures != 0) {
    std::printf("core_test: %d check(s) FAILED\n", failures);
    return 1;
  }
  std::printf("core_test: all checks passed\n");
  return 0;
}
