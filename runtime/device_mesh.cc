// runtime/device_mesh.cc: DeviceMesh (weft/device_mesh.h).
//
// The root holds the whole mesh: its shape, the parent rank at each row-major position, this
// rank's coordinates, and a table of dimensions. Entries 0 .. ndim-1 are the mesh's own, one
// axis each; flatten() appends entries covering several axes. A DeviceMesh (the root or any
// slice) is a list of table entries whose axes, concatenated, increase strictly: that invariant
// is what makes a slice's row-major order the order of root positions, so ranks() and the
// split() keys below need no other bookkeeping.
#include "weft/device_mesh.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/error.h"

namespace weft {

struct DeviceMesh::Root {
  struct Dim {
    std::string name;
    std::vector<int> axes;  // increasing
    int size = 1;
    std::shared_ptr<ProcessGroup> group;
  };

  std::shared_ptr<ProcessGroup> parent;
  DeviceKind kind = DeviceKind::Cpu;
  std::vector<int> shape;   // extent per axis
  std::vector<int> layout;  // parent rank at each row-major position
  std::vector<int> coord;   // this rank's coordinate per axis

  // Entries are never removed or changed once added; a deque keeps references to them valid as
  // flatten() appends, so readers hold the lock only while they look an entry up.
  mutable std::mutex mutex;
  std::deque<Dim> dims;

  ErrorContext context(const char* op) const {
    return ErrorContext{
        .rank = parent->rank(), .size = parent->size(), .group = parent->name(), .op = op};
  }
  [[noreturn]] void fail(const char* op, std::string_view detail) const {
    throw Error(ErrorCode::InvalidArgument, context(op), detail);
  }
  const Dim& dim(int index) const {
    std::lock_guard<std::mutex> lock(mutex);
    return dims[index];
  }
  // The entry called `name`, or -1.
  int lookup(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<std::string> out;
    for (const Dim& d : dims) out.push_back(d.name);
    return out;
  }

  std::vector<int> coordinate_of(int position) const {
    std::vector<int> c(shape.size());
    for (int axis = static_cast<int>(shape.size()) - 1; axis >= 0; --axis) {
      c[axis] = position % shape[axis];
      position /= shape[axis];
    }
    return c;
  }
  // Row-major index of coordinate `c` over `axes` (in their order).
  int index_over(const std::vector<int>& c, const std::vector<int>& axes) const {
    int index = 0;
    for (int axis : axes) index = index * shape[axis] + c[axis];
    return index;
  }
  std::vector<int> other_axes(const std::vector<int>& axes) const {
    std::vector<int> out;
    for (int axis = 0; axis < static_cast<int>(shape.size()); ++axis) {
      if (std::find(axes.begin(), axes.end(), axis) == axes.end()) out.push_back(axis);
    }
    return out;
  }

  // The group of this rank's slice along `axes`: the parent itself when that slice is the whole
  // parent in its own order, the group of an entry with the same axes when there is one, else
  // one split(). Collective over the parent (every rank takes the same branch: the table and the
  // layout are the same everywhere).
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& axes, const std::string& name) {
    std::vector<int> rest = other_axes(axes);
    int rest_size = 1;
    for (int axis : rest) rest_size *= shape[axis];
    bool identity = true;
    for (size_t i = 0; i < layout.size(); ++i) identity = identity && layout[i] == int(i);
    if (rest_size == 1 && identity) return parent;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (const Dim& d : dims) {
        if (d.axes == axes) return d.group;
      }
    }
    NewGroupOptions options;
    options.name = name;
    return parent->split(index_over(coord, rest), index_over(coord, axes), options);
  }
};

namespace {

int product(const std::vector<int>& v) {
  return std::accumulate(v.begin(), v.end(), 1, [](int a, int b) { return a * b; });
}

}  // namespace

DeviceMesh DeviceMesh::init(DeviceKind kind, std::vector<int> shape,
                            std::vector<std::string> dim_names,
                            std::shared_ptr<ProcessGroup> parent) {
  if (!parent) parent = init_process_group();
  std::vector<int> layout(parent->size());
  std::iota(layout.begin(), layout.end(), 0);
  return from_layout(std::move(parent), kind, std::move(shape), std::move(layout),
                     std::move(dim_names));
}

DeviceMesh DeviceMesh::from_layout(std::shared_ptr<ProcessGroup> parent, DeviceKind kind,
                                   std::vector<int> shape, std::vector<int> layout,
                                   std::vector<std::string> dim_names) {
  if (!parent) throw Error(ErrorCode::InvalidArgument, "DeviceMesh: parent group is null");
  auto root = std::make_shared<Root>();
  root->parent = parent;
  root->kind = kind;
  const char* op = "DeviceMesh::init";
  if (shape.empty()) root->fail(op, "shape is empty (a mesh has at least one dimension)");
  for (int extent : shape) {
    if (extent < 1) root->fail(op, fmt::format("shape {}: extent {} < 1", shape, extent));
  }
  if (product(shape) != parent->size()) {
    root->fail(op, fmt::format("shape {} holds {} ranks, the group has {}", shape, product(shape),
                               parent->size()));
  }
  if (dim_names.size() != shape.size()) {
    root->fail(op, fmt::format("{} dimension names {} for a {}-D shape {}", dim_names.size(),
                               dim_names, shape.size(), shape));
  }
  for (size_t i = 0; i < dim_names.size(); ++i) {
    if (dim_names[i].empty()) root->fail(op, fmt::format("dimension {} has an empty name", i));
    for (size_t j = 0; j < i; ++j) {
      if (dim_names[j] == dim_names[i]) {
        root->fail(op, fmt::format("dimension name \"{}\" twice in {}", dim_names[i], dim_names));
      }
    }
  }
  if (layout.size() != static_cast<size_t>(parent->size())) {
    root->fail(
        op, fmt::format("layout lists {} ranks, the group has {}", layout.size(), parent->size()));
  }
  std::vector<bool> seen(layout.size(), false);
  int position = -1;
  for (size_t i = 0; i < layout.size(); ++i) {
    int r = layout[i];
    if (r < 0 || r >= parent->size() || seen[r]) {
      root->fail(
          op, fmt::format("layout {} is not a permutation of 0..{}", layout, parent->size() - 1));
    }
    seen[r] = true;
    if (r == parent->rank()) position = static_cast<int>(i);
  }
  try {
    parent->backend_name(kind);
  } catch (const Error&) {
    root->fail(op, fmt::format("no backend for device kind {} in the group's backend map; "
                               "give one (\"{}:NAME\") when creating it",
                               device_kind_name(kind), device_kind_name(kind)));
  }
  root->shape = std::move(shape);
  root->layout = std::move(layout);
  root->coord = root->coordinate_of(position);
  // One group per dimension, in dimension order on every rank (each is collective).
  std::vector<int> dims;
  for (int axis = 0; axis < static_cast<int>(root->shape.size()); ++axis) {
    auto group = root->make_group({axis}, dim_names[axis]);
    std::lock_guard<std::mutex> lock(root->mutex);
    root->dims.push_back({dim_names[axis], {axis}, root->shape[axis], std::move(group)});
    dims.push_back(axis);
  }
  return DeviceMesh(std::move(root), std::move(dims));
}

// The entry `name` names, checked to lie within this mesh: one of its dimensions, or a
// flattened one covering only axes this mesh covers.
int DeviceMesh::find_dim(const std::string& name, const char* what) const {
  int index = root_->lookup(name);
  std::vector<int> covered;
  for (int d : dims_) {
    const auto& axes = root_->dim(d).axes;
    covered.insert(covered.end(), axes.begin(), axes.end());
  }
  bool inside = index >= 0;
  if (inside && std::find(dims_.begin(), dims_.end(), index) == dims_.end()) {
    for (int axis : root_->dim(index).axes) {
      inside = inside && std::find(covered.begin(), covered.end(), axis) != covered.end();
    }
  }
  if (!inside) {
    root_->fail(what, fmt::format("unknown dimension \"{}\" for {} (known to its root: {})", name,
                                  describe(), root_->names()));
  }
  return index;
}

DeviceMesh DeviceMesh::operator[](const std::string& dim) const {
  return (*this)[std::vector<std::string>{dim}];
}

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& names) const {
  const char* op = "DeviceMesh[]";
  if (names.empty()) root_->fail(op, "no dimension named");
  std::vector<int> picked;
  int last_axis = -1;
  std::string last_name;
  for (const std::string& name : names) {
    int index = find_dim(name, op);
    if (std::find(picked.begin(), picked.end(), index) != picked.end()) {
      root_->fail(op, fmt::format("dimension \"{}\" twice in {}", name, names));
    }
    const auto& axes = root_->dim(index).axes;
    if (axes.front() <= last_axis) {
      root_->fail(op, fmt::format("dimensions out of order: \"{}\" comes before (or overlaps) "
                                  "\"{}\" in {}; name them in the mesh's order",
                                  name, last_name, describe()));
    }
    last_axis = axes.back();
    last_name = name;
    picked.push_back(index);
  }
  return DeviceMesh(root_, std::move(picked));
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(const std::string& dim) const {
  return root_->dim(find_dim(dim, "DeviceMesh::group")).group;
}

std::shared_ptr<ProcessGroup> DeviceMesh::group() const {
  if (dims_.size() != 1) {
    root_->fail("DeviceMesh::group",
                fmt::format("{} has {} dimensions: name one", describe(), dims_.size()));
  }
  return root_->dim(dims_[0]).group;
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names, std::string name) const {
  const char* op = "DeviceMesh::flatten";
  DeviceMesh slice = (*this)[names];  // checks the names and their order
  std::vector<int> axes;
  for (int d : slice.dims_) {
    const auto& a = root_->dim(d).axes;
    axes.insert(axes.end(), a.begin(), a.end());
  }
  if (name.empty()) name = fmt::format("{}", fmt::join(names, "_"));
  int existing = root_->lookup(name);
  if (existing >= 0) {
    if (root_->dim(existing).axes != axes) {
      root_->fail(op, fmt::format("name \"{}\" is already a dimension of the mesh over other "
                                  "axes; pick another",
                                  name));
    }
    return DeviceMesh(root_, {existing});
  }
  auto group = root_->make_group(axes, name);
  int size = 1;
  for (int axis : axes) size *= root_->shape[axis];
  std::lock_guard<std::mutex> lock(root_->mutex);
  for (size_t i = 0; i < root_->dims.size(); ++i) {  // another thread flattened it meanwhile
    if (root_->dims[i].name == name) return DeviceMesh(root_, {static_cast<int>(i)});
  }
  root_->dims.push_back({name, axes, size, std::move(group)});
  return DeviceMesh(root_, {static_cast<int>(root_->dims.size()) - 1});
}

std::vector<int> DeviceMesh::shape() const {
  std::vector<int> out;
  for (int d : dims_) out.push_back(root_->dim(d).size);
  return out;
}

std::vector<std::string> DeviceMesh::dim_names() const {
  std::vector<std::string> out;
  for (int d : dims_) out.push_back(root_->dim(d).name);
  return out;
}

int DeviceMesh::size() const { return product(shape()); }

int DeviceMesh::size(const std::string& dim) const {
  return root_->dim(find_dim(dim, "DeviceMesh::size")).size;
}

std::vector<int> DeviceMesh::coordinate() const {
  std::vector<int> out;
  for (int d : dims_) out.push_back(root_->index_over(root_->coord, root_->dim(d).axes));
  return out;
}

int DeviceMesh::rank() const {
  int index = 0;
  std::vector<int> s = shape(), c = coordinate();
  for (size_t i = 0; i < s.size(); ++i) index = index * s[i] + c[i];
  return index;
}

std::vector<int> DeviceMesh::ranks() const {
  // Positions that share this rank's coordinates on every axis the mesh does not cover, in
  // increasing order (which is the mesh's row-major order: see the file comment).
  std::vector<int> covered;
  for (int d : dims_) {
    const auto& axes = root_->dim(d).axes;
    covered.insert(covered.end(), axes.begin(), axes.end());
  }
  std::vector<int> rest = root_->other_axes(covered);
  const int mine = root_->index_over(root_->coord, rest);
  std::vector<int> out;
  for (size_t p = 0; p < root_->layout.size(); ++p) {
    if (root_->index_over(root_->coordinate_of(static_cast<int>(p)), rest) == mine) {
      out.push_back(root_->layout[p]);
    }
  }
  return out;
}

DeviceKind DeviceMesh::device_kind() const { return root_->kind; }

std::string DeviceMesh::describe() const {
  std::vector<std::string> dims;
  for (int d : dims_) dims.push_back(fmt::format("{}={}", root_->dim(d).name, root_->dim(d).size));
  return fmt::format("DeviceMesh({}, [{}], ranks {})", device_kind_name(root_->kind),
                     fmt::join(dims, ", "), ranks());
}

}  // namespace weft
