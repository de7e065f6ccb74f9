/* weft/plugin.h: the C ABI of weft backend plugins. Versions 1 and 2.
 *
 * A backend plugin is a shared library, libweft-backend-NAME.so, that exports one const struct
 * per ABI version it implements, named weftBackendPlugin_vN (here: weftBackendPlugin_v2 of type
 * weftBackendPlugin_v2_t, the newest, and weftBackendPlugin_v1 of type weftBackendPlugin_v1_t),
 * in the manner of NCCL's net and tuner plugins. Version 2 differs from version 1 in one thing:
 * the store table its init() gets (weftStore_v2_t) has delete_key. Everything else below is said
 * of both; a new plugin implements v2. weft looks for it when
 * a process group asks for backend NAME ("cpu:NAME") and no built-in has that name: in each
 * directory of WEFT_PLUGIN_PATH (colon-separated), then in the install's plugin directory
 * (LIBDIR/weft/plugins); a backend string holding a '/' is a path to load as is.
 *
 * Loading. weft probes the versions it knows, newest first, with dlsym, and takes the first one
 * found. It refuses a plugin (with a message naming the file, and going on with the other
 * candidates) when: the file is not a regular file (a FIFO, a directory, a device: seen with
 * stat(), never opened); dlopen fails (e.g. one of the plugin's own dependencies is missing: the
 * message is dlerror()'s); no weftBackendPlugin_vN symbol is found (or only newer versions than
 * this weft knows: the message says which); the struct's abi_version is not N; its struct_size
 * is not sizeof(weftBackendPlugin_vN_t) as this header defines it; its name is empty or differs
 * from the NAME in the file name (when loaded by name); a required callback is NULL.
 *
 * Lifetime and threads (what a plugin must guarantee):
 *  - Every call into a context but abort() runs on one thread of weft's own per context (its
 *    plugin thread): init(), then post() (and test() and release()), then finalize(). A process
 *    may have several groups using the plugin, so several contexts at once, on their threads.
 *  - init() is called once per process group using the plugin. It may block (connect to peers
 *    through the store) but must give up within args->timeout_ms with WEFT_ERR_TIMEOUT.
 *  - post() is called in the group's issue order and must not block on the network: it queues
 *    the operations and returns. Every rank of the group posts the same sequence, so a plugin may
 *    match messages by `seq` (collectives) or by (peer, tag) in posting order (send/recv).
 *  - Operations of one context run in posting order: the first posted completes (or fails)
 *    before the second starts, unless the plugin can prove the order is unobservable.
 *  - Completion, one of two ways, chosen by the plugin. With `test` set, weft passes done = NULL
 *    to post() and polls test() on the returned request (from the context's plugin thread, with a
 *    pause that grows from 20 us to 1 ms while nothing completes) until it reports done, then
 *    calls release(). With `test` NULL, weft passes a `done` callback, which the plugin calls
 *    exactly once per post(), from any thread, when the operation's outputs are final or it
 *    failed; `done` does not block and may be called before post() returns. Either way the
 *    result and message reported are final.
 *  - abort() may be called from any thread at any time, concurrently with post() and test(). It
 *    must make every pending and later operation of that context fail (WEFT_ERR_ABORTED) within
 *    a bounded time, without waiting for peers.
 *  - finalize() is called once, after every operation has completed (or failed), and after
 *    every request was released with release(). Nothing of the context is touched afterwards.
 *  - Tensor memory belongs to the caller and stays valid until the operation completes; the
 *    descriptors themselves (the arrays passed to post()) are valid only during post(): copy what
 *    you need.
 *  - weft bounds every call: init() by the group's timeout plus a margin (max(1 s, timeout/10)),
 *    post(), test(), release(), abort() and finalize() by the group's timeout. Past it weft gives
 *    up on the context: its unfinished operations fail with Error(Timeout) naming the plugin, the
 *    call and the operation, later ones fail at once, abort() is called, and the context is
 *    leaked (never finalized; the store, the logger and `done` stay valid for it).
 *  - A broken completion contract (done() twice for one post(), done() for an operation whose
 *    post() failed, post() failing after calling done()) is logged as an Internal error naming
 *    the plugin and the operation, and ignored: the operation keeps its first result.
 *  - A failure is reported as a weft_result_t plus a message. Messages should say what went
 *    wrong in the plugin's terms ("MPI_Allreduce: MPI_ERR_TRUNCATE"); weft prefixes the rank,
 *    group, operation and sequence number. Use the codes as error.h defines them:
 *    WEFT_ERR_PEER_LOST for a dead peer, WEFT_ERR_TIMEOUT for an operation past
 *    args->timeout_ms, WEFT_ERR_UNSUPPORTED for an operation, dtype or op the plugin does not
 *    implement, WEFT_ERR_INTERNAL for its own bugs. weft raises each as the weft::Error of the
 *    same number; WEFT_ERR_INTERNAL, and any value it does not know, as Error(Protocol) (the
 *    plugin broke its contract). A failure with no message (NULL or "") is raised with one that
 *    names the plugin, the call and the code.
 *
 * The struct is versioned as a whole: each version is frozen once released, a later weft defines
 * the next beside it (weftBackendPlugin_v2_t beside v1) and keeps loading the older ones (a v1
 * plugin gets the v1 store table, without delete_key); a plugin may export several versions to
 * load into older weft. Enum values (c_types.h, weftCollKind_v1_t) are never reused.
 */
#ifndef WEFT_PLUGIN_H_
#define WEFT_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#include "weft/c_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* abi_version of each struct version. WEFT_PLUGIN_ABI_VERSION stays 1, the value v1 plugins'
 * sources write in weftBackendPlugin_v1_t's abi_version: a v2 plugin writes WEFT_PLUGIN_ABI_V2. */
#define WEFT_PLUGIN_ABI_VERSION 1
#define WEFT_PLUGIN_ABI_V1 1
#define WEFT_PLUGIN_ABI_V2 2
/* The symbol a v1 plugin exports: `const weftBackendPlugin_v1_t weftBackendPlugin_v1 = {...};` */
#define WEFT_PLUGIN_SYMBOL_V1 "weftBackendPlugin_v1"
/* The symbol a v2 plugin exports: `const weftBackendPlugin_v2_t weftBackendPlugin_v2 = {...};` */
#define WEFT_PLUGIN_SYMBOL_V2 "weftBackendPlugin_v2"

/* The operations weft posts; values mirror weft::CollectiveKind (backend.h). */
typedef enum {
  WEFT_COLL_ALL_REDUCE = 0,
  WEFT_COLL_REDUCE = 1,
  WEFT_COLL_BROADCAST = 2,
  WEFT_COLL_ALL_GATHER = 3,
  WEFT_COLL_REDUCE_SCATTER = 4,
  WEFT_COLL_GATHER = 5,
  WEFT_COLL_SCATTER = 6,
  WEFT_COLL_ALL_TO_ALL = 7,
  WEFT_COLL_BARRIER = 8,
  WEFT_COLL_SEND = 9,
  WEFT_COLL_RECV = 10
} weftCollKind_v1_t;

/* A contiguous run of `count` elements of `dtype` (weft_dtype_t) at `data` on a device. */
typedef struct {
  void* data;
  uint64_t count;
  int32_t dtype;        /* weft_dtype_t */
  int32_t device_kind;  /* weft_device_kind_t */
  int32_t device_index; /* CUDA ordinal; 0 for the host */
  int32_t reserved;     /* 0 */
} weftTensor_v1_t;

/* One operation, already checked by weft (sizes, dtypes, roots agree with the table below; every
 * tensor of one operation has the same dtype and device):
 *
 *   kind           | inputs                         | outputs                          | also
 *   ---------------+--------------------------------+----------------------------------+---------
 *   ALL_REDUCE     | [x]                            | [y], y.count == x.count          | op
 *   REDUCE         | [x]                            | root: [y] as x; others: none     | op, root
 *   BROADCAST      | root: [x]; others: none        | [y]; root: y.count == x.count    | root
 *   ALL_GATHER     | [x], x.count == counts[rank]   | [y], sum(counts), rank-major     | counts
 *   REDUCE_SCATTER | [x], sum(counts), rank-major   | [y], y.count == counts[rank]     | op, counts
 *   GATHER         | [x]                            | root: [y], size*x.count; others: none | root
 *   SCATTER        | root: [x], size*y.count; others: none | [y]                       | root
 *   ALL_TO_ALL     | [x], sum(send_counts)          | [y], sum(recv_counts)            | counts
 *   BARRIER        | none                           | none                             |
 *   SEND           | [x]                            | none                             | peer, tag
 *   RECV           | none                           | [y]                              | peer, tag
 *
 * Equal data pointers mean in place: y == x for ALL_REDUCE, REDUCE, BROADCAST and ALL_TO_ALL; x
 * at the rank's block of y for ALL_GATHER and GATHER; y at the rank's block of x for
 * REDUCE_SCATTER and SCATTER. Buffers otherwise do not overlap. */
typedef struct {
  int32_t kind;     /* weftCollKind_v1_t */
  int32_t op;       /* weft_red_op_t, for reducing kinds */
  double op_factor; /* WEFT_PREMUL_SUM's factor; 1 otherwise */
  uint64_t seq;     /* the group's sequence number (same on every rank); 0 for SEND and RECV */
  int32_t root;
  int32_t peer; /* SEND: destination; RECV: source (group ranks) */
  uint64_t tag; /* SEND and RECV */
  const weftTensor_v1_t* inputs;
  uint32_t num_inputs;
  uint32_t num_outputs;
  const weftTensor_v1_t* outputs;
  const uint64_t* counts;      /* ALL_GATHER, REDUCE_SCATTER: size entries; else NULL */
  const uint64_t* send_counts; /* ALL_TO_ALL: size entries each; else NULL */
  const uint64_t* recv_counts;
} weftCollective_v1_t;

/* The group's key-value store (namespaced for the group: keys are private to it), for exchanging
 * addresses at init(). Every call blocks for at most timeout_ms (negative: the group's timeout)
 * and returns WEFT_ERR_TIMEOUT past it. Values are bytes. Safe from any thread. */
typedef struct {
  void* ctx;
  weft_result_t (*set)(void* ctx, const char* key, const void* value, size_t size);
  /* Waits for `key`, then gives its value in a buffer the plugin frees with free_value(). */
  weft_result_t (*get)(void* ctx, const char* key, int64_t timeout_ms, void** value, size_t* size);
  void (*free_value)(void* ctx, void* value);
  /* Adds `delta` to the integer at `key` (0 when absent) and returns the new value. */
  weft_result_t (*add)(void* ctx, const char* key, int64_t delta, int64_t* result);
  /* Waits until every key exists. */
  weft_result_t (*wait)(void* ctx, const char* const* keys, size_t num_keys, int64_t timeout_ms);
  /* Whether every key exists now (*exists = 1) or not (0); does not wait. */
  weft_result_t (*check)(void* ctx, const char* const* keys, size_t num_keys, int32_t* exists);
  /* Waits for every key and gives all values in one round trip (the way to read N ranks'
   * addresses without N round trips): values[i] and sizes[i] for keys[i], each value freed with
   * free_value(). */
  weft_result_t (*multi_get)(void* ctx, const char* const* keys, size_t num_keys,
                             int64_t timeout_ms, void** values, size_t* sizes);
  /* Sets `key` to `desired` if its value is `expected` (an absent key matches an empty
   * `expected`), and gives the value now stored (freed with free_value()): PyTorch's
   * compare_set. */
  weft_result_t (*compare_set)(void* ctx, const char* key, const void* expected,
                               size_t expected_size, const void* desired, size_t desired_size,
                               void** current, size_t* current_size);
} weftStore_v1_t;

typedef enum {
  WEFT_LOG_ERROR = 0,
  WEFT_LOG_WARN = 1,
  WEFT_LOG_INFO = 2,
  WEFT_LOG_DEBUG = 3
} weftLogLevel_v1_t;

/* weft's logger: one line per call, prefixed by weft with the rank and the plugin's name, shown
 * according to WEFT_LOG. Safe from any thread. */
typedef void (*weftLogger_v1_t)(void* log_ctx, int32_t level, const char* message);

/* What init() gets. Valid during init() only, except `store` and `log`/`log_ctx`, which stay
 * valid until finalize() returns. */
typedef struct {
  uint32_t struct_size; /* sizeof(weftInitArgs_v1_t) */
  int32_t rank;         /* this process's rank in the group */
  int32_t size;         /* the group's size */
  int32_t device_kind;  /* weft_device_kind_t this context serves */
  const char* group_name;
  int64_t timeout_ms; /* the group's operation timeout */
  const weftStore_v1_t* store;
  weftLogger_v1_t log;
  void* log_ctx;
  /* The group's backend settings (ProcessGroupOptions::backend_settings), as key/value pairs. */
  uint32_t num_settings;
  const char* const* setting_keys;
  const char* const* setting_values;
  /* World ranks of the group's ranks, by group rank (for messages). */
  const int32_t* global_ranks;
} weftInitArgs_v1_t;

/* Completion callback: result and message (NULL or "" on success; copied by weft before it
 * returns). */
typedef void (*weftDone_v1_t)(void* done_arg, weft_result_t result, const char* message);

typedef struct {
  /* The backend's name, as in "cpu:NAME": [a-z0-9_-]+. The first field, in every version. */
  const char* name;
  /* WEFT_PLUGIN_ABI_VERSION (1) and sizeof(weftBackendPlugin_v1_t) as the plugin was built. */
  uint32_t abi_version;
  uint32_t struct_size;
  /* Device kinds served, a bit mask: 1u << WEFT_DEVICE_CPU, 1u << WEFT_DEVICE_CUDA. */
  uint32_t devices;
  uint32_t reserved; /* 0 */

  /* Makes one group's backend context. On failure writes a message (NUL-terminated, at most
   * error_size bytes) to `error`. */
  weft_result_t (*init)(const weftInitArgs_v1_t* args, void** context, char* error,
                        size_t error_size);

  /* Queues `num` operations (num > 1: a coalesced unit, run in order, completing together) and
   * returns a request for them in *request (polling plugins; others may leave it NULL). `done`
   * is NULL for polling plugins. A failure to queue is returned here, with a message in `error`,
   * and then nothing completes later; a failure while running is reported at completion. */
  weft_result_t (*post)(void* context, const weftCollective_v1_t* ops, uint32_t num,
                        weftDone_v1_t done, void* done_arg, void** request, char* error,
                        size_t error_size);

  /* Optional (NULL: completion through `done` only). Sets *done to 1 when the request has
   * completed, with its result returned and its message in `error`; else *done = 0 and
   * WEFT_SUCCESS. Must not block. */
  weft_result_t (*test)(void* context, void* request, int32_t* done, char* error,
                        size_t error_size);

  /* Optional: frees a request once weft has its result (called once per non-NULL request). */
  void (*release)(void* context, void* request);

  /* Required: see the header comment. `reason` is copied by the plugin if kept. */
  void (*abort)(void* context, const char* reason);

  /* Required: frees the context. */
  void (*finalize)(void* context);
} weftBackendPlugin_v1_t;

/* ---- Version 2: version 1 with delete_key in the store table. Frozen once released. */

/* weftStore_v1_t's members in the same order, then delete_key. */
typedef struct {
  void* ctx;
  weft_result_t (*set)(void* ctx, const char* key, const void* value, size_t size);
  weft_result_t (*get)(void* ctx, const char* key, int64_t timeout_ms, void** value, size_t* size);
  void (*free_value)(void* ctx, void* value);
  weft_result_t (*add)(void* ctx, const char* key, int64_t delta, int64_t* result);
  weft_result_t (*wait)(void* ctx, const char* const* keys, size_t num_keys, int64_t timeout_ms);
  weft_result_t (*check)(void* ctx, const char* const* keys, size_t num_keys, int32_t* exists);
  weft_result_t (*multi_get)(void* ctx, const char* const* keys, size_t num_keys,
                             int64_t timeout_ms, void** values, size_t* sizes);
  weft_result_t (*compare_set)(void* ctx, const char* key, const void* expected,
                               size_t expected_size, const void* desired, size_t desired_size,
                               void** current, size_t* current_size);
  /* Removes `key` (a key-value pair; counters made by add() too) and sets *deleted to 1 when it
   * existed, 0 when it did not (not an error). Does not wait. For cleaning up what init() wrote:
   * a key that every rank has read (after a barrier through the store, say) may go. */
  weft_result_t (*delete_key)(void* ctx, const char* key, int32_t* deleted);
} weftStore_v2_t;

/* weftInitArgs_v1_t with a weftStore_v2_t. struct_size is sizeof(weftInitArgs_v2_t). */
typedef struct {
  uint32_t struct_size;
  int32_t rank;
  int32_t size;
  int32_t device_kind;
  const char* group_name;
  int64_t timeout_ms;
  const weftStore_v2_t* store;
  weftLogger_v1_t log;
  void* log_ctx;
  uint32_t num_settings;
  const char* const* setting_keys;
  const char* const* setting_values;
  const int32_t* global_ranks;
} weftInitArgs_v2_t;

/* weftBackendPlugin_v1_t whose init() takes weftInitArgs_v2_t; abi_version is WEFT_PLUGIN_ABI_V2
 * and struct_size sizeof(weftBackendPlugin_v2_t). Every other member means what it does in v1
 * (and takes the v1 types: weftCollective_v1_t, weftDone_v1_t). */
typedef struct {
  const char* name;
  uint32_t abi_version;
  uint32_t struct_size;
  uint32_t devices;
  uint32_t reserved; /* 0 */
  weft_result_t (*init)(const weftInitArgs_v2_t* args, void** context, char* error,
                        size_t error_size);
  weft_result_t (*post)(void* context, const weftCollective_v1_t* ops, uint32_t num,
                        weftDone_v1_t done, void* done_arg, void** request, char* error,
                        size_t error_size);
  weft_result_t (*test)(void* context, void* request, int32_t* done, char* error,
                        size_t error_size);
  void (*release)(void* context, void* request);
  void (*abort)(void* context, const char* reason);
  void (*finalize)(void* context);
} weftBackendPlugin_v2_t;

#ifdef __cplusplus
}
#endif

#endif /* WEFT_PLUGIN_H_ */
