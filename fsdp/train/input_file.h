// fsdp/train/input_file.h: opening a file the trainer reads (--data, --init, a checkpoint), never
// hanging on one that is not a regular file.
//
// open() of a FIFO for reading blocks until a writer comes, and a device may never end; so the
// path is looked at with stat() first, refused unless it is a regular file (after symbolic links),
// then opened with O_NONBLOCK (in case it was replaced in between: reads of a regular file do not
// care) and checked again with fstat().
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "weft/error.h"

namespace weft::train {

// "a FIFO", "a directory", ...: what a file that is not a regular one is.
inline std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens `path` for reading and returns the descriptor (the caller closes it) with its size in
// *size. Throws weft::Error, its message starting with `where`: InvalidArgument when it is not a
// regular file, Io when it cannot be looked at or opened.
inline int open_regular_file(const std::string& path, std::string_view where, int64_t* size) {
  auto io_error = [&](std::string_view what) {
    const int err = errno;
    throw_error(ErrorCode::Io, where, fmt::format("{}: {}", what, std::strerror(err)));
  };
  auto refuse = [&](mode_t mode) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("{}, not a regular file: refused without reading it", file_kind(mode)));
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) io_error("stat");
  if (!S_ISREG(st.st_mode)) refuse(st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) io_error("open");
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    errno = err;
    if (!S_ISREG(st.st_mode)) refuse(st.st_mode);
    io_error("fstat");
  }
  *size = static_cast<int64_t>(st.st_size);
  return fd;
}

}  // namespace weft::train
