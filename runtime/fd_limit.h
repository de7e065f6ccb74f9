// runtime/fd_limit.h: what to say when a call that makes a file descriptor fails for want of one.
//
// weft opens descriptors at group creation, not per collective: per group and rank, one TCP
// socket per peer (over shared memory it stays open as the liveness channel), a listening socket
// while the mesh forms, an epoll fd and an eventfd for the TCP transport, and a store connection;
// the rank that hosts the store adds one connection per client. A job that outgrows the
// process's RLIMIT_NOFILE (`ulimit -n`) gets EMFILE from socket(), accept(), epoll_create(),
// eventfd() or shm_open(), and strerror's "Too many open files" alone does not say that the limit
// is the cause nor what to raise it to. So every such call site words EMFILE with
// fd_error_text(), fails at once instead of retrying (no descriptor frees itself by waiting),
// and the message names the limit, the descriptors open, an estimate of what the job needs and
// `ulimit -n`.
//
// Thread safety: both functions may be called from any thread (they read /proc and getrlimit).
#pragma once

#include <string>
#include <string_view>

namespace weft {

// True for EMFILE (this process is at RLIMIT_NOFILE) and ENFILE (the system's file table is
// full): retrying the call will not help until something closes.
bool out_of_descriptors(int err);

// strerror(err) for any errno. For EMFILE: "too many open files: RLIMIT_NOFILE is 64 and this
// process has 64 open; weft needs about N for P ranks: raise it with ulimit -n (the hard limit is
// H)"; `ranks` is the group's size when the caller knows it (0: leaves the estimate out). For
// ENFILE: the system's limit (fs.file-max).
std::string fd_error_text(int err, int ranks = 0);

// True when `message` holds fd_error_text()'s words for EMFILE or ENFILE: for callers that wrap
// an error with advice about something else (addresses), which would mislead here.
bool mentions_fd_limit(std::string_view message);

// About how many descriptors one rank needs in a group of `ranks`, counting the store's host
// (measured on 2 hosts x 4 ranks: fd_limit.cc); each further group adds about ranks + 3.
int descriptors_needed(int ranks);

}  // namespace weft
