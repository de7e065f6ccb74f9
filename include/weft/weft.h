/* weft/weft.h: weft's C API, for embedding weft in C programs and in other languages' runtimes
 * (through their C foreign-function interfaces). It wraps the C++ API (process_group.h): the
 * same groups, collectives, errors and threads, behind opaque handles.
 *
 *   weft_group_t* world = NULL;
 *   if (weft_init_from_env(&world) != WEFT_SUCCESS) {    // under weftrun, torchrun, srun, mpirun
 *     fprintf(stderr, "%s\n", weft_last_error());
 *     return 1;
 *   }
 *   float grad[1024];
 *   weft_all_reduce(world, grad, grad, 1024, WEFT_FLOAT32, WEFT_AVG, NULL);  // NULL: synchronous
 *
 *   weft_work_t* work = NULL;                         // asynchronous: returns at once
 *   weft_all_reduce(world, grad, grad, 1024, WEFT_FLOAT32, WEFT_SUM, &work);
 *   compute_something_else();                         // overlaps with the all_reduce
 *   weft_result_t result = weft_work_wait(work, -1);  // -1: the group's timeout
 *   weft_work_free(work);
 *   weft_group_destroy(world);
 *
 * Compile against an installed weft with `cc prog.c $(pkg-config --cflags --libs weft)`;
 * docs/c-api.md says more.
 *
 * Conventions (every function below follows them unless it says otherwise):
 *  - Results. Every function returns a weft_result_t (c_types.h): WEFT_SUCCESS, or the code of
 *    the weft::Error it failed with (same numbers; error.h says what each code means and whether
 *    to retry). Any other failure inside weft is WEFT_ERR_INTERNAL. No C++ exception ever leaves
 *    a function of this header. Three functions return strings instead: weft_last_error(),
 *    weft_result_name() and weft_version().
 *  - Messages. A failing call records its message for the calling thread: weft_last_error()
 *    returns it. The message is the weft::Error's text, which names the rank, group, operation
 *    and sequence number, then what went wrong ("rank 1/3 group "world" broadcast #4:
 *    InvalidArgument: root 3 is out of range for a group of 3 ranks"). Successful calls leave it
 *    as it was.
 *  - Pointers. Every pointer argument must be non-NULL unless its description allows NULL;
 *    a NULL one is WEFT_ERR_INVALID_ARGUMENT naming it. Out-parameters are written on success
 *    only, except handles (weft_group_t**, weft_work_t**), which are set to NULL on failure.
 *  - Buffers. Counts are in elements of `dtype`, not bytes. Buffers are host (CPU) memory unless
 *    weft_set_buffer_device() says otherwise for the calling thread. A
 *    collective borrows its buffers until it completes: a synchronous call returns when it has;
 *    after an asynchronous one, do not read its outputs or change its inputs until its work
 *    handle reports completion (weft_work_wait or weft_work_test), even if the handle was freed.
 *  - Collectives. Every rank of a group issues the same collectives in the same order with
 *    matching arguments, as in the C++ API (process_group.h says what "matching" means). A call
 *    refused for its arguments issues nothing: the group stays usable. Counts whose byte size
 *    overflows size_t are refused. Buffers that overlap other than in place (as each collective
 *    says) are fine: the input is copied first, on every rank alike.
 *  - fork(). A group belongs to the process that made it. In a fork() child every call on the
 *    parent's groups, weft_group_destroy() included, fails at once with
 *    WEFT_ERR_INVALID_ARGUMENT; the child must not wait for the parent's threads.
 *  - Threads. Any thread may call any function. A group's collectives may be issued from several
 *    threads, but they run in the order they were issued, which must be the same on every rank:
 *    issue them from one thread, or order them yourself. weft_group_abort() is safe at any time.
 *    A handle must not be destroyed or freed while another thread still uses it.
 *
 * Stability: functions and struct fields are only ever added. weft_init_options_t begins with
 * its size so that later versions can add fields and still accept structs from older programs.
 */
#ifndef WEFT_WEFT_H_
#define WEFT_WEFT_H_

#include <stddef.h>
#include <stdint.h>

#include "weft/c_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A process group: a fixed set of ranks that run collectives together (weft::ProcessGroup).
 * Created by weft_init*, weft_new_group or weft_split; released by weft_group_destroy. */
typedef struct weft_group weft_group_t;

/* One asynchronous operation (weft::Work). Created by a collective given a non-NULL `work`;
 * released by weft_work_free. */
typedef struct weft_work weft_work_t;

/* ---- Starting up. */

/* Where and how the ranks meet, for weft_init(). Start from WEFT_INIT_OPTIONS_INIT:
 *
 *   weft_init_options_t options = WEFT_INIT_OPTIONS_INIT;
 *   options.url = "tcp://10.0.0.1:29500";
 *   options.rank = rank;
 *   options.world_size = 4;
 */
typedef struct {
  /* sizeof(weft_init_options_t) as the caller was compiled: the initializer sets it. */
  uint32_t struct_size;
  /* This process's rank; negative: from the URL or the environment. */
  int32_t rank;
  /* The number of ranks; 0 or negative: from the URL or the environment. */
  int32_t world_size;
  /* Where the ranks meet (rendezvous.h): "env://" (the launcher's environment),
   * "tcp://HOST:PORT" (rank 0 hosts a TCP store there unless one runs already),
   * "file:///PATH" (a file store on one host or a shared filesystem). NULL or "": "env://". */
  const char* url;
  /* Backends per device kind, as c10d writes them: "tcp", "cpu:tcp,cuda:nccl".
   * NULL or "": each device kind's default. */
  const char* backend;
  /* Bounds the rendezvous and every collective of the group, in milliseconds.
   * 0: WEFT_TIMEOUT (default 300 s). Negative: WEFT_ERR_INVALID_ARGUMENT. */
  int64_t timeout_ms;
} weft_init_options_t;

/* Every field at its default: env://, rank and world size from the environment, default
 * backends and timeout. */
#define WEFT_INIT_OPTIONS_INIT \
  { (uint32_t)sizeof(weft_init_options_t), -1, -1, NULL, NULL, 0 }

/* Meets the other ranks as the launcher's environment says (weftrun, torchrun, srun, mpirun:
 * docs/launching.md) and stores the world group in *group. Blocks until every rank has arrived
 * or the timeout (WEFT_TIMEOUT) passes. The caller owns *group: release it with
 * weft_group_destroy(). Fails with WEFT_ERR_INVALID_ARGUMENT for a malformed environment (naming
 * the variable), WEFT_ERR_TIMEOUT when ranks are missing (naming them), WEFT_ERR_IO when rank 0
 * cannot bind the store's port. Equivalent to weft_init() with WEFT_INIT_OPTIONS_INIT. */
weft_result_t weft_init_from_env(weft_group_t** group);

/* As weft_init_from_env(), with the URL, rank, size, backend and timeout from *options (read
 * during the call only). WEFT_ERR_INVALID_ARGUMENT when options->struct_size is not
 * sizeof(weft_init_options_t) as this weft was built (a program built against another weft.h),
 * when the timeout is negative, or when rank and size contradict each other or the URL. */
weft_result_t weft_init(const weft_init_options_t* options, weft_group_t** group);

/* ---- Groups. */

/* This process's rank in the group (0 .. size - 1) and the group's size, into *rank / *size. */
weft_result_t weft_group_rank(const weft_group_t* group, int32_t* rank);
weft_result_t weft_group_size(const weft_group_t* group, int32_t* size);

/* A group of the listed ranks of `parent` (group rank i is ranks[i]); *out is NULL on ranks not
 * listed. Collective over the parent: every rank of it calls this, in the same order as its
 * other weft_new_group and weft_split calls, with the same list. WEFT_ERR_INVALID_ARGUMENT for
 * an empty list, a rank out of range or listed twice. The caller owns *out. */
weft_result_t weft_new_group(weft_group_t* parent, const int32_t* ranks, size_t num_ranks,
                             weft_group_t** out);

/* Groups by color: the ranks passing the same color >= 0 form a group, ordered by (key, rank in
 * parent); a negative color joins no group (*out = NULL). Collective over the parent, as
 * weft_new_group; it runs one all_gather on the parent. The caller owns *out. */
weft_result_t weft_split(weft_group_t* parent, int32_t color, int32_t key, weft_group_t** out);

/* Fails every pending and later operation of the group with WEFT_ERR_ABORTED and a message
 * holding `reason` (NULL: a default), unblocking the running one in bounded time. For a rank
 * that must give up on its peers (one died, or an outer deadline passed). Any thread, any time;
 * the first call wins. The group must still be destroyed. */
weft_result_t weft_group_abort(weft_group_t* group, const char* reason);

/* Waits (up to the group's timeout) for the operations issued on the group, then closes its
 * connections and frees the handle, which must not be used again. Work handles of the group stay
 * valid: free them as usual. Groups made from this one stay usable. NULL is a no-op. The handle
 * is freed even when the call fails. On the rank that hosts the store (rank 0 with tcp://
 * outside a launcher), destroy the world group last: the other ranks' groups need its store. */
weft_result_t weft_group_destroy(weft_group_t* group);

/* ---- Collectives.
 *
 * Each takes a last argument `work`:
 *   NULL      synchronous: returns when the operation has completed, with its result. When it
 *             takes longer than the group's timeout, the call aborts the group (which is
 *             unusable after a timeout anyway) so that it never returns while weft still uses
 *             the buffers, and returns WEFT_ERR_TIMEOUT.
 *   non-NULL  asynchronous: returns at once and stores a new handle in *work (owned by the
 *             caller: weft_work_free). The operation's result comes from weft_work_wait() or
 *             weft_work_test().
 * Either way, arguments are checked before anything is issued; a refused call returns
 * WEFT_ERR_INVALID_ARGUMENT naming the argument (and *work = NULL). `op` is one of
 * weft_red_op_t except WEFT_PREMUL_SUM, which needs a factor: use the _premul variants.
 * A collective on a group that failed (a peer lost, a timeout) or was aborted fails at once with
 * that error. */

/* Reduces `count` elements over every rank: recvbuf receives the reduction of every rank's
 * sendbuf. In place when sendbuf == recvbuf. WEFT_AVG divides by the group's size. */
weft_result_t weft_all_reduce(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t count,
                              weft_dtype_t dtype, weft_red_op_t op, weft_work_t** work);

/* weft_all_reduce with WEFT_PREMUL_SUM: each rank's input is multiplied by `factor`, then
 * summed (floating dtypes only). */
weft_result_t weft_all_reduce_premul(weft_group_t* group, const void* sendbuf, void* recvbuf,
                                     size_t count, weft_dtype_t dtype, double factor,
                                     weft_work_t** work);

/* Reduces every rank's sendbuf into root's recvbuf (ignored on other ranks: it may be NULL
 * there). In place when sendbuf == recvbuf. */
weft_result_t weft_reduce(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t count,
                          weft_dtype_t dtype, weft_red_op_t op, int32_t root, weft_work_t** work);

/* Copies root's `count` elements at buf into every rank's buf. */
weft_result_t weft_broadcast(weft_group_t* group, void* buf, size_t count, weft_dtype_t dtype,
                             int32_t root, weft_work_t** work);

/* Gathers `sendcount` elements from every rank into recvbuf, rank-major: recvbuf holds
 * size * sendcount elements, rank r's block at r * sendcount. In place when sendbuf is this
 * rank's block of recvbuf. */
weft_result_t weft_all_gather(weft_group_t* group, const void* sendbuf, void* recvbuf,
                              size_t sendcount, weft_dtype_t dtype, weft_work_t** work);

/* Reduces over every rank a sendbuf of size * recvcount elements, rank-major, and leaves block
 * r of the reduction in rank r's recvbuf (recvcount elements). In place when recvbuf is this
 * rank's block of sendbuf. */
weft_result_t weft_reduce_scatter(weft_group_t* group, const void* sendbuf, void* recvbuf,
                                  size_t recvcount, weft_dtype_t dtype, weft_red_op_t op,
                                  weft_work_t** work);

/* weft_reduce_scatter with WEFT_PREMUL_SUM and its factor (floating dtypes only). */
weft_result_t weft_reduce_scatter_premul(weft_group_t* group, const void* sendbuf, void* recvbuf,
                                         size_t recvcount, weft_dtype_t dtype, double factor,
                                         weft_work_t** work);

/* Even all-to-all: sendbuf and recvbuf hold size * count elements; block j of sendbuf goes to
 * rank j, block j of recvbuf comes from rank j. In place when sendbuf == recvbuf. */
weft_result_t weft_all_to_all(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t count,
                              weft_dtype_t dtype, weft_work_t** work);

/* Gathers every rank's `sendcount` elements into root's recvbuf, rank-major: recvbuf holds
 * size * sendcount elements, rank r's block at r * sendcount. recvbuf is ignored on other ranks
 * (it may be NULL there). Added in 0.1 for torch.distributed's gather (python/weft). */
weft_result_t weft_gather(weft_group_t* group, const void* sendbuf, void* recvbuf, size_t sendcount,
                          weft_dtype_t dtype, int32_t root, weft_work_t** work);

/* Scatters root's sendbuf (size * recvcount elements, rank-major; ignored on other ranks, where
 * it may be NULL): rank r's recvbuf receives block r (recvcount elements). */
weft_result_t weft_scatter(weft_group_t* group, const void* sendbuf, void* recvbuf,
                           size_t recvcount, weft_dtype_t dtype, int32_t root, weft_work_t** work);

/* All-to-all with a count per rank (torch.distributed.all_to_all_single's splits): sendbuf holds
 * sum(send_counts) elements, its j-th block (send_counts[j] elements, in rank order) goes to rank
 * j; recvbuf holds sum(recv_counts), its j-th block comes from rank j. Both arrays hold size
 * counts and are read during the call only. Rank r's send_counts[j] must equal rank j's
 * recv_counts[r]. The buffers must not overlap. */
weft_result_t weft_all_to_all_v(weft_group_t* group, const void* sendbuf, const size_t* send_counts,
                                void* recvbuf, const size_t* recv_counts, weft_dtype_t dtype,
                                weft_work_t** work);

/* Completes when every rank of the group has entered it. */
weft_result_t weft_barrier(weft_group_t* group, weft_work_t** work);

/* Point to point, matched by (peer, tag) in issue order: rank a's weft_send(.., b, tag) pairs
 * with rank b's weft_recv(.., a, tag), with the same count and dtype. They run in issue order
 * with the group's collectives. Tags go up to 2^62 - 1. Ranks are the group's. */
weft_result_t weft_send(weft_group_t* group, const void* buf, size_t count, weft_dtype_t dtype,
                        int32_t peer, uint64_t tag, weft_work_t** work);
weft_result_t weft_recv(weft_group_t* group, void* buf, size_t count, weft_dtype_t dtype,
                        int32_t peer, uint64_t tag, weft_work_t** work);

/* A receive from any other rank (torch.distributed's recv with src=None): takes the first send
 * with `tag` that reaches this rank. Synchronous (work == NULL): on success *source (when not
 * NULL) is the sender's rank. Asynchronous: weft_work_source_rank() names it once the work has
 * succeeded. WEFT_ERR_UNSUPPORTED where the group's backend cannot (plugins; a tcp group whose
 * ranks span hosts with shared memory on: WEFT_SHM=0 makes it work). */
weft_result_t weft_recv_any(weft_group_t* group, void* buf, size_t count, weft_dtype_t dtype,
                            uint64_t tag, int32_t* source, weft_work_t** work);

/* ---- Work handles. Any thread; several threads may wait on one handle at once. */

/* Blocks until the operation completes, then returns its result (the error it failed with, its
 * message in weft_last_error()). `timeout_ms` bounds the wait: negative uses the work's own
 * timeout (the group's), 0 checks once. Past it, returns WEFT_ERR_TIMEOUT with a message saying
 * the operation did not complete in time; the operation keeps running and still borrows its
 * buffers, and the handle may be waited on again. Waiting again on a completed work returns the
 * same result. */
weft_result_t weft_work_wait(weft_work_t* work, int64_t timeout_ms);

/* Never blocks. Stores 1 in *done once the operation has completed, else 0. Returns the
 * operation's error once it has failed (with *done = 1), else WEFT_SUCCESS. */
weft_result_t weft_work_test(weft_work_t* work, int* done);

/* Frees the handle. An unfinished operation keeps running and still borrows its buffers until
 * it completes; its result is dropped (destroying or aborting its group bounds how long that
 * takes). NULL is a no-op. Always returns WEFT_SUCCESS. */
weft_result_t weft_work_free(weft_work_t* work);

/* Blocks until the operation has completed on the host and, for CUDA buffers, on the device too
 * (weft_work_wait on CUDA buffers returns once the calling thread's CUDA stream has been made to
 * wait for the operation, as c10d's Work.wait() does). `timeout_ms` as for weft_work_wait. For
 * host buffers it is weft_work_wait. */
weft_result_t weft_work_synchronize(weft_work_t* work, int64_t timeout_ms);

/* ---- CUDA buffers (docs/cuda.md). Per calling thread; libweft loads the CUDA runtime when a
 * CUDA buffer first needs it and links none. */

/* Where the buffers this thread passes from now on lie: "cpu" (the default), "cuda" or "cuda:N".
 * Collectives on CUDA buffers go to the group's CUDA backend (nccl when installed, else the host
 * backend staging through pinned memory). WEFT_ERR_INVALID_ARGUMENT for another name. */
weft_result_t weft_set_buffer_device(const char* device);

/* The CUDA stream (a cudaStream_t; NULL: the legacy default stream) that this thread's
 * collectives on CUDA buffers run after, and that weft_work_wait makes wait for them. Always
 * WEFT_SUCCESS. */
weft_result_t weft_set_cuda_stream(void* stream);

/* The rank a succeeded weft_recv_any received from, in *source; -1 while the work is pending,
 * after a failure, and for every other operation. */
weft_result_t weft_work_source_rank(weft_work_t* work, int32_t* source);

/* ---- Symmetric memory (weft::SymmetricBuffer; docs/symmetric-memory.md). */

/* Memory every rank of a group allocated together, in one shared mapping per host. The
 * collectives above, given buffers inside it (at the same offset on every rank), run zero-copy:
 * all_reduce, reduce_scatter, all_gather and broadcast. Created by weft_symmetric_alloc; released
 * by weft_symmetric_free. */
typedef struct weft_symmetric weft_symmetric_t;

/* Collective over the group (every rank calls it with the same `bytes`, in the same order as the
 * group's other allocations): allocates `bytes` on every rank and stores this rank's handle in
 * *buffer. Blocks up to the group's timeout. One mapping per host, of that host's ranks (across
 * hosts the zero-copy collectives run hierarchically). WEFT_ERR_UNSUPPORTED, saying why, when the
 * group has no shared memory (WEFT_SHM=0, a plugin backend); WEFT_ERR_IO when the memory cannot be
 * made on some host (a full /dev/shm). */
weft_result_t weft_symmetric_alloc(weft_group_t* group, size_t bytes, weft_symmetric_t** buffer);

/* This rank's bytes: *data (page-aligned) and *bytes (as allocated). Either may be NULL. */
weft_result_t weft_symmetric_data(const weft_symmetric_t* buffer, void** data, size_t* bytes);

/* Unmaps this rank's block and frees the handle. WEFT_ERR_INVALID_ARGUMENT, naming them, while
 * collectives issued on buffers inside it have not completed: the handle then stays valid (wait
 * for them and free it again). NULL is a no-op. The group may be destroyed first. */
weft_result_t weft_symmetric_free(weft_symmetric_t* buffer);

/* ---- The flight recorder (docs/flight-recorder.md). */

/* Writes the flight recorder of every group of this process to WEFT_TRACE_DIR, one JSON file per
 * world rank, with `reason` in it (NULL: "requested by the program"); *files_written (may be
 * NULL) gets how many files were written: 0 when WEFT_TRACE_BUFFER=0 or no group exists. weft
 * dumps by itself on a timeout, a lost peer, an abort and SIGUSR1. */
weft_result_t weft_dump_trace(const char* reason, size_t* files_written);

/* ---- Errors and version. */

/* The message of the calling thread's most recent failed weft call; "" if none has failed. The
 * string belongs to weft and stays valid until the thread's next weft call that fails (copy it
 * to keep it longer). Never NULL. */
const char* weft_last_error(void);

/* The enumerator's name: "WEFT_SUCCESS", "WEFT_ERR_PEER_LOST", ...; "WEFT_ERR_UNKNOWN" for a
 * value outside weft_result_t. A static string; never NULL. */
const char* weft_result_name(weft_result_t result);

/* The library's version, "MAJOR.MINOR.PATCH" ("0.1.0"). A static string; never NULL. */
const char* weft_version(void);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_WEFT_H_ */
