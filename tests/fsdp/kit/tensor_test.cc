// fsdp/kit/tensor.h: shapes, views and copies, the memory tracker's counts and peaks, and
// bfloat16 rounding.
#include "fsdp/kit/tensor.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include <catch2/catch.hpp>

namespace weft::kit {
namespace {

TEST_CASE("tensors report shape, numel, bytes and describe themselves", "[kit][tensor]") {
  const Tensor none;
  CHECK_FALSE(none.defined());
  CHECK(none.numel() == 0);
  CHECK(none.data() == nullptr);
  CHECK(none.describe() == "undefined");

  const Tensor t = Tensor::zeros({2, 3, 4}, DType::Float32, MemKind::Other);
  CHECK(t.defined());
  CHECK(t.numel() == 24);
  CHECK(t.nbytes() == 96);
  CHECK(t.dim(0) == 2);
  CHECK(t.dim(-1) == 4);
  CHECK_THROWS_AS(t.dim(3), std::invalid_argument);
  CHECK(t.describe() == "float32[2, 3, 4]");
  CHECK(t.kind() == MemKind::Other);
  for (int64_t i = 0; i < t.numel(); ++i) CHECK(t.item(i) == 0.0f);

  const Tensor b = Tensor::zeros({5}, DType::BFloat16, MemKind::Other);
  CHECK(b.nbytes() == 10);
  CHECK(b.describe() == "bfloat16[5]");
  CHECK_THROWS_AS(b.f32(), std::logic_error);
  CHECK_THROWS_AS(t.bf16(), std::logic_error);
  CHECK(dtype_size(DType::BFloat16) == 2);
  CHECK(std::string(mem_kind_name(MemKind::Activations)) == "activations");
}

TEST_CASE("views and reshapes share memory; clone copies it", "[kit][tensor]") {
  Tensor w = Tensor::from({3, 2}, {0, 1, 2, 3, 4, 5}, MemKind::Other);
  Tensor row = w.view(2, {2});  // row 1
  CHECK(row.to_vector() == std::vector<float>{2, 3});
  row.f32()[0] = 20;
  CHECK(w.item(2) == 20);
  Tensor inner = row.view(1, {1});  // offsets add up
  CHECK(inner.item(0) == 3);
  Tensor flat = w.reshape({6});
  CHECK(flat.f32() == w.f32());
  Tensor copy = w.clone(MemKind::Other);
  copy.f32()[0] = 99;
  CHECK(w.item(0) == 0);
  CHECK_THROWS_AS(w.view(5, {2}), std::invalid_argument);
  CHECK_THROWS_AS(w.reshape({4}), std::invalid_argument);
  CHECK_THROWS_AS(Tensor::from({2}, {1, 2, 3}, MemKind::Other), std::invalid_argument);
  w.fill(1.5f);
  CHECK(flat.to_vector() == std::vector<float>(6, 1.5f));
}

TEST_CASE("the tracker counts each block under its kind until its last reference goes",
          "[kit][tensor][memory]") {
  MemoryTracker& mt = MemoryTracker::global();
  const int64_t params0 = mt.current(MemKind::Params);
  const int64_t grads0 = mt.current(MemKind::Grads);
  const int64_t total0 = mt.current_total();
  {
    Tensor p = Tensor::zeros({10, 10}, DType::Float32, MemKind::Params);
    CHECK(mt.current(MemKind::Params) == params0 + 400);
    Tensor v = p.view(10, {5, 2});  // views count nothing
    Tensor copy = p;                // nor do copies of the handle
    CHECK(mt.current(MemKind::Params) == params0 + 400);
    Tensor g = p.to(DType::BFloat16, MemKind::Grads);
    CHECK(mt.current(MemKind::Grads) == grads0 + 200);
    CHECK(mt.current_total() == total0 + 600);
    p = Tensor();
    copy = Tensor();
    CHECK(mt.current(MemKind::Params) == params0 + 400);  // v still holds the block
    v = Tensor();
    CHECK(mt.current(MemKind::Params) == params0);
  }
  CHECK(mt.current(MemKind::Grads) == grads0);
  CHECK(mt.current_total() == total0);
}

TEST_CASE("a borrowed tensor uses its owner's memory, counted while in use, never freed",
          "[kit][tensor][memory]") {
  MemoryTracker& mt = MemoryTracker::global();
  const int64_t comm0 = mt.current(MemKind::Comm);
  auto pool = std::make_shared<std::vector<float>>(16, 0.0f);
  std::weak_ptr<std::vector<float>> alive = pool;
  {
    Tensor t = Tensor::borrow(pool->data() + 4, {2, 3}, DType::Float32, MemKind::Comm, pool);
    CHECK(t.data() == pool->data() + 4);
    CHECK(mt.current(MemKind::Comm) == comm0 + 24);
    Tensor row = t.view(3, {3});  // views count nothing, as with owned blocks
    row.fill(2.0f);
    pool.reset();  // the tensors keep the owner alive
    REQUIRE(!alive.expired());
    CHECK(alive.lock()->at(7) == 2.0f);
    CHECK(alive.lock()->at(6) == 0.0f);
    t = Tensor();
    CHECK(mt.current(MemKind::Comm) == comm0 + 24);  // row still holds the block
  }
  CHECK(mt.current(MemKind::Comm) == comm0);
  CHECK(alive.expired());  // released by the owner's last holder, not by the kit's free()
  CHECK_THROWS_AS(Tensor::borrow(nullptr, {1}, DType::Float32, MemKind::Comm, nullptr),
                  std::invalid_argument);
}

TEST_CASE("global peaks follow allocations and reset to the current values", "[kit][memory]") {
  MemoryTracker& mt = MemoryTracker::global();
  mt.reset_peaks();
  const int64_t base = mt.current_total();
  const int64_t act0 = mt.current(MemKind::Activations);
  {
    Tensor a = Tensor::empty({1000}, DType::Float32, MemKind::Activations);
    Tensor b = Tensor::empty({500}, DType::Float32, MemKind::Comm);
  }
  Tensor c = Tensor::empty({100}, DType::Float32, MemKind::Activations);
  CHECK(mt.peak(MemKind::Activations) == act0 + 4000);
  CHECK(mt.peak_total() == base + 6000);
  CHECK(mt.current_total() == base + 400);
  mt.reset_peaks();
  CHECK(mt.peak(MemKind::Activations) == act0 + 400);
  CHECK(mt.peak_total() == base + 400);
}

TEST_CASE("a tracker's total peak is the peak of the sum, not the sum of peaks", "[kit][memory]") {
  MemoryTracker mt;
  mt.add(MemKind::Params, 100);
  mt.add(MemKind::Grads, 50);     // total 150
  mt.add(MemKind::Params, -100);  // total 50
  mt.add(MemKind::Grads, 75);     // total 125, grads 125
  CHECK(mt.current(MemKind::Params) == 0);
  CHECK(mt.peak(MemKind::Params) == 100);
  CHECK(mt.peak(MemKind::Grads) == 125);
  CHECK(mt.current_total() == 125);
  CHECK(mt.peak_total() == 150);
  mt.reset_peaks();
  CHECK(mt.peak(MemKind::Params) == 0);
  CHECK(mt.peak_total() == 125);
}

TEST_CASE("float to bfloat16 rounds to nearest even and keeps NaN and infinities", "[kit][bf16]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): down to even.
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 and 0x3f82 (even): up.
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
  // Just above halfway rounds up, just below rounds down.
  CHECK(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  CHECK(float_to_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80);
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
  const uint16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bf16_to_float(nan)));
  // A NaN whose payload sits only in the dropped bits stays NaN.
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  CHECK(bf16_to_float(0x3fc0) == 1.5f);
  for (uint32_t bits = 0; bits < 0x10000u; bits += 7) {
    const float f = bf16_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) REQUIRE(float_to_bf16(f) == bits);  // exact values survive
  }
}

TEST_CASE("to() converts between float32 and bfloat16 and fill rounds", "[kit][bf16]") {
  const Tensor f = Tensor::from({4}, {1.0f, 1.0f + 3 * 0x1p-8f, -0.1f, 3.0f}, MemKind::Other);
  const Tensor b = f.to(DType::BFloat16, MemKind::Other);
  REQUIRE(b.dtype() == DType::BFloat16);
  CHECK(b.bf16()[1] == 0x3f82);
  CHECK(b.item(3) == 3.0f);
  CHECK(b.item(2) == bf16_to_float(float_to_bf16(-0.1f)));
  const Tensor back = b.to(DType::Float32, MemKind::Other);
  CHECK(back.to_vector() == b.to_vector());
  Tensor z = Tensor::zeros({3}, DType::BFloat16, MemKind::Other);
  z.fill(1.0f + 3 * 0x1p-8f);
  CHECK(z.bf16()[2] == 0x3f82);
}

}  // namespace
}  // namespace weft::kit
