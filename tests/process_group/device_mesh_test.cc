// DeviceMesh on 8 real processes over the tcp backend: which ranks each dimension's group holds
// (an all_reduce of 1 << rank sums to the bit mask of the members, checked against the slice
// computed here from the row-major layout), sub-meshes, flattening, two meshes at once, the
// number of groups made, and the argument errors.
#include "weft/device_mesh.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "tests/support/multiproc.h"

namespace weft {
namespace {

using std::chrono::seconds;

constexpr int kWorld = 8;

std::shared_ptr<ProcessGroup> join(uint16_t port, int rank, std::string backend = "") {
  ProcessGroupOptions options;
  options.backend = std::move(backend);
  options.url = fmt::format("tcp://127.0.0.1:{}", port);
  options.rank = rank;
  options.world_size = kWorld;
  options.timeout = seconds(30);
  return init_process_group(options);
}

// The members of `rank`'s slice along the axes `along` of a row-major mesh of `shape` placed by
// `layout`: the positions agreeing with rank's on every other axis. Written without DeviceMesh.
uint64_t slice_mask(const std::vector<int>& shape, const std::vector<int>& layout, int rank,
                    const std::vector<int>& along) {
  auto coord = [&](int position) {
    std::vector<int> c(shape.size());
    for (int axis = int(shape.size()) - 1; axis >= 0; --axis) {
      c[axis] = position % shape[axis];
      position /= shape[axis];
    }
    return c;
  };
  int mine = int(std::find(layout.begin(), layout.end(), rank) - layout.begin());
  uint64_t mask = 0;
  for (size_t p = 0; p < layout.size(); ++p) {
    bool same = true;
    for (size_t axis = 0; axis < shape.size(); ++axis) {
      bool free = std::find(along.begin(), along.end(), int(axis)) != along.end();
      same = same && (free || coord(int(p))[axis] == coord(mine)[axis]);
    }
    if (same) mask |= uint64_t(1) << layout[p];
  }
  return mask;
}

std::vector<int> identity() {
  std::vector<int> v(kWorld);
  for (int i = 0; i < kWorld; ++i) v[i] = i;
  return v;
}

// All-reduces (1 << world rank) over `group`, and a float vector as well, and checks both
// against the expected members.
void check_group(const std::shared_ptr<ProcessGroup>& group, int world_rank, uint64_t expected,
                 const std::string& what) {
  RANK_CHECK(group != nullptr, "{}: no group", what);
  int64_t bits = int64_t(1) << world_rank;
  group->all_reduce(Tensor::of(&bits, 1))->wait();
  RANK_CHECK(uint64_t(bits) == expected, "{}: members {:#x}, expected {:#x}", what, bits, expected);
  RANK_CHECK(group->size() == __builtin_popcountll(expected), "{}: size {}", what, group->size());
  std::vector<float> v(37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(world_rank * 100 + i);
  group->all_reduce(Tensor::of(v.data(), v.size()))->wait();
  for (size_t i = 0; i < v.size(); ++i) {
    float sum = 0;
    for (int r = 0; r < kWorld; ++r) {
      if (expected >> r & 1) sum += float(r * 100 + i);
    }
    RANK_CHECK(v[i] == sum, "{}: element {} is {}, expected {}", what, i, v[i], sum);
  }
}

// Ends a rank's part: rank 0 hosts the store and must not exit while another rank still
// connects a group through it, so every rank passes a world barrier first.
void leave(ProcessGroup& world) { world.barrier()->wait(); }

// The ranks a mask names, ascending.
std::vector<int> members(uint64_t mask) {
  std::vector<int> out;
  for (int r = 0; r < kWorld; ++r) {
    if (mask >> r & 1) out.push_back(r);
  }
  return out;
}

TEST_CASE("device mesh: 1-D over 8 ranks reuses the world group", "[device_mesh]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(kWorld, [&](int rank) {
    auto world = join(port, rank);
    auto mesh = DeviceMesh::init(DeviceKind::Cpu, {8}, {"dp"}, world);
    RANK_CHECK(world->child_groups() == 0, "{}", world->child_groups());
    RANK_CHECK(mesh.group() == world && mesh.group("dp") == world);
    RANK_CHECK(mesh.coordinate() == std::vector<int>{rank});
    RANK_CHECK(mesh.size() == 8 && mesh.size("dp") == 8 && mesh.ndim() == 1);
    RANK_CHECK(mesh.ranks() == identity());
    check_group(mesh.group(), rank, 0xff, "dp");
    leave(*world);
  });
}

TEST_CASE("device mesh: 2-D, 2x4 and 4x2, one group per dimension", "[device_mesh]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(kWorld, [&](int rank) {
    auto world = join(port, rank);
    for (std::vector<int> shape : {std::vector<int>{2, 4}, std::vector<int>{4, 2}}) {
      const uint64_t before = world->child_groups();
      auto mesh = DeviceMesh::init(DeviceKind::Cpu, shape, {"dp", "tp"}, world);
      RANK_CHECK(world->child_groups() == before + 2, "{} -> {}", before, world->child_groups());
      const std::string label = fmt::format("{}x{}", shape[0], shape[1]);
      RANK_CHECK(mesh.shape() == shape, "{}", label);
      RANK_CHECK((mesh.coordinate() == std::vector<int>{rank / shape[1], rank % shape[1]}),
                 "{}: {}", label, mesh.describe());
      RANK_CHECK(mesh.rank() == rank && mesh.size() == 8);
      for (int axis : {0, 1}) {
        const std::string name = axis == 0 ? "dp" : "tp";
        const uint64_t expected = slice_mask(shape, identity(), rank, {axis});
        check_group(mesh.group(name), rank, expected, label + " " + name);
        // The 1-D slice holds the same ranks and the same group (slicing makes none).
        DeviceMesh slice = mesh[name];
        RANK_CHECK(slice.ndim() == 1 && slice.size() == shape[axis]);
        RANK_CHECK(slice.ranks() == members(expected), "{} {}: {}", label, name, slice.describe());
        RANK_CHECK(slice.group() == mesh.group(name));
        RANK_CHECK(slice.coordinate() == std::vector<int>{mesh.coordinate()[axis]});
        RANK_CHECK(slice.group()->rank() == slice.rank(), "{} {}", label, name);
      }
      RANK_CHECK(world->child_groups() == before + 2, "slicing made groups");
    }
    leave(*world);
  });
}

TEST_CASE("device mesh: 3-D 2x2x2, sub-meshes and flattened dimensions", "[device_mesh]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(kWorld, [&](int rank) {
    auto world = join(port, rank);
    const std::vector<int> shape = {2, 2, 2};
    auto mesh = DeviceMesh::init(DeviceKind::Cpu, shape, {"dp", "cp", "tp"}, world);
    RANK_CHECK(world->child_groups() == 3, "{}", world->child_groups());
    const char* names[] = {"dp", "cp", "tp"};
    for (int axis = 0; axis < 3; ++axis) {
      check_group(mesh.group(names[axis]), rank, slice_mask(shape, identity(), rank, {axis}),
                  names[axis]);
    }
    // A 2-D sub-mesh skipping a dimension: its ranks share this rank's cp coordinate.
    DeviceMesh dp_tp = mesh[{"dp", "tp"}];
    RANK_CHECK(dp_tp.ranks() == members(slice_mask(shape, identity(), rank, {0, 2})), "{}",
               dp_tp.describe());
    RANK_CHECK((dp_tp.coordinate() == std::vector<int>{rank / 4, rank % 2}));
    RANK_CHECK(dp_tp.group("tp") == mesh.group("tp"));

    // Flattening makes one group, once per name, shared by every mesh of the tree.
    DeviceMesh dp_cp = mesh.flatten({"dp", "cp"}, "dp_cp");
    RANK_CHECK(world->child_groups() == 4, "{}", world->child_groups());
    RANK_CHECK(dp_cp.size() == 4 && dp_cp.coordinate() == std::vector<int>{rank / 2});
    check_group(dp_cp.group(), rank, slice_mask(shape, identity(), rank, {0, 1}), "dp_cp");
    RANK_CHECK(mesh.flatten({"dp", "cp"}, "dp_cp").group() == dp_cp.group());
    RANK_CHECK(mesh["dp_cp"].group() == dp_cp.group());
    RANK_CHECK(mesh.group("dp_cp") == dp_cp.group());
    RANK_CHECK((mesh[{"dp_cp", "tp"}].shape() == std::vector<int>{4, 2}));
    RANK_CHECK(world->child_groups() == 4, "cached flatten made a group");
    // The default name joins the names; a flattened non-adjacent pair is a group too.
    DeviceMesh dp_tp_flat = dp_tp.flatten({"dp", "tp"});
    RANK_CHECK(dp_tp_flat.dim_names() == std::vector<std::string>{"dp_tp"});
    check_group(dp_tp_flat.group(), rank, slice_mask(shape, identity(), rank, {0, 2}), "dp_tp");
    // Flattening every dimension of an identity layout is the parent itself.
    RANK_CHECK(mesh.flatten({"dp", "cp", "tp"}).group() == world);
    RANK_CHECK(world->child_groups() == 5, "{}", world->child_groups());
    leave(*world);
  });
}

TEST_CASE("device mesh: two meshes at once, and an explicit layout", "[device_mesh]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(kWorld, [&](int rank) {
    auto world = join(port, rank);
    auto a = DeviceMesh::init(DeviceKind::Cpu, {2, 4}, {"dp", "tp"}, world);
    // Reversed placement: position i holds rank 7 - i.
    std::vector<int> reversed = identity();
    std::reverse(reversed.begin(), reversed.end());
    auto b = DeviceMesh::from_layout(world, DeviceKind::Cpu, {4, 2}, reversed, {"x", "y"});
    RANK_CHECK(world->child_groups() == 4, "{}", world->child_groups());
    RANK_CHECK(b.ranks() == reversed);
    RANK_CHECK(b.rank() == 7 - rank);
    // Work on both meshes' groups in flight together, waited for at the end.
    int64_t bits[4];
    std::vector<std::shared_ptr<Work>> works;
    std::shared_ptr<ProcessGroup> groups[4] = {a.group("dp"), b.group("x"), a.group("tp"),
                                               b.group("y")};
    for (int i = 0; i < 4; ++i) {
      bits[i] = int64_t(1) << rank;
      works.push_back(groups[i]->all_reduce(Tensor::of(&bits[i], 1)));
    }
    wait_all(works);
    const uint64_t expected[4] = {
        slice_mask({2, 4}, identity(), rank, {0}), slice_mask({4, 2}, reversed, rank, {0}),
        slice_mask({2, 4}, identity(), rank, {1}), slice_mask({4, 2}, reversed, rank, {1})};
    for (int i = 0; i < 4; ++i) {
      RANK_CHECK(uint64_t(bits[i]) == expected[i], "group {}: {:#x} != {:#x}", i, bits[i],
                 expected[i]);
    }
    // Within b's x group, ranks follow the layout's order along x.
    RANK_CHECK(b.group("x")->rank() == b.coordinate()[0]);
    check_group(b.group("y"), rank, expected[3], "reversed y");
    leave(*world);
  });
}

// Runs `call`, which must throw Error(InvalidArgument) whose message contains `text`.
void expect_invalid(const std::function<void()>& call, const std::string& text) {
  try {
    call();
  } catch (const Error& e) {
    RANK_CHECK(e.code() == ErrorCode::InvalidArgument, "{}", e.what());
    RANK_CHECK(std::string(e.what()).find(text) != std::string::npos, "message \"{}\" lacks \"{}\"",
               e.what(), text);
    return;
  }
  throw std::runtime_error(fmt::format("no error; expected one mentioning \"{}\"", text));
}

TEST_CASE("device mesh: argument errors name the problem", "[device_mesh]") {
  const uint16_t port = test::free_port();
  test::run_ranks_ok(kWorld, [&](int rank) {
    // Host tensors only: by default (and with "tcp") a group also serves cuda tensors.
    auto world = join(port, rank, "cpu:tcp");
    expect_invalid(
        [&] {
          DeviceMesh::init(DeviceKind::Cpu, {3, 2}, {"dp", "tp"}, world);
        },
        "shape [3, 2] holds 6 ranks, the group has 8");
    expect_invalid(
        [&] {
          DeviceMesh::init(DeviceKind::Cpu, {2, 4}, {"dp", "dp"}, world);
        },
        "dimension name \"dp\" twice");
    expect_invalid(
        [&] {
          DeviceMesh::init(DeviceKind::Cpu, {2, 4}, {"dp"}, world);
        },
        "1 dimension names");
    expect_invalid(
        [&] {
          DeviceMesh::from_layout(world, DeviceKind::Cpu, {8}, {0, 1, 2, 3, 4, 5, 6, 6}, {"dp"});
        },
        "not a permutation");
    expect_invalid([&] { DeviceMesh::init(DeviceKind::Cuda, {8}, {"dp"}, world); },
                   "no backend for device kind cuda");
    RANK_CHECK(world->child_groups() == 0, "a refused mesh made groups");
    auto mesh = DeviceMesh::init(DeviceKind::Cpu, {2, 2, 2}, {"dp", "cp", "tp"}, world);
    expect_invalid([&] { (void)mesh["pp"]; }, "unknown dimension \"pp\"");
    expect_invalid([&] { (void)mesh[{"tp", "dp"}]; }, "out of order");
    expect_invalid([&] { (void)mesh[{"dp", "dp"}]; }, "\"dp\" twice");
    expect_invalid([&] { (void)mesh["dp"].group("tp"); }, "unknown dimension \"tp\"");
    expect_invalid([&] { mesh.group(); }, "has 3 dimensions");
    expect_invalid([&] { mesh.flatten({"cp", "dp"}); }, "out of order");
    expect_invalid([&] { mesh.flatten({"dp", "cp"}, "tp"); }, "already a dimension");
    // After the flatten, its name overlaps dp in a slice.
    mesh.flatten({"dp", "cp"}, "dp_cp");
    expect_invalid([&] { (void)mesh[{"dp", "dp_cp"}]; }, "out of order");
    RANK_CHECK(world->child_groups() == 4, "{}", world->child_groups());
    leave(*world);
  });
}

}  // namespace
}  // namespace weft
