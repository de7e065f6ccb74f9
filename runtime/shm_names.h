// runtime/shm_names.h: how a job's shared-memory objects are named, and how its launcher
// removes those its killed ranks left behind.
//
// A rank killed while it sets up shared memory (SIGINT, SIGTERM: no destructor runs) leaves its
// segment's name in /dev/shm (backends/tcp/shm_segment.h: the name is unlinked once every peer
// has mapped it). Names carry the job's id and the creating process's pid, so whoever started
// the job can remove them once its ranks are gone: weftrun does, after its ranks exit; after
// other launchers `rm /dev/shm/weft-<tag>-*` does.
//
// Thread safety: both may be called from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace weft {

// "/weft-<tag>-": how every segment name of the job `job_id` (launch_env.h's
// launcher_job_id()) starts. The tag is job_id itself when it is 1 to 64 characters of
// [A-Za-z0-9._] (so `ls /dev/shm` shows the job), else "h" and 16 hex digits of its hash; a tag
// never holds '-', so one job's prefix is never the start of another's. "/weft-" for no job id.
std::string shm_job_prefix(std::string_view job_id);

// Removes every shared-memory object whose name starts with `prefix` (as shm_job_prefix() gives
// it) and ends "-<pid>-r<rank>" with no process `pid` left: what ranks of the job left behind
// when they were killed. A live creator's object is kept (it may be mid set-up, or belong to
// another launcher's part of the same job). With `only_older_than_this_process`, an object last
// modified after this process loaded libweft is kept too: a job's segments are all made after
// its rendezvous, so that spares every segment of the job this process belongs to, even one whose
// creator runs in another pid namespace (where kill() cannot see it). Returns the names removed;
// never throws (a name it cannot remove is left alone).
std::vector<std::string> remove_orphan_segments(std::string_view prefix,
                                                bool only_older_than_this_process = false);

// Once per process (later calls do nothing): removes the segments of `job_id` that killed ranks
// of an earlier run of the same job left (remove_orphan_segments(..., true)), so that a job
// restarted under the same id after a crash does not leave them to pile up. Logs what it removed.
void remove_earlier_runs_segments(std::string_view job_id);

}  // namespace weft
