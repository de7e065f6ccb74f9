// fsdp/train/optim.h: SGD and AdamW against scalar formulas worked in double, and bit for bit
// against PyTorch 2.6.
#include "fsdp/train/optim.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

namespace weft::train {
namespace {

// ------------------------------------------------------------------------------------------------
// Against formulas in double. Each reference applies the optimizer's textbook update, written out
// here, to a few elements over three steps; float32 arithmetic stays within a few ulps of it.

void check_close(const std::vector<float>& actual, const std::vector<double>& expected,
                 const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO(what << " element " << i << ": got " << actual[i] << ", expected " << expected[i]);
    CHECK(std::fabs(actual[i] - expected[i]) <= 1e-6 * std::fabs(expected[i]) + 1e-9);
  }
}

const std::vector<float> kParam0 = {0.5f, -1.25f, 2.0f, 0.0f, 3.0e-3f};
// Gradients of steps 1, 2, 3.
const std::vector<std::vector<float>> kGrads = {{0.1f, -0.2f, 0.3f, 1.5f, -4.0e-4f},
                                                {-0.05f, 0.25f, 0.3f, -1.0f, 0.0f},
                                                {0.2f, 0.01f, -0.6f, 0.5f, 2.0e-3f}};

TEST_CASE("AdamW step 1 moves each weight by lr * g / (|g| + eps) after decoupled decay",
          "[fsdp][optim]") {
  // At t = 1 the bias corrections cancel the betas: m / (1 - beta1) = g and
  // sqrt(v / (1 - beta2)) = |g|, whatever the betas.
  const AdamW adamw{.lr = 0.01, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.1};
  std::vector<float> param = kParam0;
  OptimizerState state;
  Optimizer(adamw).step(param, kGrads[0], state);
  std::vector<double> expected;
  for (size_t i = 0; i < param.size(); ++i) {
    const double g = kGrads[0][i];
    expected.push_back(kParam0[i] * (1 - 0.01 * 0.1) - 0.01 * g / (std::fabs(g) + 1e-3));
  }
  check_close(param, expected, "param after step 1");
  CHECK(state.step == 1);
  REQUIRE(state.buffers.size() == 2);
  for (size_t i = 0; i < param.size(); ++i) {
    CHECK(state.buffers[0][i] == Approx(0.15 * kGrads[0][i]).epsilon(1e-6));
    CHECK(state.buffers[1][i] ==
          Approx(0.01 * kGrads[0][i] * kGrads[0][i]).epsilon(1e-6).margin(1e-12));
  }
}

TEST_CASE("AdamW steps 1 to 3 follow m, v, bias corrections and weight decay worked in double",
          "[fsdp][optim]") {
  const double lr = 0.02, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.05;
  const Optimizer opt =
      AdamW{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd};
  std::vector<float> param = kParam0;
  OptimizerState state;
  std::vector<double> p(kParam0.begin(), kParam0.end()), m(p.size(), 0.0), v(p.size(), 0.0);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<float>& g = kGrads[t - 1];
    opt.step(param, g, state);
    const double bias_correction1 = 1 - std::pow(beta1, t);
    const double bias_correction2 = 1 - std::pow(beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double m_hat = m[i] / bias_correction1;
      const double v_hat = v[i] / bias_correction2;
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    check_close(param, p, "param after step " + std::to_string(t));
    check_close(state.buffers[0], m, "exp_avg after step " + std::to_string(t));
    check_close(state.buffers[1], v, "exp_avg_sq after step " + std::to_string(t));
    CHECK(state.step == t);
  }
}

TEST_CASE("AdamW with weight_decay 0 and beta1 above 0.5 matches the double formulas",
          "[fsdp][optim]") {
  // beta1 = 0.3 makes lerp's weight 1 - beta1 = 0.7 >= 0.5: PyTorch's lerp then computes from the
  // far end, end - (end - self) * (1 - weight).
  const double lr = 0.1, beta1 = 0.3, beta2 = 0.9, eps = 1e-6;
  const Optimizer opt =
      AdamW{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = 0};
  std::vector<float> param = kParam0;
  OptimizerState state;
  std::vector<double> p(kParam0.begin(), kParam0.end()), m(p.size(), 0.0), v(p.size(), 0.0);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<float>& g = kGrads[t - 1];
    opt.step(param, g, state);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      p[i] -= lr * (m[i] / (1 - std::pow(beta1, t))) /
              (std::sqrt(v[i] / (1 - std::pow(beta2, t))) + eps);
    }
    check_close(param, p, "param after step " + std::to_string(t));
    check_close(state.buffers[0], m, "exp_avg after step " + std::to_string(t));
  }
}

TEST_CASE("SGD without momentum subtracts lr * (grad + weight_decay * param)", "[fsdp][optim]") {
  const Optimizer opt = SGD{.lr = 0.1, .weight_decay = 0.01};
  CHECK(opt.state_names().empty());
  CHECK(opt.state_bytes(1000) == 0);
  std::vector<float> param = kParam0;
  OptimizerState state;
  std::vector<double> p(kParam0.begin(), kParam0.end());
  for (int t = 1; t <= 3; ++t) {
    opt.step(param, kGrads[t - 1], state);
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1 * (kGrads[t - 1][i] + 0.01 * p[i]);
    check_close(param, p, "param after step " + std::to_string(t));
  }
  CHECK(state.step == 3);
  CHECK(state.buffers.empty());
}

TEST_CASE("SGD with momentum starts its buffer at the first gradient, then buf = mu * buf + g",
          "[fsdp][optim]") {
  const Optimizer opt = SGD{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1};
  REQUIRE(opt.state_names().size() == 1);
  CHECK(opt.state_names()[0] == "momentum_buffer");
  CHECK(opt.state_bytes(1000) == 4000);
  std::vector<float> param = kParam0;
  OptimizerState state;
  std::vector<double> p(kParam0.begin(), kParam0.end()), buf(p.size(), 0.0);
  for (int t = 1; t <= 3; ++t) {
    opt.step(param, kGrads[t - 1], state);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = kGrads[t - 1][i] + 0.1 * p[i];
      buf[i] = t == 1 ? g : 0.9 * buf[i] + g;
      p[i] -= 0.05 * buf[i];
    }
    check_close(param, p, "param after step " + std::to_string(t));
    check_close(state.buffers[0], buf, "momentum_buffer after step " + std::to_string(t));
  }
}

// ------------------------------------------------------------------------------------------------
// Bit for bit against PyTorch. Produced with PyTorch 2.6.0 (Debian's python3-torch, CPU, AVX-512
// kernels; AVX2 kernels, ATEN_CPU_CAPABILITY=avx2, gave the same bits) through
// ../shared/tools/pytorch-peer/pytorch-python, by this script:
//
//   import struct, torch
//   torch.set_num_threads(1)
//   def val(i, s, salt):  # 24-bit values in [-1, 1), exact in float32
//       x = (i * 2654435761 + s * 40503 + salt * 97531) % (1 << 32)
//       return ((x >> 8) / float(1 << 23)) - 1.0
//   p = torch.tensor([val(i, 0, 1) for i in range(40)], dtype=torch.float32, requires_grad=True)
//   opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
//   for s in range(3):
//       p.grad = torch.tensor([val(i, s + 1, 2) for i in range(40)], dtype=torch.float32)
//       opt.step()
//   # printed: the bits (struct.pack('<f')) of p, then of opt.state[p][name] per state name
//
// and likewise for each optimizer below. 40 elements: PyTorch's CPU kernels run their vector loop
// over the first 32 (2 x 16 lanes) and a scalar loop over the rest, so both paths are covered.
// The NO AVX build of the kernels (ATEN_CPU_CAPABILITY=default) rounds differently: it fuses no
// multiply-add.

float val(uint64_t i, uint64_t s, uint64_t salt) {
  const uint64_t x = (i * 2654435761ull + s * 40503ull + salt * 97531ull) % (1ull << 32);
  return static_cast<float>(static_cast<double>(x >> 8) / static_cast<double>(1 << 23) - 1.0);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Runs `opt` for three steps on the inputs above and compares param and state with `expected`
// (param first, then the state buffers in state_names() order).
template <size_t Rows>
void check_against_pytorch(const Optimizer& opt, const uint32_t (&expected)[Rows][40]) {
  constexpr int kN = 40;
  std::vector<float> param(kN);
  for (int i = 0; i < kN; ++i) param[i] = val(i, 0, 1);
  OptimizerState state;
  for (int s = 0; s < 3; ++s) {
    std::vector<float> grad(kN);
    for (int i = 0; i < kN; ++i) grad[i] = val(i, s + 1, 2);
    opt.step(param, grad, state);
  }
  REQUIRE(state.buffers.size() + 1 == Rows);
  for (size_t row = 0; row < Rows; ++row) {
    const std::vector<float>& actual = row == 0 ? param : state.buffers[row - 1];
    const std::string name = row == 0 ? "param" : std::string(opt.state_names()[row - 1]);
    for (int i = 0; i < kN; ++i) {
      INFO(opt.name() << " " << name << "[" << i << "]: weft " << actual[i] << " (0x" << std::hex
                      << bits(actual[i]) << "), PyTorch " << from_bits(expected[row][i]) << " (0x"
                      << expected[row][i] << ")");
      CHECK(bits(actual[i]) == expected[row][i]);
    }
  }
}

// param, exp_avg, exp_avg_sq
constexpr uint32_t kAdamWDefault[3][40] = {
    {0xbf7f3675, 0x3e6eb367, 0xbf06597b, 0x3f3489d4, 0xbd57c836, 0xbf510c0e, 0x3ed3ae82,
     0xbeb05e2d, 0x3f62b43a, 0x3df9256e, 0xbf22e1aa, 0x3f1801a7, 0xbe2812bb, 0xbf6d943d,
     0x3e9a9e27, 0xbee96e84, 0x3f462c0e, 0x3c271f7f, 0xbf3f69d5, 0x3ef6f2f5, 0xbe8d19ba,
     0x3f745672, 0x3e431b9d, 0xbf113f70, 0x3f29a3e0, 0xbdc313ad, 0xbf5bf202, 0x3ebde299,
     0xbec62a12, 0x3f57ce47, 0x3da1f5c8, 0xbf2dc79c, 0x3f0d1bb4, 0xbe53aa8d, 0xbf787a2f,
     0x3e84d241, 0xbeff3a6e, 0x3f3b461a, 0xbcd807a2, 0xbf4a4fca},
    {0xbe8abbe6, 0x3d831778, 0xbe1272c8, 0x3e4490c1, 0xbc76dc26, 0xbe636c45, 0x3de72e86,
     0xbdc0ce80, 0x3e769c48, 0x3d0a7713, 0xbe3160be, 0x3e25a2cb, 0xbd396ee7, 0xbe812d1e,
     0x3da95299, 0xbdfeaa70, 0x3e57ae52, 0x3b6bf39c, 0xbe504eb5, 0x3e06b4d3, 0xbd9a935f,
     0x3e84dced, 0x3d56ed56, 0xbe1e432d, 0x3e38c05b, 0xbcd9f146, 0xbe6f3cac, 0x3dcf8dbb,
     0xbdd86f4e, 0x3e6acbe3, 0x3cb66afa, 0xbe3d3124, 0x3e19d265, 0xbd68b07c, 0xbe871551,
     0x3d91b1cd, 0xbe0b259d, 0x3e4bddec, 0xbc02097f, 0xbe5c1f1b},
    {0x3b445c6a, 0x392f5227, 0x3a5ace62, 0x3ac517cc, 0x371b6f7b, 0x3b03ea8f, 0x3a084fc1,
     0x39bda11e, 0x3b1b1d1b, 0x38439896, 0x3aa07e7f, 0x3a8bf294, 0x38af677d, 0x3b2a3cc3,
     0x39923f0a, 0x3a2569f3, 0x3aed4a61, 0x350df7b0, 0x3add5849, 0x3a391faf, 0x3973c450,
     0x3b3417a1, 0x38eba1de, 0x3a7f8847, 0x3aae1d04, 0x37f24cd5, 0x3b11fa47, 0x39dbbe53,
     0x39eef45f, 0x3b0c9ba5, 0x37a9bcf2, 0x3ab695ca, 0x3a716447, 0x390a190e, 0x3b3a29a6,
     0x39588e5f, 0x3a45883b, 0x3ad401c9, 0x362c8762, 0x3af729e9},
};
// param, exp_avg, exp_avg_sq
constexpr uint32_t kAdamWCustom[3][40] = {
    {0xbf55f5a3, 0x3daaad23, 0xbebdcb1c, 0x3f0c65bc, 0x3dc151c0, 0xbf287b46, 0x3e85a003,
     0xbe45ace2, 0x3f39e017, 0xbcd8b751, 0xbef601dd, 0x3ee094b7, 0xbc7c3ae0, 0xbf4496a7,
     0x3e1ad27e, 0xbe9b0d29, 0x3f1dc4b7, 0xbe0b8464, 0xbf171c4b, 0x3ea85dfa, 0xbe003104,
     0x3f4b3f11, 0x3d299409, 0xbed343e8, 0x3f01a958, 0x3d56dfb4, 0xbf3337ac, 0x3e604e6d,
     0xbe709e6a, 0x3f2f23b3, 0xbd8c1102, 0xbf05bd51, 0x3ecb1bf1, 0xbd6ad4b2, 0xbf4f530b,
     0x3ddfc1e2, 0xbeb085f2, 0x3f130852, 0x3df663fc, 0xbf21d8b1},
    {0xbef9d2be, 0x3dec102f, 0xbe83db72, 0x3eb0fb57, 0xbcde425b, 0xbeccc3a3, 0x3e50264c,
     0xbe2d98ae, 0x3ede0a72, 0x3d7957a3, 0xbe9fb488, 0x3e952240, 0xbda6f4f4, 0xbee89cba,
     0x3e18741f, 0xbe654add, 0x3ec2315b, 0x3bd47787, 0xbebb8d9f, 0x3e729253, 0xbe0b2ca6,
     0x3eef4075, 0x3dc183e1, 0xbe8e7e85, 0x3ea65844, 0xbd4439ca, 0xbed766b5, 0x3e3ae026,
     0xbe42ded6, 0x3ed3675f, 0x3d243f0f, 0xbeaa579b, 0x3e8a7f2e, 0xbdd1813e, 0xbef33fcd,
     0x3e032df8, 0xbe7a9101, 0x3eb78e48, 0xbc6a26ac, 0xbec630b2},
    {0x3e1202a1, 0x3c025dbb, 0x3d22b32e, 0x3d928e15, 0x39e72719, 0x3dc42e45, 0x3ccab7db,
     0x3c8d0122, 0x3de6ae05, 0x3b117172, 0x3d6eae3a, 0x3d502019, 0x3b826d2a, 0x3dfd2ba4,
     0x3c597e36, 0x3cf5ff31, 0x3db071fa, 0x37d3262a, 0x3da49677, 0x3d09a7b0, 0x3c354280,
     0x3e05e9de, 0x3baf3689, 0x3d3e0240, 0x3d8177c0, 0x3ab42aec, 0x3dd917a2, 0x3ca365d7,
     0x3cb1ae84, 0x3dd11b7e, 0x3a7c6ea4, 0x3d87c448, 0x3d337eb1, 0x3bcd5f75, 0x3e0a6d51,
     0x3c21072a, 0x3d12e186, 0x3d9da512, 0x390048a6, 0x3db7c942},
};
// param, exp_avg, exp_avg_sq
constexpr uint32_t kAdamWBeta1Large[3][40] = {
    {0xbf784ef7, 0x3e530f2c, 0xbefee222, 0x3f2da1bc, 0xbcd26b49, 0xbf4a2435, 0x3ec5dd26,
     0xbea28ca9, 0x3f5bcc7d, 0x3dc1dae1, 0xbf1bf976, 0x3f111954, 0xbe0c6e6c, 0xbf66ac9b,
     0x3e8ccc54, 0xbedb9d6c, 0x3f3f4418, 0xbc89b9ca, 0xbf3881da, 0x3ee921df, 0xbe7e8fe9,
     0x3f6d6ed9, 0x3e277703, 0xbf0a571a, 0x3f22bbb2, 0xbd8bca5a, 0xbf550a3f, 0x3eb01110,
     0xbeb858b6, 0x3f50e674, 0x3d555460, 0xbf26df7e, 0x3f06334c, 0xbe380686, 0xbf7192a3,
     0x3e6e0082, 0xbef1697f, 0x3f345e0e, 0x3a232ac0, 0xbf4367e3},
    {0xbf790d8c, 0x3e6b58df, 0xbf037315, 0x3f3070af, 0xbd5d89b1, 0xbf4c21e6, 0x3ecf83b9,
     0xbead0edb, 0x3f5d5c55, 0x3df8984f, 0xbf1f3640, 0x3f14ad83, 0xbe266f24, 0xbf67e513,
     0x3e97fd61, 0xbee49537, 0x3f419928, 0x3c53f76b, 0xbf3af96d, 0x3ef1d4ab, 0xbe8abdea,
     0x3f6e84ce, 0x3e40ee0a, 0xbf0e0dc8, 0x3f25d5fc, 0xbdc39a81, 0xbf56bc9b, 0x3eba4e52,
     0xbec24446, 0x3f52c1a1, 0x3da3c2b3, 0xbf29d0f4, 0x3f0a12ce, 0xbe50d9f1, 0xbf727fc7,
     0x3e82c7f7, 0xbef9ca9e, 0x3f36fe74, 0xbce95aee, 0xbf459422},
    {0x3b445c6a, 0x392f5227, 0x3a5ace62, 0x3ac517cc, 0x371b6f7b, 0x3b03ea8f, 0x3a084fc1,
     0x39bda11e, 0x3b1b1d1b, 0x38439896, 0x3aa07e7f, 0x3a8bf294, 0x38af677d, 0x3b2a3cc3,
     0x39923f0a, 0x3a2569f3, 0x3aed4a61, 0x350df7b0, 0x3add5849, 0x3a391faf, 0x3973c450,
     0x3b3417a1, 0x38eba1de, 0x3a7f8847, 0x3aae1d04, 0x37f24cd5, 0x3b11fa47, 0x39dbbe53,
     0x39eef45f, 0x3b0c9ba5, 0x37a9bcf2, 0x3ab695ca, 0x3a716447, 0x390a190e, 0x3b3a29a6,
     0x39588e5f, 0x3a45883b, 0x3ad401c9, 0x362c8762, 0x3af729e9},
};
// param
constexpr uint32_t kSGDPlain[1][40] = {
    {0xbf3332c2, 0x3e293871, 0xbebd2ed7, 0x3efdd2e4, 0xbd1fc180, 0xbf12e1a0, 0x3e953e7c,
     0xbe791932, 0x3f1f3a92, 0x3db2a84f, 0xbee52102, 0x3ed5e0bc, 0xbdefa953, 0xbf26dab5,
     0x3e5a98a5, 0xbea47ebd, 0x3f0b417f, 0x3c16fd4d, 0xbf068993, 0x3eadee97, 0xbe47b8fe,
     0x3f2b929f, 0x3e0ab45c, 0xbecc70e7, 0x3eee90d5, 0xbd8ce8e9, 0xbf1a82a8, 0x3e85fc6d,
     0xbe8bcea3, 0x3f17998d, 0x3d6b4027, 0xbef4630c, 0x3ec69eb1, 0xbe1658c7, 0xbf2e7bba,
     0x3e3c1491, 0xbeb3c0cd, 0x3f03a078, 0xbca8a200, 0xbf0e2a9a},
};
// param, momentum_buffer
constexpr uint32_t kSGDMomentum[2][40] = {
    {0xbf378090, 0x3e2d4a24, 0xbec1b9cd, 0x3f01f632, 0xbd2393f4, 0xbf1668af, 0x3e98d4d4,
     0xbe7f141e, 0x3f230e11, 0x3db6f50c, 0xbeeaa1a1, 0x3edb0493, 0xbdf56935, 0xbf2adc99,
     0x3e5fda02, 0xbea871de, 0x3f0e9a2a, 0x3c1aadff, 0xbf09c4b7, 0x3eb21cc2, 0xbe4c8442,
     0x3f2fb209, 0x3e0e0a63, 0xbed159b1, 0x3ef44c80, 0xbd90497b, 0xbf1e38a1, 0x3e8934f0,
     0xbe8f29ef, 0x3f1b3e21, 0x3d70eaf5, 0xbefa4181, 0x3ecb64b1, 0xbe19f465, 0xbf32ac89,
     0x3e409a40, 0xbeb811c3, 0x3f06ca37, 0xbcaca708, 0xbf1194aa},
    {0xc02f076e, 0x3f2562fa, 0xbfb8c302, 0x3ff7fd57, 0xbe1bb932, 0xc00f75d2, 0x3f91d4b4,
     0xbf733f92, 0x401b9048, 0x3eaeb043, 0xbfdfc86d, 0x3fd0f7ec, 0xbee9f24a, 0xc022f888,
     0x3f559e90, 0xbfa0a536, 0x40080d91, 0x3d14d4ae, 0xc00366ec, 0x3fa9f27f, 0xbf4303fa,
     0x40279f2c, 0x3f0793b9, 0xbfc7aaa0, 0x3fe915b8, 0xbe897b1c, 0xc016e9a2, 0x3f82ed14,
     0xbf88876b, 0x40141c77, 0x3e662388, 0xbfeeb00d, 0x3fc2104c, 0xbf12c864, 0xc02a6c58,
     0x3f37cf50, 0xbfaf8cd5, 0x400099c2, 0xbda40fb5, 0xc00adabc},
};

TEST_CASE("AdamW matches PyTorch 2.6 bit for bit over 3 steps", "[fsdp][optim][pytorch]") {
  check_against_pytorch(
      AdamW{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01},
      kAdamWDefault);
  check_against_pytorch(
      AdamW{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1},
      kAdamWCustom);
  check_against_pytorch(
      AdamW{.lr = 0.01, .beta1 = 0.3, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0},
      kAdamWBeta1Large);
}

TEST_CASE("SGD matches PyTorch 2.6 bit for bit over 3 steps", "[fsdp][optim][pytorch]") {
  check_against_pytorch(SGD{.lr = 0.1}, kSGDPlain);
  check_against_pytorch(SGD{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}, kSGDMomentum);
}

// ------------------------------------------------------------------------------------------------
// Sharding, caller-placed state, checkpoints.

TEST_CASE("stepping two shards of a parameter equals stepping the whole", "[fsdp][optim]") {
  const Optimizer opt = AdamW{.lr = 0.01};
  std::vector<float> whole(40), sharded(40);
  for (int i = 0; i < 40; ++i) whole[i] = sharded[i] = val(i, 0, 3);
  OptimizerState whole_state, shard_state[2];
  for (int s = 0; s < 3; ++s) {
    std::vector<float> grad(40);
    for (int i = 0; i < 40; ++i) grad[i] = val(i, s + 1, 4);
    opt.step(whole, grad, whole_state);
    // Rank 0 holds 0..23, rank 1 holds 24..39 (FSDP pads the last shard; the padding is not
    // given to the optimizer).
    opt.step(std::span(sharded).subspan(0, 24), std::span<const float>(grad).subspan(0, 24),
             shard_state[0]);
    opt.step(std::span(sharded).subspan(24), std::span<const float>(grad).subspan(24),
             shard_state[1]);
  }
  for (int i = 0; i < 40; ++i) {
    INFO("element " << i);
    CHECK(bits(whole[i]) == bits(sharded[i]));
  }
}

TEST_CASE("step() on caller-owned spans equals step() on an owned state", "[fsdp][optim]") {
  const Optimizer opt = AdamW{.lr = 0.01, .weight_decay = 0.1};
  CHECK(opt.name() == "adamw");
  REQUIRE(opt.state_names().size() == 2);
  CHECK(opt.state_names()[0] == "exp_avg");
  CHECK(opt.state_names()[1] == "exp_avg_sq");
  CHECK(opt.state_bytes(10) == 80);
  // The caller's memory: one block holding both moments, as an offload pool would hand it out.
  std::vector<float> pool(2 * 10, 0.0f);
  const std::span<float> buffers[2] = {std::span(pool).subspan(0, 10),
                                       std::span(pool).subspan(10, 10)};
  int64_t step = 0;
  std::vector<float> a(10), b(10);
  for (int i = 0; i < 10; ++i) a[i] = b[i] = val(i, 0, 5);
  OptimizerState owned;
  for (int s = 0; s < 2; ++s) {
    std::vector<float> grad(10);
    for (int i = 0; i < 10; ++i) grad[i] = val(i, s + 1, 6);
    opt.step(a, grad, buffers, step);
    opt.step(b, grad, owned);
  }
  CHECK(step == 2);
  CHECK(owned.bytes() == 80);
  for (int i = 0; i < 10; ++i) {
    CHECK(bits(a[i]) == bits(b[i]));
    CHECK(bits(pool[i]) == bits(owned.buffers[0][i]));
    CHECK(bits(pool[10 + i]) == bits(owned.buffers[1][i]));
  }
}

TEST_CASE("training resumed from a copied state continues exactly as without the stop",
          "[fsdp][optim]") {
  for (const Optimizer& opt :
       {Optimizer(AdamW{.lr = 0.01}), Optimizer(SGD{.lr = 0.1, .momentum = 0.5})}) {
    INFO(opt.name());
    std::vector<float> straight(8), resumed(8);
    for (int i = 0; i < 8; ++i) straight[i] = resumed[i] = val(i, 0, 7);
    OptimizerState straight_state, first_state;
    const auto grad = [](int s) {
      std::vector<float> g(8);
      for (int i = 0; i < 8; ++i) g[i] = val(i, s + 1, 8);
      return g;
    };
    for (int s = 0; s < 4; ++s) opt.step(straight, grad(s), straight_state);
    for (int s = 0; s < 2; ++s) opt.step(resumed, grad(s), first_state);
    // The checkpoint: step and buffers as plain values, loaded into a fresh state.
    OptimizerState loaded;
    loaded.step = first_state.step;
    loaded.buffers = first_state.buffers;
    for (int s = 2; s < 4; ++s) opt.step(resumed, grad(s), loaded);
    CHECK(loaded.step == 4);
    for (int i = 0; i < 8; ++i) CHECK(bits(straight[i]) == bits(resumed[i]));
  }
}

TEST_CASE("optimizers refuse mismatched lengths and state", "[fsdp][optim]") {
  std::vector<float> param(4, 1.0f), grad(3, 0.5f), good_grad(4, 0.5f);
  OptimizerState state;
  const Optimizer adamw = AdamW{.lr = 0.01};
  CHECK_THROWS_WITH(adamw.step(param, grad, state),
                    Catch::Contains("InvalidArgument") && Catch::Contains("grad 3"));
  // A state loaded for another parameter size.
  OptimizerState wrong;
  wrong.step = 1;
  wrong.buffers = {std::vector<float>(5), std::vector<float>(5)};
  CHECK_THROWS_WITH(adamw.step(param, good_grad, wrong), Catch::Contains("exp_avg 5"));
  // A state with the wrong number of buffers (an SGD checkpoint given to AdamW).
  OptimizerState sgd_state;
  sgd_state.step = 1;
  sgd_state.buffers = {std::vector<float>(4)};
  CHECK_THROWS_WITH(adamw.step(param, good_grad, sgd_state),
                    Catch::Contains("state has 1 buffers, 2 expected"));
  const Optimizer sgd = SGD{.lr = 0.1, .momentum = 0.9};
  std::vector<float> short_buffer(2);
  const std::span<float> buffers[1] = {short_buffer};
  int64_t step = 0;
  CHECK_THROWS_WITH(sgd.step(param, good_grad, buffers, step),
                    Catch::Contains("momentum_buffer has 2 elements, param 4"));
  CHECK(step == 0);
  CHECK_THROWS_AS(sgd.step(param, good_grad, std::span<const std::span<float>>(), step),
                  weft::Error);
}

TEST_CASE("set_lr changes the rate the next step uses", "[fsdp][optim]") {
  Optimizer opt = SGD{.lr = 0.1};
  CHECK(opt.name() == "sgd");
  CHECK(opt.lr() == 0.1);
  opt.set_lr(0.5);
  CHECK(opt.lr() == 0.5);
  std::vector<float> param = {1.0f};
  const std::vector<float> grad = {1.0f};
  OptimizerState state;
  opt.step(param, grad, state);
  CHECK(param[0] == 0.5f);
}

}  // namespace
}  // namespace weft::train
