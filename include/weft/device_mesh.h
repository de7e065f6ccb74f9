// weft/device_mesh.h: N-dimensional meshes of ranks with named dimensions, one process group per
// dimension, modelled on PyTorch's init_device_mesh / DeviceMesh.
//
//   auto mesh = weft::DeviceMesh::init(weft::DeviceKind::Cpu, {2, 4}, {"dp", "tp"}, world);
//   mesh.group("tp")->all_reduce(t);       // over the 4 ranks sharing this rank's dp coordinate
//   auto dp = mesh["dp"];                   // this rank's 1-D slice along dp
//   auto flat = mesh.flatten({"dp", "tp"}, "dp_tp");  // one dimension of 8, its own group
//
// Layout. Ranks fill the mesh row-major, as in PyTorch: with shape {2, 4} rank r sits at
// (r / 4, r % 4). from_layout() takes any placement instead (a permutation of the group's ranks,
// listed row-major). A sub-mesh or group always holds the ranks of *this* rank's slice.
//
// Groups. init() makes one process group per dimension with one ProcessGroup::split() each (the
// ranks that share every other coordinate form a group, ordered by their coordinate along it),
// except that a dimension whose slice is the whole parent group in its own order reuses the
// parent. Sub-meshes share their root's groups: slicing makes no group. flatten() makes one
// more group (one split) the first time a name is used and caches it by name on the root mesh;
// later calls with the same name and dimensions return the cached one from any mesh of the tree.
//
// Collective calls. init(), from_layout() and the first flatten() of a name create groups: every
// rank of the parent group calls them, in the same order, with the same arguments. Slicing,
// group(), coordinate() and the size queries are local.
//
// Thread safety: a DeviceMesh is a value (cheap to copy; copies share the root). Its queries are
// safe from any thread; flatten() takes a lock on the root.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "weft/device.h"
#include "weft/process_group.h"

namespace weft {

class DeviceMesh {
 public:
  // A mesh of `shape` over `parent`'s ranks laid out row-major. `shape`'s product must equal
  // parent->size() and every extent be >= 1; `dim_names` must be as many as the extents, unique
  // and non-empty. With no parent, the world group is initialized from the environment
  // (init_process_group()). `kind` must have a backend in the parent's map ("cpu:tcp" serves
  // Cpu). Error(InvalidArgument) naming the problem otherwise.
  static DeviceMesh init(DeviceKind kind, std::vector<int> shape,
                         std::vector<std::string> dim_names,
                         std::shared_ptr<ProcessGroup> parent = nullptr);
  // The same over an explicit placement: layout[i] is the parent rank at row-major position i
  // (a permutation of 0 .. parent->size() - 1).
  static DeviceMesh from_layout(std::shared_ptr<ProcessGroup> parent, DeviceKind kind,
                                std::vector<int> shape, std::vector<int> layout,
                                std::vector<std::string> dim_names);

  // This rank's slice along the named dimensions, in the mesh's order (a flattened name counts
  // as the dimensions it covers). Unknown or repeated names, and names out of the mesh's order,
  // are Error(InvalidArgument).
  DeviceMesh operator[](const std::string& dim) const;
  DeviceMesh operator[](const std::vector<std::string>& dims) const;
  DeviceMesh operator[](std::initializer_list<std::string> dims) const {
    return (*this)[std::vector<std::string>(dims)];
  }

  // The process group of this rank along `dim` (a dimension of this mesh, or a flattened one
  // covering only dimensions of this mesh). group() with no name: the only dimension's (a 1-D
  // mesh; otherwise Error(InvalidArgument)).
  std::shared_ptr<ProcessGroup> group(const std::string& dim) const;
  std::shared_ptr<ProcessGroup> group() const;

  // A 1-D mesh whose one dimension, `name`, runs over `dims` (of this mesh, in its order)
  // row-major, with its own group. Collective on first use of `name` (see the header comment).
  // An empty name joins the dimension names with '_'. A name already used for other dimensions,
  // or equal to a mesh dimension's, is Error(InvalidArgument).
  DeviceMesh flatten(const std::vector<std::string>& dims, std::string name = "") const;

  int ndim() const { return static_cast<int>(dims_.size()); }
  std::vector<int> shape() const;
  std::vector<std::string> dim_names() const;
  int size() const;                        // ranks in this mesh
  int size(const std::string& dim) const;  // extent of one dimension
  // This rank's coordinate along each dimension of this mesh.
  std::vector<int> coordinate() const;
  // This rank's row-major position in this mesh: 0 .. size() - 1.
  int rank() const;
  // The parent group's ranks in this mesh, row-major (PyTorch's mesh tensor, flattened).
  std::vector<int> ranks() const;
  DeviceKind device_kind() const;
  // "DeviceMesh(cpu, [dp=2, tp=4], ranks [0, 1, 2, 3, 4, 5, 6, 7])".
  std::string describe() const;

  struct Root;  // implementation (runtime/device_mesh.cc)

 private:
  DeviceMesh(std::shared_ptr<Root> root, std::vector<int> dims)
      : root_(std::move(root)), dims_(std::move(dims)) {}
  int find_dim(const std::string& name, const char* what) const;

  std::shared_ptr<Root> root_;
  std::vector<int> dims_;  // indices into the root's dimension table
};

}  // namespace weft
