// backends/tcp/shm_segment.h: a named POSIX shared-memory object, mapped and pre-faulted.
//
// The shared-memory transport between ranks on one host puts its rings and doorbells in
// segments: the owner (the rank that receives through a ring) creates one, publishes its name
// through the store, each peer opens it, and once every peer has reported that it has it mapped,
// the owner unlinks the name, so that nothing outlives the job in /dev/shm even if it crashes
// later. The mappings stay valid after unlink until each process unmaps them.
//
// Cost: on these machines (VMs) the first write to a page through a new mapping costs about
// 13 us per 4 KiB page (0.3 GB/s, against 17 GB/s for memcpy), in every process that maps it.
// So create() reserves every page up front (fallocate), and create() and open() both map with
// MAP_POPULATE and write one word per page before returning: 64 MiB takes ~0.2 s to map, after
// which the first memset runs at full speed. Segments are made once per group and reused,
// never per collective.
//
// Names: POSIX shared-memory names are global to the host, so they must be unique per job: the
// caller builds them from shm_job_prefix() (runtime/shm_names.h), then its own part, ending
// "-<creator pid>-r<rank>" (the shared-memory transport: "/weft-<job tag>-<group
// id>-<pid>-r<rank>"). A name is at most 255 bytes, with no '/' but an optional leading one (added
// when missing).
//
// Leaks. The window between create() and unlink() (segment set-up) is short, but a rank killed
// in it (SIGINT, SIGTERM: no destructor runs) leaves its name in /dev/shm. Because names carry
// the job and the creator's pid, whoever started the job can remove what its dead ranks left:
// weftrun calls remove_orphan_segments() once its ranks have exited; after other launchers,
// `rm /dev/shm/weft-<job tag>-*` does the same.
//
// Thread safety: a ShmSegment is a handle; its methods are not synchronised (one owner thread),
// while the memory it maps is shared by design (the structures placed in it say how).
// Ownership: the handle owns the mapping (unmapped by the destructor) and, for the creator, the
// name: the creator's destructor unlinks it unless unlink() already did. Across fork() only the
// creating process unlinks, so a child never removes its parent's object by accident.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace weft::tcp {

class ShmSegment {
 public:
  // Creates the object `name` with `size` bytes (zero-filled), reserves and maps every page.
  // Throws Error(InvalidArgument) for a bad name or size 0, Error(Io) naming the object and
  // errno when the name exists already or any OS call fails; a full /dev/shm (ENOSPC) is an
  // Error(Io) that says so, with the size wanted, the room there is and what to do. On failure
  // nothing is left behind (the name is unlinked again).
  static ShmSegment create(std::string_view name, size_t size);

  // Maps an existing object created by another process. `expected_size`, when not 0, must be
  // the object's size: a mismatch means the two ranks disagree about the layout
  // (Error(InvalidArgument)). Throws Error(Io) naming the object and errno when it is missing
  // (ENOENT: not created yet, or already unlinked) or cannot be mapped.
  static ShmSegment open(std::string_view name, size_t expected_size = 0);
  // As open(), but nullopt when no object has the name (ENOENT): for a caller that can tell why.
  static std::optional<ShmSegment> open_if_present(std::string_view name, size_t expected_size = 0);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name, so that no further open() finds it; mappings stay valid. Idempotent, and
  // a name some other process unlinked already is not an error. Call it once every peer has
  // opened the segment. Throws Error(Io) on any other failure.
  void unlink();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // The name as passed to shm_open, with its leading '/'.
  const std::string& name() const { return name_; }
  bool is_creator() const { return creator_pid_ != 0; }
  bool is_unlinked() const { return unlinked_; }

 private:
  ShmSegment(std::string name, std::byte* data, size_t size, pid_t creator_pid);
  void release() noexcept;

  std::string name_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  pid_t creator_pid_ = 0;  // getpid() of the creator, 0 for a handle from open()
  bool unlinked_ = false;
};

}  // namespace weft::tcp
