// fsdp/kit/module.h through the GPT: parameter names and order, hook order, gradient
// accumulation, and the swaps FSDP makes (parameter data as views, bfloat16 data, grads as views).
#include "fsdp/kit/module.h"

#include <functional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fsdp/kit/layers.h"
#include "fsdp/kit/models.h"
#include "tests/fsdp/kit/gradcheck.h"

namespace weft::kit {
namespace {

constexpr MemKind kAct = MemKind::Activations;

const GptConfig kTiny{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};

std::vector<int32_t> tokens_of(int n, int vocab, int salt) {
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = (i * 7 + salt) % vocab;
  return out;
}

TEST_CASE("a 2-layer GPT names its parameters as nanoGPT's state_dict, in order, with shapes",
          "[kit][module][gpt]") {
  GPT gpt(kTiny);
  const int64_t C = 8, V = 11;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expect = {
      {"transformer.wte.weight", {V, C}}, {"transformer.wpe.weight", {8, C}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    expect.insert(expect.end(), {{h + "ln_1.weight", {C}},
                                 {h + "ln_1.bias", {C}},
                                 {h + "attn.c_attn.weight", {3 * C, C}},
                                 {h + "attn.c_attn.bias", {3 * C}},
                                 {h + "attn.c_proj.weight", {C, C}},
                                 {h + "attn.c_proj.bias", {C}},
                                 {h + "ln_2.weight", {C}},
                                 {h + "ln_2.bias", {C}},
                                 {h + "mlp.c_fc.weight", {4 * C, C}},
                                 {h + "mlp.c_fc.bias", {4 * C}},
                                 {h + "mlp.c_proj.weight", {C, 4 * C}},
                                 {h + "mlp.c_proj.bias", {C}}});
  }
  expect.insert(expect.end(), {{"transformer.ln_f.weight", {C}},
                               {"transformer.ln_f.bias", {C}},
                               {"lm_head.weight", {V, C}}});
  const auto named = gpt.named_parameters();
  REQUIRE(named.size() == expect.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    INFO("parameter " << i);
    CHECK(named[i].first == expect[i].first);
    CHECK(named[i].second->shape == expect[i].second);
    CHECK(named[i].second->data.shape() == expect[i].second);
    CHECK(named[i].second->data.kind() == MemKind::Params);
    CHECK_FALSE(named[i].second->grad.defined());
  }
  // Module paths and types.
  const auto mods = gpt.named_modules();
  CHECK(mods[0].first == "");
  CHECK(mods[1].first == "transformer");
  CHECK(mods[4].first == "transformer.h");
  CHECK(mods[5].first == "transformer.h.0");
  CHECK(std::string(mods[5].second->type_name()) == "Block");
  CHECK(mods.back().first == "lm_head");
  CHECK(&gpt.transformer.block(1) == mods[4].second->children()[1].second);
}

// The order hooks must fire in: forward visits a module's pre hooks, its children in order, then
// its post hooks; backward the same with the children reversed.
void expected_events(Module& m, const std::string& path, bool backward,
                     std::vector<std::string>& out) {
  const char* pre = backward ? "pre_backward " : "pre_forward ";
  const char* post = backward ? "post_backward " : "post_forward ";
  out.push_back(pre + path);
  auto kids = m.children();
  if (backward) std::reverse(kids.begin(), kids.end());
  for (auto& [name, child] : kids)
    expected_events(*child, path.empty() ? name : path + "." + name, backward, out);
  out.push_back(post + path);
}

TEST_CASE("hooks of every GPT module fire in forward order, then in reverse in backward",
          "[kit][module][hooks]") {
  GPT gpt(kTiny);
  init_gpt(gpt, 1);
  std::vector<std::string> events;
  for (auto& [path, m] : gpt.named_modules()) {
    const std::string p = path;
    m->add_pre_forward_hook([&events, p](Module&) { events.push_back("pre_forward " + p); });
    m->add_post_forward_hook([&events, p](Module&) { events.push_back("post_forward " + p); });
    m->add_pre_backward_hook([&events, p](Module&) { events.push_back("pre_backward " + p); });
    m->add_post_backward_hook([&events, p](Module&) { events.push_back("post_backward " + p); });
  }
  // Hooks receive the module they are attached to, and run in the order added.
  int order = 0;
  gpt.lm_head.add_pre_forward_hook([&](Module& m) {
    CHECK(&m == &gpt.lm_head);
    CHECK(order++ == 0);
  });
  std::vector<std::string> expect;
  expected_events(gpt, "", false, expect);
  gpt.forward_loss(tokens_of(10, 11, 1), tokens_of(10, 11, 2), 2, 5);
  CHECK(events == expect);
  CHECK(order == 1);
  events.clear();
  expect.clear();
  expected_events(gpt, "", true, expect);
  gpt.backward_loss();
  CHECK(events == expect);
  CHECK(expect.size() == 2 * gpt.named_modules().size());
}

TEST_CASE("backward adds into .grad and zero_grad empties it", "[kit][module]") {
  GPT gpt(kTiny);
  init_gpt(gpt, 2);
  const auto tokens = tokens_of(10, 11, 3), targets = tokens_of(10, 11, 4);
  gpt.forward_loss(tokens, targets, 2, 5);
  gpt.backward_loss();
  std::vector<std::vector<float>> once;
  for (auto& [name, p] : gpt.named_parameters()) {
    REQUIRE(p->grad.defined());
    CHECK(p->grad.dtype() == DType::Float32);
    CHECK(p->grad.kind() == MemKind::Grads);
    once.push_back(p->grad.to_vector());
  }
  gpt.forward_loss(tokens, targets, 2, 5);
  gpt.backward_loss();
  size_t i = 0;
  for (auto& [name, p] : gpt.named_parameters()) {
    INFO(name);
    for (int64_t j = 0; j < p->grad.numel(); ++j)
      REQUIRE(p->grad.item(j) == Approx(2 * once[i][j]).margin(1e-7));
    ++i;
  }
  gpt.zero_grad();
  for (auto& [name, p] : gpt.named_parameters()) CHECK_FALSE(p->grad.defined());
  CHECK_THROWS_AS(gpt.backward_loss(), std::invalid_argument);  // released by the last one
}

TEST_CASE(
    "parameters work as views of a flat buffer, grads land in views, and empty data "
    "is refused",
    "[kit][module][fsdp]") {
  std::mt19937 rng(5);
  Linear ref(3, 2);
  Linear lin(3, 2);
  const Tensor w = test::randn({2, 3}, rng), b = test::randn({2}, rng);
  std::copy(w.f32(), w.f32() + 6, ref.weight().data.f32());
  std::copy(b.f32(), b.f32() + 2, ref.bias()->data.f32());
  // FSDP's unsharded layout: one flat buffer, each parameter a view into it.
  Tensor flat = Tensor::zeros({8}, DType::Float32, MemKind::Params);
  std::copy(w.f32(), w.f32() + 6, flat.f32());
  std::copy(b.f32(), b.f32() + 2, flat.f32() + 6);
  lin.weight().data = flat.view(0, {2, 3});
  lin.bias()->data = flat.view(6, {2});
  Tensor flat_grad = Tensor::zeros({8}, DType::Float32, MemKind::Grads);
  lin.weight().grad = flat_grad.view(0, {2, 3});
  lin.bias()->grad = flat_grad.view(6, {2});

  const Tensor x = test::randn({4, 3}, rng), dy = test::randn({4, 2}, rng);
  CHECK(lin.call_forward(x).to_vector() == ref.call_forward(x).to_vector());
  CHECK(lin.call_backward(dy).to_vector() == ref.call_backward(dy).to_vector());
  for (int j = 0; j < 6; ++j) CHECK(flat_grad.item(j) == ref.weight().grad.item(j));
  CHECK(flat_grad.item(7) == ref.bias()->grad.item(1));

  lin.weight().data = Tensor();  // resharded
  CHECK_THROWS_AS(lin.call_forward(x), std::logic_error);
  lin.weight().grad = Tensor::zeros({5}, DType::Float32, MemKind::Grads);
  CHECK_THROWS_AS(lin.weight().grad_for_accumulate(), std::invalid_argument);
}

TEST_CASE(
    "a Linear with bfloat16 weights computes with their float32 values and keeps float32 "
    "grads",
    "[kit][module][bf16]") {
  std::mt19937 rng(6);
  Linear ref(5, 3);
  Linear lin(5, 3);
  const Tensor w = test::randn({3, 5}, rng), b = test::randn({3}, rng);
  lin.weight().data = w.to(DType::BFloat16, MemKind::Params);
  lin.bias()->data = b.to(DType::BFloat16, MemKind::Params);
  // The reference holds the bfloat16 values exactly, in float32.
  const Tensor w_rounded = lin.weight().data.to(DType::Float32, MemKind::Other);
  const Tensor b_rounded = lin.bias()->data.to(DType::Float32, MemKind::Other);
  std::copy(w_rounded.f32(), w_rounded.f32() + 15, ref.weight().data.f32());
  std::copy(b_rounded.f32(), b_rounded.f32() + 3, ref.bias()->data.f32());
  CHECK(w_rounded.to_vector() != w.to_vector());  // rounding did something

  MemoryTracker& mt = MemoryTracker::global();
  const int64_t act0 = mt.current(MemKind::Activations);
  const Parameter& p = lin.weight();
  {
    const Tensor copy = p.data_f32();
    CHECK(copy.dtype() == DType::Float32);
    CHECK(mt.current(MemKind::Activations) == act0 + 60);  // the float32 copy counts
  }
  CHECK(mt.current(MemKind::Activations) == act0);

  const Tensor x = test::randn({2, 5}, rng), dy = test::randn({2, 3}, rng);
  CHECK(lin.call_forward(x).to_vector() == ref.call_forward(x).to_vector());
  CHECK(lin.call_backward(dy).to_vector() == ref.call_backward(dy).to_vector());
  REQUIRE(lin.weight().grad.dtype() == DType::Float32);
  CHECK(lin.weight().grad.shape() == std::vector<int64_t>{3, 5});
  CHECK(lin.weight().grad.to_vector() == ref.weight().grad.to_vector());
  CHECK(lin.bias()->grad.to_vector() == ref.bias()->grad.to_vector());
  CHECK(mt.current(MemKind::Activations) == act0);  // nothing of the step stays behind
}

TEST_CASE("call_forward upcasts its input; the output and grad transforms run at the boundary",
          "[kit][module]") {
  Linear a(3, 2), b(3, 2);
  for (Linear* l : {&a, &b}) {
    float* w = l->weight().data.f32();
    for (int i = 0; i < 6; ++i) w[i] = 0.25f * float(i) - 0.6f;
    l->bias()->data.fill(0.125f);
  }
  const Tensor x = Tensor::from({2, 3}, {0.1f, -0.7f, 1.3f, 2.2f, 0.01f, -0.4f}, kAct);
  // A bfloat16 input computes as its float32 value.
  const Tensor rounded = x.to(DType::BFloat16, kAct).to(DType::Float32, kAct);
  const Tensor expected = a.call_forward(rounded);
  std::vector<std::string> events;
  b.add_post_forward_hook([&](Module&) { events.push_back("post_forward"); });
  b.add_pre_backward_hook([&](Module&) { events.push_back("pre_backward"); });
  b.set_output_transform([&](const Tensor& y) {
    events.push_back("output");
    return y.to(DType::BFloat16, kAct);
  });
  b.set_grad_output_transform([&](const Tensor& g) {
    events.push_back("grad");
    Tensor doubled = g.clone(kAct);
    for (int64_t i = 0; i < doubled.numel(); ++i) doubled.f32()[i] *= 2;
    return doubled;
  });
  const Tensor y = b.call_forward(x.to(DType::BFloat16, kAct));
  REQUIRE(y.dtype() == DType::BFloat16);
  for (int64_t i = 0; i < y.numel(); ++i) {
    CHECK(y.item(i) == bf16_to_float(float_to_bf16(expected.f32()[i])));
  }
  // The transformed gradient is what backward sees: twice the gradient of a plain call.
  const Tensor ones = Tensor::from({2, 2}, {1, 1, 1, 1}, kAct);
  a.call_backward(ones);
  b.call_backward(ones);
  for (int64_t i = 0; i < 6; ++i) CHECK(b.weight().grad.item(i) == 2 * a.weight().grad.item(i));
  CHECK(events == std::vector<std::string>{"post_forward", "output", "grad", "pre_backward"});
}

TEST_CASE("containers without forward refuse it, naming their type", "[kit][module]") {
  GPT gpt(kTiny);
  const Tensor x = Tensor::zeros({1}, DType::Float32, MemKind::Other);
  try {
    gpt.call_forward(x);
    FAIL("no throw");
  } catch (const std::logic_error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("GPT"));
  }
}

}  // namespace
}  // namespace weft::kit
