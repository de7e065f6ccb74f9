// mpi_plugin.cc: a weft backend plugin over MPI (built and tested with Open MPI 4.1), named "mpi",
// serving the CPU. It uses weft's C plugin ABI only (weft/plugin.h, weft/c_types.h), plus the
// header-only float16/bfloat16/fp8 conversions of weft/half.h, and does not link libweft.
// docs/plugin-guide.md walks through it; README.md says how to build and run it.
//
// How it runs. Each weft group that asks for "cpu:mpi" gets a Context: an MPI communicator over
// the group's ranks, made with MPI_Comm_create_group from MPI_COMM_WORLD (so weft's world ranks
// must be MPI's: start the job with mpirun and rendezvous through env://). post() turns each
// operation into MPI's nonblocking calls (MPI_Iallreduce, MPI_Iallgatherv, MPI_Isend, ...) and
// weft polls test(), which tests the MPI requests and starts what comes next. Completion is by
// polling only: MPI has no completion callbacks, and weft's poller thread is exactly the progress
// loop MPI needs (Open MPI 4.1 has no asynchronous progress for nonblocking collectives).
//
// Order. The operations of a context run strictly in posting order: a unit (one post()) starts
// when the one before it completed, since successive operations may share buffers. Inside a
// coalesced unit each collective runs on its own, in order, and each run of consecutive sends
// and receives starts all at once (both ranks may receive first, as in NCCL's groups). A small
// send completes once copied (below) while MPI still sends the copy; that cannot be observed, as
// MPI keeps the messages between two ranks in order and collectives apart from them.
//
// Reductions mean exactly what weft's do (runtime/reduce.h): MPI's built-in ops where they agree
// (float32 and float64 sum and prod; integer min, max and bitwise ops; bool as MPI's logical ops
// on bytes), user-defined MPI ops elsewhere: integer sum and prod wrap (Open MPI 4.1's AVX
// kernels saturate 8-bit sums), float min/max propagate NaN and order -0 below +0, float16,
// bfloat16 and the fp8 formats (which MPI has no type for either: they travel as bytes) compute
// through float and round to nearest even after each combination. Avg is a sum
// divided by the group's size afterwards (integers truncate toward zero); premul_sum sums a copy of
// the input scaled by the factor, rounded to the dtype's arithmetic type first.
//
// Send/recv tags. weft's tags go up to 2^62 - 1, MPI's only up to MPI_TAG_UB (at least 32767).
// Tags below half of MPI_TAG_UB are MPI tags as they are. A larger tag travels in a small header
// on a control tag, followed by the payload on a tag of its own (a per-peer serial number), and
// the receiver matches headers to its receives by (peer, tag) in posting order: the same
// matching MPI gives the small tags.
//
// Sends of at most kDetachBytes complete once copied (MPI sends from the copy in the background),
// so that a rank may post several sends before the receives its peer posts later; larger sends
// complete when MPI has sent them, which may need the peer's receive (MPI's standard mode).
//
// Threads. weft calls post() on a group's thread, test() on that group's poller thread, abort()
// on any thread, and several groups may run at once. Every MPI call the plugin makes holds one
// plugin-wide mutex (Process::mpi_mutex), so the plugin itself needs only
// MPI_THREAD_SERIALIZED; it asks for MPI_THREAD_MULTIPLE when it initializes MPI, so that the
// application may call MPI from its own threads too. The one call that waits for peers,
// MPI_Comm_create_group at init, runs without the mutex under MPI_THREAD_MULTIPLE, so other groups
// keep progressing meanwhile.
//
// Abort and failures. abort() only raises a flag: the next test() fails every pending operation
// with WEFT_ERR_ABORTED, without waiting for peers. MPI cannot cancel a collective, and a
// cancelled receive may already be writing, so the MPI requests of an aborted (or timed-out)
// operation are left to finish in the background: CAVEAT: their buffers may still be written
// after the operation was reported failed. An operation that fails or passes the group's timeout
// leaves the context unusable (later operations fail at once), since its ranks may no longer be
// in step.
//
// MPI's lifetime. MPI is initialized by the first init() if nobody did, and then finalized at
// exit (std::atexit), not when the last context goes, because MPI cannot be initialized twice and
// a later group would need it again. An application that uses MPI itself should initialize it
// first (with MPI_THREAD_MULTIPLE if it calls MPI while weft runs) and finalize it after its last
// weft group is destroyed; the plugin then leaves both to it.

// Only MPI's C API: the deprecated C++ bindings mpi.h would pull in otherwise do not compile
// cleanly under -Wextra -Werror (-Wcast-function-type), and the plugin need not link them.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft/c_types.h"
#include "weft/half.h"
#include "weft/plugin.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kName = "mpi";

// Sends up to this size are copied and complete at once (see the top of the file). 1 MiB bounds
// the copy's cost and memory per send while covering the small messages a rank typically posts
// ahead of its peer's receive.
constexpr size_t kDetachBytes = size_t{1} << 20;

constexpr int kNumDTypes = WEFT_FLOAT8_E5M2 + 1;
constexpr int kNumOps = WEFT_BXOR + 1;

// ---- Results.

// A weft result and its message; ok() for WEFT_SUCCESS.
struct Status {
  weft_result_t code = WEFT_SUCCESS;
  std::string message;
  bool ok() const { return code == WEFT_SUCCESS; }
};

Status fail(weft_result_t code, std::string message) { return Status{code, std::move(message)}; }

weft_result_t report(const Status& status, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min(status.message.size(), error_size - 1);
    std::memcpy(error, status.message.data(), n);
    error[n] = '\0';
  }
  return status.code;
}

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(length));
}

// What an MPI error means to weft. weft checked every argument, so argument errors are the
// plugin's bugs; a truncated message means the ranks disagreed on a size.
weft_result_t code_of_mpi(int rc, bool p2p) {
  int error_class = rc;
  MPI_Error_class(rc, &error_class);
  switch (error_class) {
    case MPI_ERR_TRUNCATE:
      return p2p ? WEFT_ERR_INVALID_ARGUMENT : WEFT_ERR_DESYNC;
    case MPI_ERR_UNSUPPORTED_OPERATION:
      return WEFT_ERR_UNSUPPORTED;
    case MPI_ERR_OTHER:
    case MPI_ERR_UNKNOWN:
      // What Open MPI reports when a transport fails, e.g. a peer died.
      return WEFT_ERR_PEER_LOST;
    default:
      return WEFT_ERR_INTERNAL;
  }
}

// "MPI_Iallreduce: MPI_ERR_TRUNCATE: message truncated".
Status mpi_failure(const std::string& call, int rc, bool p2p = false) {
  return fail(code_of_mpi(rc, p2p), call + ": " + mpi_error_string(rc));
}

// ---- dtypes, ops and kinds, as c_types.h and plugin.h number them.

size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case WEFT_FLOAT32:
    case WEFT_INT32:
    case WEFT_UINT32:
      return 4;
    case WEFT_FLOAT64:
    case WEFT_INT64:
    case WEFT_UINT64:
      return 8;
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16:
      return 2;
    case WEFT_INT8:
    case WEFT_UINT8:
    case WEFT_BOOL:
    case WEFT_FLOAT8_E4M3:
    case WEFT_FLOAT8_E5M2:
      return 1;
    default:
      return 0;
  }
}

const char* dtype_name(int32_t dtype) {
  static const char* const kNames[] = {
      "float32", "float64", "float16", "bfloat16", "int8",          "uint8",      "int32",
      "int64",   "bool",    "uint32",  "uint64",   "float8_e4m3fn", "float8_e5m2"};
  return dtype >= 0 && dtype < kNumDTypes ? kNames[dtype] : "unknown dtype";
}

const char* op_name(int32_t op) {
  static const char* const kNames[] = {"sum",        "prod", "min", "max", "avg",
                                       "premul_sum", "band", "bor", "bxor"};
  return op >= 0 && op < kNumOps ? kNames[op] : "unknown op";
}

const char* kind_name(int32_t kind) {
  static const char* const kNames[] = {"all_reduce",     "reduce", "broadcast", "all_gather",
                                       "reduce_scatter", "gather", "scatter",   "all_to_all",
                                       "barrier",        "send",   "recv"};
  return kind >= 0 && kind <= WEFT_COLL_RECV ? kNames[kind] : "unknown operation";
}

bool is_floating(int32_t dtype) {
  return dtype == WEFT_FLOAT32 || dtype == WEFT_FLOAT64 || dtype == WEFT_FLOAT16 ||
         dtype == WEFT_BFLOAT16 || dtype == WEFT_FLOAT8_E4M3 || dtype == WEFT_FLOAT8_E5M2;
}

bool is_fp8(int32_t dtype) { return dtype == WEFT_FLOAT8_E4M3 || dtype == WEFT_FLOAT8_E5M2; }

bool is_p2p(int32_t kind) { return kind == WEFT_COLL_SEND || kind == WEFT_COLL_RECV; }

// The MPI type that moves elements of `size` bytes as they are (no arithmetic).
MPI_Datatype bits_type(size_t size) {
  switch (size) {
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      return MPI_UINT8_T;
  }
}

// ---- float16, bfloat16 and fp8: weft's own conversions (weft/half.h), round to nearest even.

struct Half {
  static float load(uint16_t v) { return weft::half_to_float(v); }
  static uint16_t store(float v) { return weft::float_to_half(v); }
};
struct BFloat {
  static float load(uint16_t v) { return weft::bf16_to_float(v); }
  static uint16_t store(float v) { return weft::float_to_bf16(v); }
};
struct E4m3 {
  static float load(uint8_t v) { return weft::e4m3fn_to_float(v); }
  static uint8_t store(float v) { return weft::float_to_e4m3fn(v); }
};
struct E5m2 {
  static float load(uint8_t v) { return weft::e5m2_to_float(v); }
  static uint8_t store(float v) { return weft::float_to_e5m2(v); }
};

// The narrow float conversion of a 16- or 8-bit floating dtype, as f(Conv{}).
template <typename F>
void with_conv(int32_t dtype, F&& f) {
  switch (dtype) {
    case WEFT_FLOAT16:
      return f(Half{});
    case WEFT_BFLOAT16:
      return f(BFloat{});
    case WEFT_FLOAT8_E4M3:
      return f(E4m3{});
    default:
      return f(E5m2{});
  }
}

// ---- User-defined MPI ops: the element functions of runtime/reduce.h, for float and double.

template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

// Integers run these in the unsigned type of their width, where C++ wraps by definition (uint8
// operands promote to int, where 255 * 255 still fits).
struct SumFn {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct ProdFn {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
// NaN propagates (a + b is a quiet NaN then); of two equal values the or of their bits picks -0
// from {-0, +0} (max takes the and), so the result never depends on which rank's came first.
struct MinFn {
  template <typename T>
  static T apply(T a, T b) {
    if (a != a || b != b) return a + b;
    if (a == b) return std::bit_cast<T>(std::bit_cast<BitsOf<T>>(a) | std::bit_cast<BitsOf<T>>(b));
    return a < b ? a : b;
  }
};
struct MaxFn {
  template <typename T>
  static T apply(T a, T b) {
    if (a != a || b != b) return a + b;
    if (a == b) return std::bit_cast<T>(std::bit_cast<BitsOf<T>>(a) & std::bit_cast<BitsOf<T>>(b));
    return a > b ? a : b;
  }
};

// MPI's user function contract: inout[i] = in[i] op inout[i].
template <typename T, typename Fn>
void plain_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Fn::apply(a[i], b[i]);
}

// 16- and 8-bit floats: both operands to float, one operation, rounded back once.
template <typename Conv, typename Fn>
void narrow_op(void* in, void* inout, int* len, MPI_Datatype*) {
  using S = decltype(Conv::store(0.0f));
  const S* a = static_cast<const S*>(in);
  S* b = static_cast<S*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Conv::store(Fn::apply(Conv::load(a[i]), Conv::load(b[i])));
}

// ---- Process-wide state.

// The requests of operations weft no longer waits for (detached sends, and what abort or a
// timeout left running), with the memory they read or write. Tested, never waited for; whatever
// never completes is dropped at exit.
struct Lingering {
  std::vector<MPI_Request> requests;
  std::vector<std::vector<char>> buffers;
  std::vector<std::vector<int>> ints;
};

// MPI is one per process, shared by every context and maybe by the application.
//
// Thread safety: every MPI call of the plugin holds mpi_mutex (see the top of the file); the
// fields above it are set up once under setup_mutex. Lock order: Context::mutex_, setup_mutex,
// mpi_mutex.
struct Process {
  std::mutex setup_mutex;
  bool ready = false;           // MPI initialized and the fields below set; guarded by setup_mutex
  bool we_initialized = false;  // guarded by setup_mutex
  int live_contexts = 0;        // guarded by setup_mutex
  int thread_level = MPI_THREAD_SINGLE;
  int world_rank = 0;
  int world_size = 1;
  // User-defined ops by dtype and op, where built-in ones do not mean what weft's do.
  MPI_Op user_ops[kNumDTypes][kNumOps];

  std::mutex mpi_mutex;
  std::vector<Lingering> lingering;  // guarded by mpi_mutex
  // Lingering requests are tested on every call into the plugin, and also by a thread of their
  // own while any remain: a detached send may need its sender to keep calling MPI (Open MPI's
  // TCP transport pushes a large message only while the sender progresses), and weft stops
  // calling test() once it has nothing pending. The thread runs while a context is open; it ends
  // when its generation is no longer current.
  std::thread sweeper;              // guarded by mpi_mutex
  uint64_t sweeper_generation = 0;  // guarded by mpi_mutex
  std::condition_variable sweeper_wake;

  // Tests every lingering request once; drops the entries whose requests all completed.
  // REQUIRES: mpi_mutex held.
  void sweep() {
    auto settled = [](Lingering& entry) {
      for (MPI_Request& request : entry.requests) {
        if (request == MPI_REQUEST_NULL) continue;
        int done = 0;
        // An error here belongs to an operation already reported: the request is freed anyway.
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) request = MPI_REQUEST_NULL;
      }
      return std::all_of(entry.requests.begin(), entry.requests.end(),
                         [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
    };
    lingering.erase(std::remove_if(lingering.begin(), lingering.end(), settled), lingering.end());
  }

  // REQUIRES: mpi_mutex held.
  void linger(Lingering entry) {
    lingering.push_back(std::move(entry));
    if (!sweeper.joinable()) {
      sweeper = std::thread([this, generation = ++sweeper_generation] { sweep_loop(generation); });
    } else {
      sweeper_wake.notify_one();
    }
  }

  // Sweeps while anything lingers, backing off from 50 us to 5 ms while nothing completes.
  void sweep_loop(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mpi_mutex);
    auto pause = std::chrono::microseconds(50);
    while (generation == sweeper_generation) {
      if (lingering.empty()) {
        sweeper_wake.wait(lock);
        pause = std::chrono::microseconds(50);
        continue;
      }
      const size_t before = lingering.size();
      sweep();
      pause = lingering.size() < before
                  ? std::chrono::microseconds(50)
                  : std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(5));
      sweeper_wake.wait_for(lock, pause);
    }
  }

  // Ends the sweeper thread. REQUIRES: mpi_mutex not held.
  void stop_sweeper() {
    std::thread old;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex);
      ++sweeper_generation;
      old = std::move(sweeper);
    }
    sweeper_wake.notify_all();
    if (old.joinable()) old.join();
  }
};

// Never destroyed: the atexit handler and late weft threads may still use it.
Process& process() {
  static Process* instance = new Process();
  return *instance;
}

// Finalizes MPI at exit when the plugin initialized it; not while a context is open, whose
// finalize() would call MPI afterwards (then MPI is left as it is, and mpirun says the process
// did not finalize: destroy every group before exit). Requests abandoned by an abort or a timeout
// get a second to finish; MPI calls finalizing with requests pending erroneous, but Open MPI 4.1
// does it cleanly (tested with an MPI_Iallreduce abandoned because its peer never joined), and
// not finalizing would fail the whole job at exit.
void finalize_mpi_at_exit() {
  Process& p = process();
  std::lock_guard<std::mutex> setup(p.setup_mutex);
  std::lock_guard<std::mutex> lock(p.mpi_mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || !p.we_initialized) return;
  if (p.live_contexts > 0) {
    std::fprintf(stderr,
                 "weft mpi plugin: not calling MPI_Finalize at exit: %d group(s) still open "
                 "(destroy every weft group before the process exits)\n",
                 p.live_contexts);
    return;
  }
  const auto give_up = Clock::now() + std::chrono::seconds(1);
  p.sweep();
  while (!p.lingering.empty() && Clock::now() < give_up) p.sweep();
  MPI_Finalize();
}

// Whether a launcher started this process as an MPI rank (Open MPI, or any PMIx/PMI launcher).
bool started_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

// Makes the user-defined ops. REQUIRES: mpi_mutex held.
Status create_user_ops(Process& p) {
  for (auto& row : p.user_ops) std::fill(std::begin(row), std::end(row), MPI_OP_NULL);
  struct Entry {
    int32_t dtype, op;
    MPI_User_function* fn;
  };
  const Entry entries[] = {
      {WEFT_FLOAT32, WEFT_MIN, &plain_op<float, MinFn>},
      {WEFT_FLOAT32, WEFT_MAX, &plain_op<float, MaxFn>},
      {WEFT_FLOAT64, WEFT_MIN, &plain_op<double, MinFn>},
      {WEFT_FLOAT64, WEFT_MAX, &plain_op<double, MaxFn>},
      {WEFT_FLOAT16, WEFT_SUM, &narrow_op<Half, SumFn>},
      {WEFT_FLOAT16, WEFT_PROD, &narrow_op<Half, ProdFn>},
      {WEFT_FLOAT16, WEFT_MIN, &narrow_op<Half, MinFn>},
      {WEFT_FLOAT16, WEFT_MAX, &narrow_op<Half, MaxFn>},
      {WEFT_BFLOAT16, WEFT_SUM, &narrow_op<BFloat, SumFn>},
      {WEFT_BFLOAT16, WEFT_PROD, &narrow_op<BFloat, ProdFn>},
      {WEFT_BFLOAT16, WEFT_MIN, &narrow_op<BFloat, MinFn>},
      {WEFT_BFLOAT16, WEFT_MAX, &narrow_op<BFloat, MaxFn>},
      {WEFT_FLOAT8_E4M3, WEFT_SUM, &narrow_op<E4m3, SumFn>},
      {WEFT_FLOAT8_E4M3, WEFT_PROD, &narrow_op<E4m3, ProdFn>},
      {WEFT_FLOAT8_E4M3, WEFT_MIN, &narrow_op<E4m3, MinFn>},
      {WEFT_FLOAT8_E4M3, WEFT_MAX, &narrow_op<E4m3, MaxFn>},
      {WEFT_FLOAT8_E5M2, WEFT_SUM, &narrow_op<E5m2, SumFn>},
      {WEFT_FLOAT8_E5M2, WEFT_PROD, &narrow_op<E5m2, ProdFn>},
      {WEFT_FLOAT8_E5M2, WEFT_MIN, &narrow_op<E5m2, MinFn>},
      {WEFT_FLOAT8_E5M2, WEFT_MAX, &narrow_op<E5m2, MaxFn>},
      {WEFT_INT8, WEFT_SUM, &plain_op<uint8_t, SumFn>},
      {WEFT_INT8, WEFT_PROD, &plain_op<uint8_t, ProdFn>},
      {WEFT_UINT8, WEFT_SUM, &plain_op<uint8_t, SumFn>},
      {WEFT_UINT8, WEFT_PROD, &plain_op<uint8_t, ProdFn>},
      {WEFT_INT32, WEFT_SUM, &plain_op<uint32_t, SumFn>},
      {WEFT_INT32, WEFT_PROD, &plain_op<uint32_t, ProdFn>},
      {WEFT_INT64, WEFT_SUM, &plain_op<uint64_t, SumFn>},
      {WEFT_INT64, WEFT_PROD, &plain_op<uint64_t, ProdFn>},
      {WEFT_UINT32, WEFT_SUM, &plain_op<uint32_t, SumFn>},
      {WEFT_UINT32, WEFT_PROD, &plain_op<uint32_t, ProdFn>},
      {WEFT_UINT64, WEFT_SUM, &plain_op<uint64_t, SumFn>},
      {WEFT_UINT64, WEFT_PROD, &plain_op<uint64_t, ProdFn>},
  };
  for (const Entry& e : entries) {
    const int rc = MPI_Op_create(e.fn, /*commute=*/1, &p.user_ops[e.dtype][e.op]);
    if (rc != MPI_SUCCESS) return mpi_failure("MPI_Op_create", rc);
  }
  return {};
}

// Initializes MPI if nobody has, once per process, and counts one more context.
Status attach(const weftInitArgs_v1_t& args) {
  Process& p = process();
  std::lock_guard<std::mutex> setup(p.setup_mutex);
  if (!p.ready) {
    std::lock_guard<std::mutex> lock(p.mpi_mutex);
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
      return fail(WEFT_ERR_INVALID_ARGUMENT, "MPI was finalized already: it cannot be used again");
    }
    if (!initialized) {
      if (args.size > 1 && !started_by_mpi_launcher()) {
        return fail(WEFT_ERR_INVALID_ARGUMENT,
                    "this process was not started by mpirun (no OMPI_COMM_WORLD_SIZE, PMIX_RANK "
                    "or PMI_RANK in its environment): a group of " +
                        std::to_string(args.size) +
                        " ranks over MPI needs every rank started as an MPI process, e.g. "
                        "mpirun -n " +
                        std::to_string(args.size) + " PROGRAM");
      }
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &p.thread_level);
      if (rc != MPI_SUCCESS) return mpi_failure("MPI_Init_thread", rc);
      p.we_initialized = true;
      std::atexit(finalize_mpi_at_exit);
    } else {
      MPI_Query_thread(&p.thread_level);
    }
    if (p.thread_level < MPI_THREAD_SERIALIZED) {
      return fail(WEFT_ERR_UNSUPPORTED,
                  std::string("MPI runs at ") + thread_level_name(p.thread_level) +
                      ", but weft calls the plugin from several threads: initialize MPI with "
                      "MPI_THREAD_MULTIPLE (or at least MPI_THREAD_SERIALIZED, if the "
                      "application never calls MPI while weft runs)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &p.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p.world_size);
    Status made = create_user_ops(p);
    if (!made.ok()) return made;
    p.ready = true;
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string line = std::string(p.we_initialized ? "initialized" : "found") + " MPI at " +
                       thread_level_name(p.thread_level) + ": " +
                       std::string(version, strnlen(version, sizeof version));
    line = line.substr(0, line.find('\n'));
    args.log(args.log_ctx, WEFT_LOG_DEBUG, line.c_str());
  }
  ++p.live_contexts;
  return {};
}

void detach() {
  Process& p = process();
  std::lock_guard<std::mutex> setup(p.setup_mutex);
  // The last group gone, nothing calls MPI from weft's side any more (the application may
  // finalize it now): neither does the sweeper.
  if (--p.live_contexts == 0) p.stop_sweeper();
}

// ---- Reductions.

struct Reduction {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  bool premultiply = false;  // premul_sum: sum a copy of the input scaled by the factor
  bool average = false;      // avg: divide the sum by the group's size afterwards
};

// The MPI type and op that compute weft's `op` on `dtype` (runtime/reduce.h's semantics).
Status reduction_for(int32_t dtype, int32_t op, Reduction* out) {
  const Process& p = process();
  const bool bitwise = op == WEFT_BAND || op == WEFT_BOR || op == WEFT_BXOR;
  const std::string what = std::string(op_name(op)) + " on " + dtype_name(dtype);
  if (op < 0 || op >= kNumOps || dtype < 0 || dtype >= kNumDTypes) {
    return fail(WEFT_ERR_INVALID_ARGUMENT, "unknown reduction " + what);
  }
  out->premultiply = op == WEFT_PREMUL_SUM;
  out->average = op == WEFT_AVG;
  // avg and premul_sum reduce exactly as sum does.
  const int32_t base = out->premultiply || out->average ? WEFT_SUM : op;
  if (is_floating(dtype)) {
    if (bitwise) return fail(WEFT_ERR_INVALID_ARGUMENT, what + " is not defined");
    const bool builtin =
        (dtype == WEFT_FLOAT32 || dtype == WEFT_FLOAT64) && (base == WEFT_SUM || base == WEFT_PROD);
    out->type = dtype == WEFT_FLOAT32   ? MPI_FLOAT
                : dtype == WEFT_FLOAT64 ? MPI_DOUBLE
                : is_fp8(dtype)         ? MPI_UINT8_T
                                        : MPI_UINT16_T;
    out->op = builtin ? (base == WEFT_SUM ? MPI_SUM : MPI_PROD) : p.user_ops[dtype][base];
    return {};
  }
  if (out->premultiply) return fail(WEFT_ERR_INVALID_ARGUMENT, what + " is not defined");
  if (dtype == WEFT_BOOL) {
    if (out->average) return fail(WEFT_ERR_INVALID_ARGUMENT, what + " is not defined");
    // One byte each, any non-zero byte true: MPI's logical ops on bytes give 0 or 1.
    out->type = MPI_UINT8_T;
    out->op = base == WEFT_SUM || base == WEFT_MAX || base == WEFT_BOR ? MPI_LOR
              : base == WEFT_BXOR                                      ? MPI_LXOR
                                                                       : MPI_LAND;
    return {};
  }
  // Integers: sum and prod wrap (user ops, in the unsigned type of the same width); min and max
  // in the dtype's own type.
  const bool is_signed = dtype == WEFT_INT8 || dtype == WEFT_INT32 || dtype == WEFT_INT64;
  const MPI_Datatype unsigned_type = bits_type(dtype_size(dtype));
  const MPI_Datatype signed_type = dtype == WEFT_INT8    ? MPI_INT8_T
                                   : dtype == WEFT_INT32 ? MPI_INT32_T
                                                         : MPI_INT64_T;
  switch (base) {
    case WEFT_SUM:
    case WEFT_PROD:
      out->op = p.user_ops[dtype][base];
      break;
    case WEFT_MIN:
      out->op = MPI_MIN;
      break;
    case WEFT_MAX:
      out->op = MPI_MAX;
      break;
    case WEFT_BAND:
      out->op = MPI_BAND;
      break;
    case WEFT_BOR:
      out->op = MPI_BOR;
      break;
    default:
      out->op = MPI_BXOR;
      break;
  }
  out->type = is_signed && (base == WEFT_MIN || base == WEFT_MAX) ? signed_type : unsigned_type;
  return {};
}

// dst[i] = src[i] * factor, the factor rounded to the dtype's arithmetic type first (float for
// float32, float16, bfloat16 and fp8; double for float64), the product stored in the dtype.
void premultiply(void* dst, const void* src, uint64_t count, int32_t dtype, double factor) {
  switch (dtype) {
    case WEFT_FLOAT32: {
      const float f = static_cast<float>(factor);
      for (uint64_t i = 0; i < count; ++i) {
        static_cast<float*>(dst)[i] = static_cast<const float*>(src)[i] * f;
      }
      return;
    }
    case WEFT_FLOAT64:
      for (uint64_t i = 0; i < count; ++i) {
        static_cast<double*>(dst)[i] = static_cast<const double*>(src)[i] * factor;
      }
      return;
    default: {
      const float f = static_cast<float>(factor);
      with_conv(dtype, [&](auto conv) {
        using Conv = decltype(conv);
        using S = decltype(Conv::store(0.0f));
        const auto* s = static_cast<const S*>(src);
        auto* d = static_cast<S*>(dst);
        for (uint64_t i = 0; i < count; ++i) d[i] = Conv::store(Conv::load(s[i]) * f);
      });
      return;
    }
  }
}

// avg's last step: data[i] /= size, rounded once for floats, truncating toward zero for
// integers (computed in int or int64, wide enough for any size).
void divide(void* data, uint64_t count, int32_t dtype, int size) {
  auto each = [&](auto* d, auto divisor) {
    for (uint64_t i = 0; i < count; ++i) {
      d[i] = static_cast<std::remove_reference_t<decltype(d[i])>>(d[i] / divisor);
    }
  };
  switch (dtype) {
    case WEFT_FLOAT32:
      return each(static_cast<float*>(data), static_cast<float>(size));
    case WEFT_FLOAT64:
      return each(static_cast<double*>(data), static_cast<double>(size));
    case WEFT_INT8:
      return each(static_cast<int8_t*>(data), size);
    case WEFT_UINT8:
      return each(static_cast<uint8_t*>(data), size);
    case WEFT_INT32:
      return each(static_cast<int32_t*>(data), size);
    case WEFT_INT64:
      return each(static_cast<int64_t*>(data), static_cast<int64_t>(size));
    case WEFT_UINT32:
      return each(static_cast<uint32_t*>(data), static_cast<uint64_t>(size));
    case WEFT_UINT64:
      return each(static_cast<uint64_t*>(data), static_cast<uint64_t>(size));
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16:
    case WEFT_FLOAT8_E4M3:
    case WEFT_FLOAT8_E5M2: {
      const float divisor = static_cast<float>(size);
      with_conv(dtype, [&](auto conv) {
        using Conv = decltype(conv);
        auto* d = static_cast<decltype(Conv::store(0.0f))*>(data);
        for (uint64_t i = 0; i < count; ++i) d[i] = Conv::store(Conv::load(d[i]) / divisor);
      });
      return;
    }
    default:
      return;
  }
}

// ---- Operations, as the plugin keeps them (the descriptors live only during post()).

struct Buffer {
  void* data = nullptr;
  uint64_t count = 0;
};

struct Op {
  int32_t kind = WEFT_COLL_BARRIER;
  int32_t op = WEFT_SUM;
  double factor = 1;
  uint64_t seq = 0;
  int32_t root = 0;
  int32_t peer = 0;
  uint64_t tag = 0;
  int32_t dtype = WEFT_FLOAT32;
  size_t element = 1;  // bytes per element
  bool has_input = false;
  bool has_output = false;
  Buffer input, output;
  std::vector<uint64_t> counts, send_counts, recv_counts;

  // "all_reduce #12", "send to 3 tag 5": how messages name it.
  std::string describe() const {
    if (kind == WEFT_COLL_SEND)
      return "send to " + std::to_string(peer) + " tag " + std::to_string(tag);
    if (kind == WEFT_COLL_RECV)
      return "recv from " + std::to_string(peer) + " tag " + std::to_string(tag);
    return std::string(kind_name(kind)) + " #" + std::to_string(seq);
  }
  char* in() const { return static_cast<char*>(input.data); }
  char* out() const { return static_cast<char*>(output.data); }
};

// The element counts MPI takes are ints.
bool fits_int(uint64_t n) { return n <= static_cast<uint64_t>(INT_MAX); }

Status copy_op(const weftCollective_v1_t& c, int size, Op* op) {
  op->kind = c.kind;
  op->op = c.op;
  op->factor = c.op_factor;
  op->seq = c.seq;
  op->root = c.root;
  op->peer = c.peer;
  op->tag = c.tag;
  if (c.kind < 0 || c.kind > WEFT_COLL_RECV) {
    return fail(WEFT_ERR_UNSUPPORTED,
                "operation kind " + std::to_string(c.kind) + " is newer than this plugin");
  }
  if (c.num_inputs > 1 || c.num_outputs > 1) {
    return fail(WEFT_ERR_INTERNAL, std::string(kind_name(c.kind)) + " with " +
                                       std::to_string(c.num_inputs) + " inputs and " +
                                       std::to_string(c.num_outputs) +
                                       " outputs: plugin.h's table has at most one of each");
  }
  const weftTensor_v1_t* first = c.num_inputs > 0 ? &c.inputs[0] : nullptr;
  if (first == nullptr && c.num_outputs > 0) first = &c.outputs[0];
  if (first != nullptr) {
    op->dtype = first->dtype;
    op->element = dtype_size(first->dtype);
    if (op->element == 0) {
      return fail(WEFT_ERR_UNSUPPORTED,
                  "dtype " + std::to_string(first->dtype) + " is newer than this plugin");
    }
  }
  for (uint32_t i = 0; i < c.num_inputs + c.num_outputs; ++i) {
    const weftTensor_v1_t& t = i < c.num_inputs ? c.inputs[i] : c.outputs[i - c.num_inputs];
    if (t.device_kind != WEFT_DEVICE_CPU) {
      return fail(WEFT_ERR_UNSUPPORTED, "the mpi plugin serves host memory only");
    }
    if (!fits_int(t.count)) {
      return fail(WEFT_ERR_UNSUPPORTED, std::to_string(t.count) +
                                            " elements: past the 2^31 - 1 elements MPI 3's "
                                            "calls take (MPI 4's large-count calls are not used)");
    }
  }
  op->has_input = c.num_inputs == 1;
  op->has_output = c.num_outputs == 1;
  if (op->has_input) op->input = Buffer{c.inputs[0].data, c.inputs[0].count};
  if (op->has_output) op->output = Buffer{c.outputs[0].data, c.outputs[0].count};
  auto copy = [&](const uint64_t* from, std::vector<uint64_t>& to) {
    if (from == nullptr) return true;
    to.assign(from, from + size);
    uint64_t total = 0;
    for (uint64_t n : to) total += n;
    return fits_int(total);
  };
  if (!copy(c.counts, op->counts) || !copy(c.send_counts, op->send_counts) ||
      !copy(c.recv_counts, op->recv_counts)) {
    return fail(WEFT_ERR_UNSUPPORTED, std::string(kind_name(c.kind)) +
                                          " of more than 2^31 - 1 elements in all: past what "
                                          "MPI 3's displacements take");
  }
  if (c.kind == WEFT_COLL_ALL_REDUCE || c.kind == WEFT_COLL_REDUCE ||
      c.kind == WEFT_COLL_REDUCE_SCATTER) {
    Reduction unused;
    Status status = reduction_for(op->dtype, op->op, &unused);
    if (!status.ok()) return status;
  }
  return {};
}

// A stage of a unit: one collective, or a run of consecutive sends and receives started at once.
struct Stage {
  size_t begin = 0;
  size_t end = 0;
};

// A receive whose tag is too large for MPI, waiting for the header that says which MPI tag its
// payload comes on.
struct LargeRecv {
  int peer = 0;
  uint64_t tag = 0;
  void* data = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  uint64_t bytes = 0;  // the buffer's size
  bool matched = false;
};

// A started stage: its MPI requests, the memory the plugin owns for them, and what to do once
// they all completed.
struct InFlight {
  std::string call;  // the MPI call, for messages: "MPI_Iallreduce"
  bool p2p = false;
  Clock::time_point deadline = Clock::time_point::max();
  std::vector<MPI_Request> requests;
  std::vector<bool> receives;              // by request: a receive, which MPI_Cancel can stop
  std::vector<std::vector<char>> buffers;  // moving the vector keeps each buffer in place
  std::vector<std::vector<int>> ints;
  std::vector<LargeRecv> large_recvs;
  std::function<void()> finish;

  char* buffer(size_t bytes) {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
  // MPI's int counts and their displacements (prefix sums), kept until completion as MPI asks.
  const int* counts(const std::vector<uint64_t>& from) {
    ints.emplace_back(from.begin(), from.end());
    return ints.back().data();
  }
  const int* displacements(const std::vector<uint64_t>& from) {
    std::vector<int> d(from.size(), 0);
    for (size_t i = 1; i < from.size(); ++i) d[i] = d[i - 1] + static_cast<int>(from[i - 1]);
    ints.push_back(std::move(d));
    return ints.back().data();
  }
  MPI_Request* request(bool receive = false) {
    requests.push_back(MPI_REQUEST_NULL);
    receives.push_back(receive);
    return &requests.back();
  }
};

// One post(): its operations and stages, and where it stands. Owned by weft as the request from
// post() until release().
struct Unit {
  std::vector<Op> ops;
  std::vector<Stage> stages;
  size_t next = 0;       // the stage to start or running
  bool running = false;  // stage `next` was started
  InFlight flight;
  bool done = false;
  Status status;

  // What a failure message starts with: weft already names a single operation; in a coalesced
  // unit, which one failed ("operation 3 of 9 (reduce_scatter #5): "), or which run of sends
  // and receives ("operations 8 to 9 of 9 (sends and receives): ").
  std::string where(const Stage& stage) const {
    if (ops.size() == 1) return "";
    const std::string of = " of " + std::to_string(ops.size());
    if (stage.end - stage.begin == 1) {
      return "operation " + std::to_string(stage.begin + 1) + of + " (" +
             ops[stage.begin].describe() + "): ";
    }
    return "operations " + std::to_string(stage.begin + 1) + " to " + std::to_string(stage.end) +
           of + " (sends and receives): ";
  }
};

// Collectives on their own, runs of sends and receives together (see the top of the file).
std::vector<Stage> plan(const std::vector<Op>& ops) {
  std::vector<Stage> stages;
  for (size_t i = 0; i < ops.size();) {
    size_t end = i + 1;
    if (is_p2p(ops[i].kind)) {
      while (end < ops.size() && is_p2p(ops[end].kind)) ++end;
    }
    stages.push_back(Stage{i, end});
    i = end;
  }
  return stages;
}

// ---- A context: one weft group on one MPI communicator.
//
// Thread safety: post() (the group's thread) and test()/release() (weft's poller) lock mutex_,
// then process().mpi_mutex around MPI calls; abort() only sets abort_requested_ and the reason
// under abort_mutex_, so it never waits for MPI. Ownership: units belong to weft between post()
// and release(); queue_ points to those not done yet.
class Context {
 public:
  explicit Context(const weftInitArgs_v1_t& args)
      : rank_(args.rank),
        size_(args.size),
        group_(args.group_name != nullptr ? args.group_name : ""),
        timeout_(args.timeout_ms),
        global_ranks_(args.global_ranks, args.global_ranks + args.size),
        log_(args.log),
        log_ctx_(args.log_ctx),
        large_sent_(args.size, 0),
        headers_(args.size),
        header_requests_(args.size, MPI_REQUEST_NULL),
        header_buffers_(args.size, std::vector<char>(sizeof(Header))) {}

  Status connect(const weftInitArgs_v1_t& args);
  weft_result_t post(const weftCollective_v1_t* ops, uint32_t num, void** request, Status* refusal);
  weft_result_t test(Unit& unit, int32_t* done, Status* outcome);
  void abort(const char* reason);
  void finalize();

 private:
  // A header before a payload whose weft tag is too large for MPI (see the top of the file).
  struct Header {
    uint64_t tag = 0;
    uint64_t serial = 0;  // the payload's MPI tag is payload_tag(serial)
    uint64_t bytes = 0;
  };

  void log(int32_t level, const std::string& line) const { log_(log_ctx_, level, line.c_str()); }

  Status exchange_ranks(const weftStore_v1_t& store);
  int payload_tag(uint64_t serial) const {
    return direct_tags_ + static_cast<int>(serial % static_cast<uint64_t>(tag_ub_ - direct_tags_));
  }

  // REQUIRES for all below: mutex_ and process().mpi_mutex held.
  void progress();
  void advance(Unit& unit);
  Status start(Unit& unit, size_t i);
  Status start_collective(const Op& op, InFlight& f);
  Status start_p2p(const Op& op, InFlight& f);
  Status test_flight(InFlight& f, bool* complete);
  Status match_large_recvs(InFlight& f);
  void abandon(InFlight& f);
  void finish(Unit& unit, Status status);
  void linger(InFlight& f);

  const int rank_;
  const int size_;
  const std::string group_;
  const int64_t timeout_;
  const std::vector<int32_t> global_ranks_;
  const weftLogger_v1_t log_;
  void* const log_ctx_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ub_ = 32767;       // MPI_TAG_UB; also the header's control tag
  int direct_tags_ = 16384;  // weft tags below this are MPI tags as they are

  std::atomic<bool> abort_requested_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_

  std::mutex mutex_;
  std::deque<Unit*> queue_;  // posted, not done, in posting order; guarded by mutex_
  Status broken_;            // the failure that left the context unusable; guarded by mutex_
  // Large tags, by peer; guarded by mutex_.
  std::vector<uint64_t> large_sent_;          // headers sent so far: the next serial
  std::vector<std::deque<Header>> headers_;   // received, not matched to a receive yet
  std::vector<MPI_Request> header_requests_;  // the header receive in flight, if any
  // Where each lands: heap buffers, so that one still in MPI at finalize() can linger.
  std::vector<std::vector<char>> header_buffers_;
};

Status Context::exchange_ranks(const weftStore_v1_t& store) {
  const Process& p = process();
  // Each rank says which MPI process it is; every rank checks the group maps onto MPI_COMM_WORLD
  // as weft says. Waiting for all keys also bounds the wait for peers by the group's timeout,
  // which MPI_Comm_create_group below cannot do.
  const std::string mine = std::to_string(p.world_rank) + " " + std::to_string(p.world_size);
  const std::string my_key = "mpi/rank/" + std::to_string(rank_);
  weft_result_t rc = store.set(store.ctx, my_key.c_str(), mine.data(), mine.size());
  if (rc != WEFT_SUCCESS) return fail(rc, "store set " + my_key + " failed");
  std::vector<std::string> keys;
  std::vector<const char*> key_ptrs;
  for (int r = 0; r < size_; ++r) keys.push_back("mpi/rank/" + std::to_string(r));
  for (const std::string& k : keys) key_ptrs.push_back(k.c_str());
  std::vector<void*> values(size_, nullptr);
  std::vector<size_t> sizes(size_, 0);
  rc =
      store.multi_get(store.ctx, key_ptrs.data(), key_ptrs.size(), -1, values.data(), sizes.data());
  if (rc != WEFT_SUCCESS) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      int32_t exists = 1;
      const char* key = key_ptrs[r];
      if (store.check(store.ctx, &key, 1, &exists) == WEFT_SUCCESS && !exists) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    return fail(
        rc, missing.empty()
                ? "exchanging MPI ranks through the store failed (code " + std::to_string(rc) + ")"
                : "rank(s) " + missing + " of the group did not reach init within " +
                      std::to_string(timeout_) + " ms");
  }
  Status status;
  for (int r = 0; r < size_; ++r) {
    const std::string value(static_cast<const char*>(values[r]), sizes[r]);
    store.free_value(store.ctx, values[r]);
    int world_rank = -1;
    int world_size = -1;
    std::sscanf(value.c_str(), "%d %d", &world_rank, &world_size);
    if (!status.ok()) continue;
    if (world_size != p.world_size) {
      status = fail(WEFT_ERR_INVALID_ARGUMENT,
                    "group rank " + std::to_string(r) + " runs in an MPI job of " +
                        std::to_string(world_size) + " processes, this one in one of " +
                        std::to_string(p.world_size) + ": are they under one mpirun?");
    } else if (world_rank != global_ranks_[r]) {
      status = fail(WEFT_ERR_INVALID_ARGUMENT,
                    "group rank " + std::to_string(r) + " is weft world rank " +
                        std::to_string(global_ranks_[r]) + " but MPI_COMM_WORLD rank " +
                        std::to_string(world_rank) +
                        ": weft's world ranks must be MPI's (rendezvous through env:// under "
                        "mpirun, or pass OMPI_COMM_WORLD_RANK as the rank)");
    }
  }
  return status;
}

Status Context::connect(const weftInitArgs_v1_t& args) {
  Process& p = process();
  for (int r = 0; r < size_; ++r) {
    if (global_ranks_[r] < 0 || global_ranks_[r] >= p.world_size) {
      return fail(WEFT_ERR_INVALID_ARGUMENT,
                  "group rank " + std::to_string(r) + " is weft world rank " +
                      std::to_string(global_ranks_[r]) + ", outside MPI_COMM_WORLD's " +
                      std::to_string(p.world_size) +
                      " processes: weft's world must be the MPI job (start it with mpirun -n " +
                      "WORLD_SIZE)");
    }
  }
  if (global_ranks_[rank_] != p.world_rank) {
    return fail(WEFT_ERR_INVALID_ARGUMENT,
                "this process is weft world rank " + std::to_string(global_ranks_[rank_]) +
                    " but MPI_COMM_WORLD rank " + std::to_string(p.world_rank) +
                    ": weft's world ranks must be MPI's (rendezvous through env:// under "
                    "mpirun, or pass OMPI_COMM_WORLD_RANK as the rank)");
  }
  Status exchanged = exchange_ranks(*args.store);
  if (!exchanged.ok()) return exchanged;

  // MPI_Comm_create_group is collective over the group's members only. Its tag tells apart
  // creations that run at once; weft's group names are unique, so a hash of the name does.
  const uint32_t name_hash = std::hash<std::string>{}(group_)&0x7fffu;
  {
    std::unique_lock<std::mutex> lock(p.mpi_mutex, std::defer_lock);
    if (p.thread_level != MPI_THREAD_MULTIPLE) lock.lock();
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    int rc = MPI_Group_incl(world_group, size_, global_ranks_.data(), &group);
    if (rc == MPI_SUCCESS) {
      rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, static_cast<int>(name_hash), &comm_);
    }
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS) return mpi_failure("MPI_Comm_create_group", rc);
  }
  std::lock_guard<std::mutex> lock(p.mpi_mutex);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  int comm_rank = -1;
  MPI_Comm_rank(comm_, &comm_rank);
  if (comm_rank != rank_) {
    return fail(WEFT_ERR_INTERNAL, "MPI_Comm_create_group made this process rank " +
                                       std::to_string(comm_rank) + ", not " +
                                       std::to_string(rank_));
  }
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);  // set on the world only
  if (found && tag_ub != nullptr && *tag_ub >= 32767) tag_ub_ = *tag_ub;
  direct_tags_ = tag_ub_ / 2 + 1;
  log(WEFT_LOG_DEBUG, "MPI communicator of " + std::to_string(size_) + " ranks; tags below " +
                          std::to_string(direct_tags_) + " go to MPI as they are");
  return {};
}

weft_result_t Context::post(const weftCollective_v1_t* ops, uint32_t num, void** request,
                            Status* refusal) {
  auto unit = std::make_unique<Unit>();
  unit->ops.resize(num);
  for (uint32_t i = 0; i < num; ++i) {
    Status status = copy_op(ops[i], size_, &unit->ops[i]);
    if (!status.ok()) {
      *refusal = status;
      return status.code;
    }
  }
  unit->stages = plan(unit->ops);
  std::lock_guard<std::mutex> lock(mutex_);
  if (abort_requested_) {
    std::lock_guard<std::mutex> reason(abort_mutex_);
    *refusal = fail(WEFT_ERR_ABORTED, "aborted: " + abort_reason_);
    return refusal->code;
  }
  if (!broken_.ok()) {
    *refusal = fail(broken_.code,
                    "not run: an earlier failure left the group unusable: " + broken_.message);
    return refusal->code;
  }
  queue_.push_back(unit.get());
  if (queue_.size() == 1) {
    // Nothing runs before it: start it now rather than at weft's next poll.
    std::lock_guard<std::mutex> mpi(process().mpi_mutex);
    progress();
  }
  *request = unit.release();
  return WEFT_SUCCESS;
}

weft_result_t Context::test(Unit& unit, int32_t* done, Status* outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!unit.done) {
    std::lock_guard<std::mutex> mpi(process().mpi_mutex);
    progress();
  }
  *done = unit.done ? 1 : 0;
  if (!unit.done) return WEFT_SUCCESS;
  *outcome = unit.status;
  return unit.status.code;
}

void Context::abort(const char* reason) {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (abort_requested_) return;  // the first reason stands
  abort_reason_ = reason != nullptr && *reason != '\0' ? reason : "the group was aborted";
  abort_requested_ = true;
}

void Context::progress() {
  process().sweep();
  if (abort_requested_ && broken_.ok()) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    broken_ = fail(WEFT_ERR_ABORTED, "aborted: " + abort_reason_);
  }
  while (!queue_.empty()) {
    Unit& unit = *queue_.front();
    if (broken_.ok()) advance(unit);
    if (!unit.done && !broken_.ok()) {
      // Aborted, or a unit before it failed: it fails too, without waiting for anything.
      const bool was_running = unit.running;
      abandon(unit.flight);
      std::string why =
          broken_.code == WEFT_ERR_ABORTED
              ? broken_.message
              : "not run: an earlier failure left the group unusable: " + broken_.message;
      if (was_running && broken_.code == WEFT_ERR_ABORTED) {
        why +=
            " (its MPI operations were left to finish in the background: its buffers may "
            "still be written)";
      }
      finish(unit, fail(broken_.code, why));
    }
    if (!unit.done) return;
    queue_.pop_front();
    if (!unit.status.ok() && broken_.ok()) {
      broken_ = unit.status;
      log(WEFT_LOG_WARN, "the group is unusable after: " + unit.status.message);
    }
  }
}

void Context::advance(Unit& unit) {
  while (unit.next < unit.stages.size()) {
    const Stage& stage = unit.stages[unit.next];
    if (!unit.running) {
      unit.flight = InFlight{};
      if (timeout_ > 0) unit.flight.deadline = Clock::now() + std::chrono::milliseconds(timeout_);
      unit.running = true;
      for (size_t i = stage.begin; i < stage.end; ++i) {
        Status started = start(unit, i);
        if (!started.ok()) {
          abandon(unit.flight);
          std::string where = unit.where(stage);
          if (stage.end - stage.begin > 1) where += unit.ops[i].describe() + ": ";
          return finish(unit, fail(started.code, where + started.message));
        }
      }
    }
    bool complete = false;
    Status tested = test_flight(unit.flight, &complete);
    if (!tested.ok() || (!complete && Clock::now() > unit.flight.deadline)) {
      if (tested.ok()) {
        tested = fail(WEFT_ERR_TIMEOUT,
                      unit.flight.call + " did not complete within " + std::to_string(timeout_) +
                          " ms: a rank is missing, stuck, or issued different operations");
      }
      abandon(unit.flight);
      return finish(unit, fail(tested.code, unit.where(stage) + tested.message));
    }
    if (!complete) return;
    if (unit.flight.finish) unit.flight.finish();
    unit.flight = InFlight{};
    unit.running = false;
    ++unit.next;
  }
  finish(unit, Status{});
}

void Context::finish(Unit& unit, Status status) {
  unit.running = false;
  unit.done = true;
  unit.status = std::move(status);
}

Status Context::start(Unit& unit, size_t i) {
  const Op& op = unit.ops[i];
  return is_p2p(op.kind) ? start_p2p(op, unit.flight) : start_collective(op, unit.flight);
}

Status Context::start_collective(const Op& op, InFlight& f) {
  const MPI_Datatype bits = bits_type(op.element);
  const size_t element = op.element;
  int rc = MPI_SUCCESS;
  Reduction red;
  if (op.kind == WEFT_COLL_ALL_REDUCE || op.kind == WEFT_COLL_REDUCE ||
      op.kind == WEFT_COLL_REDUCE_SCATTER) {
    Status status = reduction_for(op.dtype, op.op, &red);
    if (!status.ok()) return status;
  }
  // premul_sum sends a scaled copy of the input; otherwise the input itself.
  auto source = [&](const Buffer& input) -> const void* {
    if (!red.premultiply) return input.data;
    char* copy = f.buffer(input.count * element);
    premultiply(copy, input.data, input.count, op.dtype, op.factor);
    return copy;
  };
  const int size = size_;
  const int32_t dtype = op.dtype;
  switch (op.kind) {
    case WEFT_COLL_ALL_REDUCE: {
      f.call = "MPI_Iallreduce";
      const int n = static_cast<int>(op.input.count);
      const bool in_place = op.input.data == op.output.data && !red.premultiply;
      rc = MPI_Iallreduce(in_place ? MPI_IN_PLACE : source(op.input), op.output.data, n, red.type,
                          red.op, comm_, f.request());
      if (red.average) {
        f.finish = [out = op.output, dtype, size] { divide(out.data, out.count, dtype, size); };
      }
      break;
    }
    case WEFT_COLL_REDUCE: {
      f.call = "MPI_Ireduce";
      const int n = static_cast<int>(op.input.count);
      const bool root = rank_ == op.root;
      const bool in_place = root && op.input.data == op.output.data && !red.premultiply;
      rc = MPI_Ireduce(in_place ? MPI_IN_PLACE : source(op.input), root ? op.output.data : nullptr,
                       n, red.type, red.op, op.root, comm_, f.request());
      if (red.average && root) {
        f.finish = [out = op.output, dtype, size] { divide(out.data, out.count, dtype, size); };
      }
      break;
    }
    case WEFT_COLL_BROADCAST: {
      f.call = "MPI_Ibcast";
      if (rank_ == op.root && op.input.data != op.output.data && op.output.count > 0) {
        std::memcpy(op.output.data, op.input.data, op.output.count * element);
      }
      rc = MPI_Ibcast(op.output.data, static_cast<int>(op.output.count), bits, op.root, comm_,
                      f.request());
      break;
    }
    case WEFT_COLL_ALL_GATHER: {
      f.call = "MPI_Iallgatherv";
      const int* counts = f.counts(op.counts);
      const int* displs = f.displacements(op.counts);
      const bool in_place =
          op.input.data == op.out() + static_cast<size_t>(displs[rank_]) * element;
      rc = MPI_Iallgatherv(in_place ? MPI_IN_PLACE : op.input.data, counts[rank_], bits,
                           op.output.data, counts, displs, bits, comm_, f.request());
      break;
    }
    case WEFT_COLL_REDUCE_SCATTER: {
      f.call = "MPI_Ireduce_scatter";
      // MPI_IN_PLACE would leave the result at the start of the buffer, not at this rank's
      // block: in place, receive into scratch and copy it there afterwards.
      const uint64_t mine = op.counts[rank_];
      const auto out = reinterpret_cast<uintptr_t>(op.output.data);
      const auto in = reinterpret_cast<uintptr_t>(op.input.data);
      const bool in_place = out != 0 && out >= in && out < in + op.input.count * element;
      void* receive = in_place ? f.buffer(mine * element) : op.output.data;
      rc = MPI_Ireduce_scatter(source(op.input), receive, f.counts(op.counts), red.type, red.op,
                               comm_, f.request());
      f.finish = [out = op.output, receive, in_place, avg = red.average, dtype, size, element] {
        if (in_place && out.count > 0) std::memcpy(out.data, receive, out.count * element);
        if (avg) divide(out.data, out.count, dtype, size);
      };
      break;
    }
    case WEFT_COLL_GATHER: {
      f.call = "MPI_Igather";
      const int n = static_cast<int>(op.input.count);
      const bool root = rank_ == op.root;
      const bool in_place =
          root && op.input.data == op.out() + static_cast<size_t>(rank_) * op.input.count * element;
      rc = MPI_Igather(in_place ? MPI_IN_PLACE : op.input.data, n, bits,
                       root ? op.output.data : nullptr, n, bits, op.root, comm_, f.request());
      break;
    }
    case WEFT_COLL_SCATTER: {
      f.call = "MPI_Iscatter";
      const int n = static_cast<int>(op.output.count);
      const bool root = rank_ == op.root;
      const bool in_place = root && op.output.data == op.in() + static_cast<size_t>(rank_) *
                                                                    op.output.count * element;
      rc = MPI_Iscatter(root ? op.input.data : nullptr, n, bits,
                        in_place ? MPI_IN_PLACE : op.output.data, n, bits, op.root, comm_,
                        f.request());
      break;
    }
    case WEFT_COLL_ALL_TO_ALL: {
      f.call = "MPI_Ialltoallv";
      // In place, splits may differ per peer, which MPI_IN_PLACE does not allow: send a copy.
      const void* send = op.input.data;
      if (op.input.data == op.output.data && op.input.count > 0) {
        char* copy = f.buffer(op.input.count * element);
        std::memcpy(copy, op.input.data, op.input.count * element);
        send = copy;
      }
      rc = MPI_Ialltoallv(send, f.counts(op.send_counts), f.displacements(op.send_counts), bits,
                          op.output.data, f.counts(op.recv_counts), f.displacements(op.recv_counts),
                          bits, comm_, f.request());
      break;
    }
    case WEFT_COLL_BARRIER:
      f.call = "MPI_Ibarrier";
      rc = MPI_Ibarrier(comm_, f.request());
      break;
    default:
      return fail(WEFT_ERR_INTERNAL, "not a collective");
  }
  if (rc != MPI_SUCCESS) return mpi_failure(f.call, rc);
  return {};
}

Status Context::start_p2p(const Op& op, InFlight& f) {
  f.p2p = true;
  Process& p = process();
  const MPI_Datatype bits = bits_type(op.element);
  const bool large = op.tag >= static_cast<uint64_t>(direct_tags_);
  if (op.kind == WEFT_COLL_RECV) {
    f.call = f.call.empty() ? "MPI_Irecv" : f.call;
    const int n = static_cast<int>(op.output.count);
    if (large) {
      f.large_recvs.push_back(
          LargeRecv{op.peer, op.tag, op.output.data, n, bits, op.output.count * op.element, false});
      return {};
    }
    const int rc = MPI_Irecv(op.output.data, n, bits, op.peer, static_cast<int>(op.tag), comm_,
                             f.request(/*receive=*/true));
    return rc == MPI_SUCCESS ? Status{} : mpi_failure("MPI_Irecv", rc, true);
  }
  f.call = f.call.empty() ? "MPI_Isend" : f.call;
  const size_t bytes = op.input.count * op.element;
  const int n = static_cast<int>(op.input.count);
  int tag = static_cast<int>(op.tag);
  if (large) {
    const uint64_t serial = large_sent_[op.peer]++;
    tag = payload_tag(serial);
    Lingering header;
    header.buffers.emplace_back(sizeof(Header));
    const Header h{op.tag, serial, bytes};
    std::memcpy(header.buffers.back().data(), &h, sizeof h);
    header.requests.push_back(MPI_REQUEST_NULL);
    const int rc = MPI_Isend(header.buffers.back().data(), 3, MPI_UINT64_T, op.peer, tag_ub_, comm_,
                             &header.requests.back());
    if (rc != MPI_SUCCESS) return mpi_failure("MPI_Isend (header)", rc, true);
    p.linger(std::move(header));
  }
  if (bytes > kDetachBytes) {
    const int rc = MPI_Isend(op.input.data, n, bits, op.peer, tag, comm_, f.request());
    return rc == MPI_SUCCESS ? Status{} : mpi_failure("MPI_Isend", rc, true);
  }
  // Small: send from a copy in the background; done as far as weft is concerned.
  Lingering detached;
  detached.buffers.emplace_back(bytes);
  if (bytes > 0) std::memcpy(detached.buffers.back().data(), op.input.data, bytes);
  detached.requests.push_back(MPI_REQUEST_NULL);
  const int rc = MPI_Isend(detached.buffers.back().data(), n, bits, op.peer, tag, comm_,
                           &detached.requests.back());
  if (rc != MPI_SUCCESS) return mpi_failure("MPI_Isend", rc, true);
  p.linger(std::move(detached));
  return {};
}

Status Context::test_flight(InFlight& f, bool* complete) {
  for (MPI_Request& request : f.requests) {
    if (request == MPI_REQUEST_NULL) continue;
    int done = 0;
    const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failure(f.call, rc, f.p2p);
  }
  Status matched = match_large_recvs(f);
  if (!matched.ok()) return matched;
  *complete = std::all_of(f.requests.begin(), f.requests.end(),
                          [](MPI_Request r) { return r == MPI_REQUEST_NULL; }) &&
              std::all_of(f.large_recvs.begin(), f.large_recvs.end(),
                          [](const LargeRecv& r) { return r.matched; });
  return {};
}

// Gives each large-tag receive, in posting order, the first unmatched header of its (peer, tag),
// and posts its payload's receive; reads more headers from peers with receives still waiting.
// The k-th receive of (peer, tag) so gets the k-th send, as MPI matches small tags.
Status Context::match_large_recvs(InFlight& f) {
  for (bool more = true; more;) {
    more = false;
    for (LargeRecv& r : f.large_recvs) {
      if (r.matched) continue;
      std::deque<Header>& stash = headers_[r.peer];
      auto it =
          std::find_if(stash.begin(), stash.end(), [&](const Header& h) { return h.tag == r.tag; });
      if (it == stash.end()) continue;
      const Header header = *it;
      stash.erase(it);
      r.matched = true;
      if (header.bytes > r.bytes) {
        return fail(WEFT_ERR_INVALID_ARGUMENT,
                    "the message from rank " + std::to_string(r.peer) + " with tag " +
                        std::to_string(r.tag) + " has " + std::to_string(header.bytes) +
                        " bytes, more than the " + std::to_string(r.bytes) +
                        " bytes of the receive buffer");
      }
      const int rc = MPI_Irecv(r.data, r.count, r.type, r.peer, payload_tag(header.serial), comm_,
                               f.request(/*receive=*/true));
      if (rc != MPI_SUCCESS) return mpi_failure("MPI_Irecv", rc, true);
    }
    for (int peer = 0; peer < size_; ++peer) {
      const bool waiting =
          std::any_of(f.large_recvs.begin(), f.large_recvs.end(),
                      [&](const LargeRecv& r) { return !r.matched && r.peer == peer; });
      if (!waiting) continue;
      MPI_Request& request = header_requests_[peer];
      if (request == MPI_REQUEST_NULL) {
        const int rc = MPI_Irecv(header_buffers_[peer].data(), 3, MPI_UINT64_T, peer, tag_ub_,
                                 comm_, &request);
        if (rc != MPI_SUCCESS) return mpi_failure("MPI_Irecv (header)", rc, true);
      }
      int done = 0;
      const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return mpi_failure("MPI_Irecv (header)", rc, true);
      if (done) {
        Header header;
        std::memcpy(&header, header_buffers_[peer].data(), sizeof header);
        headers_[peer].push_back(header);
        more = true;
      }
    }
  }
  return {};
}

// Stops waiting for a stage: receives are cancelled, and every request goes on in the background
// with the memory it uses (MPI cannot cancel a collective, and a send may be underway).
void Context::abandon(InFlight& f) {
  for (size_t i = 0; i < f.requests.size(); ++i) {
    if (f.requests[i] != MPI_REQUEST_NULL && f.receives[i]) MPI_Cancel(&f.requests[i]);
  }
  linger(f);
  f.finish = nullptr;
  f.large_recvs.clear();
}

void Context::linger(InFlight& f) {
  Lingering entry;
  for (MPI_Request request : f.requests) {
    if (request != MPI_REQUEST_NULL) entry.requests.push_back(request);
  }
  f.requests.clear();
  if (entry.requests.empty()) return;
  entry.buffers = std::move(f.buffers);
  entry.ints = std::move(f.ints);
  process().linger(std::move(entry));
}

void Context::finalize() {
  std::lock_guard<std::mutex> lock(mutex_);
  int finalized = 0;
  MPI_Finalized(&finalized);  // by the application, with this group still open: nothing to free
  if (!finalized) {
    std::lock_guard<std::mutex> mpi(process().mpi_mutex);
    for (Unit* unit : queue_) abandon(unit->flight);  // none, if weft kept the contract
    queue_.clear();
    // A header receive still posted (its large-tag receive failed or was aborted) is cancelled
    // and lingers with its buffer.
    for (int peer = 0; peer < size_; ++peer) {
      if (header_requests_[peer] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&header_requests_[peer]);
      Lingering entry;
      entry.requests.push_back(header_requests_[peer]);
      entry.buffers.push_back(std::move(header_buffers_[peer]));
      process().linger(std::move(entry));
    }
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);  // freed once pending requests finish
  }
  detach();
}

// ---- The C entry points.

Context* context_of(void* context) { return static_cast<Context*>(context); }

weft_result_t mpi_init(const weftInitArgs_v1_t* args, void** context, char* error,
                       size_t error_size) {
  if (args == nullptr || context == nullptr || args->struct_size < sizeof(weftInitArgs_v1_t) ||
      args->global_ranks == nullptr || args->store == nullptr || args->log == nullptr) {
    return report(fail(WEFT_ERR_INVALID_ARGUMENT,
                       "init arguments missing, or of an older plugin.h (struct_size " +
                           std::to_string(args ? args->struct_size : 0) + ", expected " +
                           std::to_string(sizeof(weftInitArgs_v1_t)) + ")"),
                  error, error_size);
  }
  if (args->device_kind != WEFT_DEVICE_CPU) {
    return report(fail(WEFT_ERR_UNSUPPORTED, "the mpi plugin serves the cpu only"), error,
                  error_size);
  }
  Status attached = attach(*args);
  if (!attached.ok()) return report(attached, error, error_size);
  auto ctx = std::make_unique<Context>(*args);
  Status connected = ctx->connect(*args);
  if (!connected.ok()) {
    ctx->finalize();
    return report(connected, error, error_size);
  }
  *context = ctx.release();
  return WEFT_SUCCESS;
}

weft_result_t mpi_post(void* context, const weftCollective_v1_t* ops, uint32_t num,
                       weftDone_v1_t done, void*, void** request, char* error, size_t error_size) {
  if (done != nullptr || request == nullptr) {
    return report(fail(WEFT_ERR_INTERNAL,
                       "the mpi plugin completes through test(): post() needs a request pointer "
                       "and no done callback"),
                  error, error_size);
  }
  Status refusal;
  const weft_result_t result = context_of(context)->post(ops, num, request, &refusal);
  return result == WEFT_SUCCESS ? result : report(refusal, error, error_size);
}

weft_result_t mpi_test(void* context, void* request, int32_t* done, char* error,
                       size_t error_size) {
  Status outcome;
  const weft_result_t result =
      context_of(context)->test(*static_cast<Unit*>(request), done, &outcome);
  return *done ? report(outcome, error, error_size) : result;
}

void mpi_release(void*, void* request) { delete static_cast<Unit*>(request); }

void mpi_abort(void* context, const char* reason) { context_of(context)->abort(reason); }

void mpi_finalize(void* context) {
  Context* ctx = context_of(context);
  ctx->finalize();
  delete ctx;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) extern const weftBackendPlugin_v1_t weftBackendPlugin_v1;

const weftBackendPlugin_v1_t weftBackendPlugin_v1 = {kName,
                                                     WEFT_PLUGIN_ABI_VERSION,
                                                     sizeof(weftBackendPlugin_v1_t),
                                                     1u << WEFT_DEVICE_CPU,
                                                     0,
                                                     mpi_init,
                                                     mpi_post,
                                                     mpi_test,
                                                     mpi_release,
                                                     mpi_abort,
                                                     mpi_finalize};

}  // extern "C"
