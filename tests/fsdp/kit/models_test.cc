// fsdp/kit/models.h: the GPT's and the MLP's loss gradients against finite differences,
// initialisation, a few training steps, and (hidden, [.bench]) a timing of one step.
#include "fsdp/kit/models.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/fsdp/kit/gradcheck.h"

namespace weft::kit {
namespace {

const GptConfig kTiny{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};

std::vector<int32_t> random_ids(size_t n, int32_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (auto& v : out) v = pick(rng);
  return out;
}

// Parameters random enough that every path carries gradient (init_gpt's 0.02 leaves most of
// them near zero, where finite differences check little).
void randomize(Module& m, std::mt19937& rng) {
  for (auto& [name, p] : m.named_parameters()) {
    const bool ln_weight = name.find("ln_") != std::string::npos && p->name == "weight";
    const Tensor r = test::randn(p->shape, rng, 0.3f, ln_weight ? 1.0f : 0.0f);
    std::copy(r.f32(), r.f32() + r.numel(), p->data.f32());
  }
}

TEST_CASE("the GPT's loss gradient matches finite differences for a sample of every tensor",
          "[kit][models][gpt]") {
  std::mt19937 rng(20);
  GPT gpt(kTiny);
  randomize(gpt, rng);
  const int B = 2, T = 5;
  const auto tokens = random_ids(B * T, 11, rng);
  auto targets = random_ids(B * T, 11, rng);
  const float loss0 = gpt.forward_loss(tokens, targets, B, T);
  CHECK(std::isfinite(loss0));
  CHECK(gpt.logits().shape() == std::vector<int64_t>{B, T, 11});
  gpt.backward_loss();
  const auto loss = [&] { return static_cast<double>(gpt.forward_loss(tokens, targets, B, T)); };
  int bad = 0, tensors = 0;
  for (auto& [name, p] : gpt.named_parameters()) {
    REQUIRE(p->grad.defined());
    bad += test::check_entries(name, p->data.f32(), p->grad.f32(), p->data.numel(), loss,
                               {.h = 1e-2, .atol = 2e-4, .rtol = 2e-2}, 8, rng);
    ++tensors;
  }
  // The used rows of wte carry gradient; check one of them fully.
  Parameter& wte = gpt.transformer.wte.weight();
  bad +=
      test::check_entries("wte row", wte.data.f32() + tokens[0] * 8, wte.grad.f32() + tokens[0] * 8,
                          8, loss, {.h = 1e-2, .atol = 2e-4, .rtol = 2e-2}, 8, rng);
  CHECK(tensors == 29);
  CHECK(bad == 0);
}

TEST_CASE("targets of -1 are ignored by the GPT's loss, as nanoGPT's", "[kit][models][gpt]") {
  std::mt19937 rng(21);
  GPT gpt(kTiny);
  init_gpt(gpt, 3);
  const auto tokens = random_ids(10, 11, rng);
  auto targets = random_ids(10, 11, rng);
  const float all = gpt.forward_loss(tokens, targets, 2, 5);
  gpt.backward_loss();
  targets[3] = -1;
  const float some = gpt.forward_loss(tokens, targets, 2, 5);
  gpt.backward_loss();
  CHECK(std::isfinite(some));
  CHECK(some != all);
  CHECK_THROWS_AS(gpt.forward_loss(tokens, targets, 2, 9), std::invalid_argument);  // T > 8
}

TEST_CASE("the MLP's loss gradient matches finite differences", "[kit][models][mlp]") {
  std::mt19937 rng(22);
  MlpModel mlp({16, 64, 64, 8});
  REQUIRE(mlp.children().size() == 5);
  CHECK(mlp.named_parameters()[2].first == "2.weight");
  CHECK(mlp.linear(2).weight().shape == std::vector<int64_t>{8, 64});
  for (auto& [name, p] : mlp.named_parameters()) {
    const Tensor r = test::randn(p->shape, rng, 0.25f);
    std::copy(r.f32(), r.f32() + r.numel(), p->data.f32());
  }
  const Tensor x = test::randn({6, 16}, rng);
  const auto targets = random_ids(6, 8, rng);
  mlp.forward_loss(x, targets);
  mlp.backward_loss();
  const auto loss = [&] { return static_cast<double>(mlp.forward_loss(x, targets)); };
  int bad = 0;
  for (auto& [name, p] : mlp.named_parameters())
    bad += test::check_entries(name, p->data.f32(), p->grad.f32(), p->data.numel(), loss,
                               {.h = 1e-2, .atol = 2e-4, .rtol = 2e-2}, 12, rng);
  CHECK(bad == 0);
}

double std_of(const Tensor& t) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s += t.item(i);
    s2 += double{t.item(i)} * t.item(i);
  }
  const double m = s / t.numel();
  return std::sqrt(s2 / t.numel() - m * m);
}

TEST_CASE("init_gpt follows nanoGPT's rule and each tensor depends only on seed and name",
          "[kit][models][init]") {
  const GptConfig cfg{.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 64};
  GPT a(cfg), b(cfg), c(cfg);
  init_gpt(a, 7);
  init_gpt(b, 7);
  init_gpt(c, 8);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(pa[i].second->data.to_vector() == pb[i].second->data.to_vector());
  }
  Block& blk = a.transformer.block(1);
  CHECK(std_of(blk.attn.c_attn.weight().data) == Approx(0.02).epsilon(0.05));
  CHECK(std_of(blk.mlp.c_fc.weight().data) == Approx(0.02).epsilon(0.05));
  CHECK(std_of(a.lm_head.weight().data) == Approx(0.02).epsilon(0.05));
  CHECK(std_of(a.transformer.wte.weight().data) == Approx(0.02).epsilon(0.05));
  CHECK(std_of(blk.mlp.c_proj.weight().data) == Approx(0.01).epsilon(0.05));  // 0.02/sqrt(4)
  CHECK(std_of(blk.attn.c_proj.weight().data) == Approx(0.01).epsilon(0.1));
  CHECK(blk.attn.c_attn.bias()->data.to_vector() == std::vector<float>(192, 0.0f));
  CHECK(blk.ln_1.weight().data.to_vector() == std::vector<float>(64, 1.0f));
  CHECK(a.transformer.ln_f.bias().data.to_vector() == std::vector<float>(64, 0.0f));
  CHECK(pa[0].second->data.to_vector() != pc[0].second->data.to_vector());
  // Different names draw different values; the same name the same, whatever else the model has.
  CHECK(blk.ln_1.weight().data.to_vector() ==
        a.transformer.block(0).ln_1.weight().data.to_vector());
  CHECK(a.transformer.block(0).mlp.c_fc.weight().data.to_vector() !=
        blk.mlp.c_fc.weight().data.to_vector());
  GptConfig deeper = cfg;
  deeper.n_layer = 3;
  GPT d(deeper);
  init_gpt(d, 7);
  CHECK(d.transformer.block(0).mlp.c_fc.weight().data.to_vector() ==
        a.transformer.block(0).mlp.c_fc.weight().data.to_vector());

  MlpModel mlp({32, 64, 4});
  init_mlp(mlp, 1);
  CHECK(std_of(mlp.linear(0).weight().data) == Approx(0.02).epsilon(0.1));
  CHECK(mlp.linear(1).bias()->data.to_vector() == std::vector<float>(4, 0.0f));
}

TEST_CASE("a few SGD steps drive the tiny GPT's loss on one batch down", "[kit][models][gpt]") {
  std::mt19937 rng(23);
  GPT gpt(kTiny);
  init_gpt(gpt, 4);
  const auto tokens = random_ids(10, 11, rng), targets = random_ids(10, 11, rng);
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    gpt.zero_grad();
    last = gpt.forward_loss(tokens, targets, 2, 5);
    if (step == 0) first = last;
    gpt.backward_loss();
    for (auto& [name, p] : gpt.named_parameters())
      for (int64_t i = 0; i < p->data.numel(); ++i) p->data.f32()[i] -= 1.0f * p->grad.f32()[i];
  }
  CHECK(first == Approx(std::log(11.0)).epsilon(0.02));  // near-uniform at init
  CHECK(last < 0.5f * first);
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Wall time on a shared machine says little; this thread's CPU time is what the step costs.
TEST_CASE("one GPT step (n_layer 4, n_embd 128, B 8, T 64) takes", "[.bench][kit]") {
  const GptConfig cfg{
      .vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  GPT gpt(cfg);
  init_gpt(gpt, 1);
  std::mt19937 rng(1);
  const int B = 8, T = 64;
  const auto tokens = random_ids(B * T, 256, rng), targets = random_ids(B * T, 256, rng);
  double fwd_best = 1e9, bwd_best = 1e9, fwd_cpu = 1e9, bwd_cpu = 1e9;
  MemoryTracker::global().reset_peaks();
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    gpt.forward_loss(tokens, targets, B, T);
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = thread_cpu_ms();
    gpt.backward_loss();
    const auto t2 = std::chrono::steady_clock::now();
    const double c2 = thread_cpu_ms();
    fwd_best = std::min(fwd_best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    bwd_best = std::min(bwd_best, std::chrono::duration<double, std::milli>(t2 - t1).count());
    fwd_cpu = std::min(fwd_cpu, c1 - c0);
    bwd_cpu = std::min(bwd_cpu, c2 - c1);
  }
  const int64_t peak = MemoryTracker::global().peak(MemKind::Activations);
  std::printf(
      "GPT n_layer 4 n_embd 128 n_head 4 vocab 256 B 8 T 64, best of 6: forward %.1f ms "
      "(thread CPU %.1f ms), backward %.1f ms (CPU %.1f ms); activations peak %.1f MiB\n",
      fwd_best, fwd_cpu, bwd_best, bwd_cpu, peak / 1048576.0);
}

}  // namespace
}  // namespace weft::kit
