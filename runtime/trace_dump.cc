#include "runtime/trace_dump.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "weft/config.h"
#include "weft/tcp_store.h"
#include "weft/weft.h"

#include "runtime/launch_env.h"
#include "runtime/log.h"
#include "runtime/progress_thread.h"

namespace weft::trace {
namespace {

// The store keys of docs/flight-recorder.md, in the world's store.
constexpr const char* kJobKey = "weft/trace/job";
constexpr const char* kWorldSizeKey = "weft/trace/world_size";
constexpr const char* kRequestsKey = "weft/trace/requests";
constexpr const char* kRequestPrefix = "weft/trace/request/";
constexpr const char* kReplyPrefix = "weft/trace/reply/";
// The first rank of a job to time out posts the job-wide request; the others find this taken.
constexpr const char* kAutoRequestKey = "weft/trace/auto_request";

// The trace thread's own store connection gives up after this: a stalled store must not hold up
// the thread (or the group teardown that joins it) for a full WEFT_TIMEOUT.
constexpr std::chrono::milliseconds kStoreTimeout{2000};
// How many earlier dump reasons a dump repeats.
constexpr size_t kMaxReasons = 16;

std::atomic<uint64_t> sigusr1_count{0};

void on_sigusr1(int) { sigusr1_count.fetch_add(1, std::memory_order_relaxed); }

// SIGUSR1 dumps, unless the program handles the signal itself: installed only over the default
// disposition (which would kill the process).
void install_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGUSR1, nullptr, &old) != 0) return;
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction action {};
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

// Every live world of the process; leaked so that it outlives static destruction.
struct Worlds {
  std::mutex mutex;
  std::vector<std::weak_ptr<TraceWorld>> list;
};
Worlds& worlds() {
  static Worlds* instance = new Worlds;
  return *instance;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

std::string random_job_id() {
  std::random_device device;
  std::uniform_int_distribution<uint64_t> any;
  return fmt::format("{:016x}", any(device));
}

bool write_file(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> serial{0};
  const std::string temporary = fmt::format("{}.tmp.{}.{}", path, getpid(), serial.fetch_add(1));
  FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) return false;
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<TraceWorld> TraceWorld::create(std::shared_ptr<Store> store, int rank, int size) {
  if (config().trace_buffer == 0) return nullptr;
  install_signal_handler();
  std::shared_ptr<TraceWorld> world(new TraceWorld(std::move(store), rank, size));
  {
    Worlds& all = worlds();
    std::lock_guard<std::mutex> lock(all.mutex);
    std::erase_if(all.list, [](const auto& w) { return w.expired(); });
    all.list.push_back(world);
  }
  world->thread_ = std::thread([raw = world.get()] { raw->loop(); });
  return world;
}

TraceWorld::TraceWorld(std::shared_ptr<Store> store, int rank, int size)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      signals_at_start_(sigusr1_count.load(std::memory_order_relaxed)) {
  // A launcher's job id is known at once; otherwise the thread agrees on one through the store.
  JobId job = launcher_job_id([](const char* name) { return std::getenv(name); });
  job_ = job.value;
}

TraceWorld::~TraceWorld() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<FlightRecorder> TraceWorld::make_recorder(FlightRecorder::GroupInfo info) {
  std::weak_ptr<TraceWorld> self = weak_from_this();
  auto recorder = std::make_shared<FlightRecorder>(
      std::move(info), config().trace_buffer, [self](ErrorCode code, const std::string& message) {
        if (auto world = self.lock()) world->on_failure(code, message);
      });
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(recorders_, [](const auto& r) { return r.expired(); });
  recorders_.push_back(recorder);
  return recorder;
}

std::string TraceWorld::dump_json(const std::string& reason) {
  std::vector<std::shared_ptr<FlightRecorder>> recorders;
  std::string job;
  std::vector<std::string> earlier;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : recorders_) {
      if (auto recorder = weak.lock()) recorders.push_back(std::move(recorder));
    }
    job = job_;
    earlier = reasons_;
  }
  std::string out = "{\n\"format\": \"weft-trace\",\n\"version\": 1,\n\"job\": ";
  append_json_string(out, job);
  out += fmt::format(",\n\"rank\": {},\n\"world_size\": {},\n\"host\": ", rank_, size_);
  append_json_string(out, host_name());
  out += fmt::format(",\n\"pid\": {},\n\"weft_version\": ", getpid());
  append_json_string(out, weft_version());
  out += ",\n\"reason\": ";
  append_json_string(out, reason);
  out += ",\n\"earlier_reasons\": [";
  for (size_t i = 0; i < earlier.size(); ++i) {
    if (i > 0) out += ", ";
    append_json_string(out, earlier[i]);
  }
  out += fmt::format("],\n\"dumped_at_ns\": {},\n\"groups\": [", FlightRecorder::now_ns());
  for (size_t i = 0; i < recorders.size(); ++i) {
    out += i == 0 ? "\n" : ",\n";
    recorders[i]->append_json(out);
  }
  out += "\n]\n}\n";
  return out;
}

bool TraceWorld::has_groups() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(recorders_.begin(), recorders_.end(),
                     [](const auto& weak) { return !weak.expired(); });
}

std::string TraceWorld::dump(const std::string& reason) {
  // Every group of the world is gone (the world is being torn down, and a late request came):
  // an empty dump would replace the file that says what happened.
  if (!has_groups()) return "";
  const std::string text = dump_json(reason);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (reasons_.size() >= kMaxReasons) reasons_.erase(reasons_.begin());
    reasons_.push_back(reason);
  }
  const std::string dir = config().trace_dir.empty() ? "." : config().trace_dir;
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  const std::string path = fmt::format("{}/weft-trace-rank{}.json", dir, rank_);
  if (!write_file(path, text)) {
    WEFT_LOG_WARN("flight recorder: cannot write {} ({}); set WEFT_TRACE_DIR to a writable folder",
                  path, std::strerror(errno));
    return "";
  }
  static std::atomic<bool> told{false};
  if (!told.exchange(true)) {
    WEFT_LOG_WARN(
        "flight recorder written to {} ({}); `weft-trace {}` merges the dumps of every rank", path,
        reason.substr(0, 120), dir);
  } else {
    WEFT_LOG_INFO("flight recorder written to {} ({})", path, reason.substr(0, 120));
  }
  return path;
}

void TraceWorld::on_failure(ErrorCode code, const std::string& message) {
  dump(fmt::format("{}: {}", error_code_name(code), message));
  // A dead peer is seen by every rank (each dumps by itself); a rank that timed out or found a
  // desync may be the only one to know.
  if (code == ErrorCode::PeerLost) return;
  const std::string request = fmt::format(
      "rank {} {}: {}", rank_, code == ErrorCode::Timeout ? "timed out" : "failed", message);
  std::shared_ptr<Store> store;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store = poll_store_;
    if (!store) pending_request_ = request;  // the thread posts it once it has its connection
  }
  if (!store) {
    wake_.notify_all();
    return;
  }
  // Posted here, not by the thread: a program that fails often exits at once, and the request
  // must be in the store by then. The thread's connection bounds this by its short timeout.
  try {
    post_request(*store, request);
  } catch (const std::exception& e) {
    WEFT_LOG_DEBUG("flight recorder: cannot ask the other ranks to dump: {}", e.what());
  }
}

void TraceWorld::post_request(Store& store, const std::string& request) {
  const std::string prior = to_string(store.compare_set(kAutoRequestKey, {}, to_bytes(request)));
  if (prior != request) return;  // another rank asked first
  const int64_t n = store.add(kRequestsKey, 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    own_requests_.push_back(n);
  }
  store.set(kRequestPrefix + std::to_string(n), "file " + request);
}

void TraceWorld::loop() {
  // The thread's own connection when the world's store is a TCP store, so that its polls neither
  // queue behind the program's store calls nor wait a full WEFT_TIMEOUT on a stalled server.
  std::shared_ptr<Store> store = store_;
  if (auto* tcp = dynamic_cast<TCPStore*>(store_.get())) {
    try {
      TCPStoreOptions options;
      options.host = tcp->host();
      options.port = tcp->port();
      options.timeout = kStoreTimeout;
      store = std::make_shared<TCPStore>(options);
    } catch (const std::exception& e) {
      WEFT_LOG_DEBUG("flight recorder: no store connection of its own ({}); using the world's",
                     e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    poll_store_ = store;
  }
  bool ready = false;
  // From when the world was made, not from when this thread got round to it: a SIGUSR1 that
  // came while it was connecting to the store is answered too.
  uint64_t signals_seen = signals_at_start_;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    if (const uint64_t signals = sigusr1_count.load(std::memory_order_relaxed);
        signals != signals_seen) {
      signals_seen = signals;
      dump("SIGUSR1");
    }
    if (store) {
      try {
        serve_store(*store, ready);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::Timeout) {
          // The store is gone (its host quit): dumps go on, requests cannot come any more.
          WEFT_LOG_DEBUG("flight recorder: stops polling the store: {}", e.what());
          store = nullptr;
          std::lock_guard<std::mutex> lock(mutex_);
          poll_store_ = nullptr;
        }
      } catch (const std::exception& e) {
        WEFT_LOG_DEBUG("flight recorder: stops polling the store: {}", e.what());
        store = nullptr;
        std::lock_guard<std::mutex> lock(mutex_);
        poll_store_ = nullptr;
      }
    }
    watchdog();
    lock.lock();
    wake_.wait_for(lock, config().trace_poll,
                   [this] { return stopping_ || !pending_request_.empty(); });
  }
}

void TraceWorld::serve_store(Store& store, bool& ready) {
  if (!ready) {
    std::string job;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job = job_;
    }
    const std::string proposed = job.empty() ? random_job_id() : job;
    const std::string agreed = to_string(store.compare_set(kJobKey, {}, to_bytes(proposed)));
    if (job.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = agreed;
    }
    if (rank_ == 0) store.set(kWorldSizeKey, std::to_string(size_));
    seen_ = store.add(kRequestsKey, 0);
    ready = true;
  }
  std::string pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_request_);
  }
  if (!pending.empty()) post_request(store, pending);
  const int64_t requests = store.add(kRequestsKey, 0);
  for (int64_t k = seen_ + 1; k <= requests; ++k) {
    bool own = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      own = std::find(own_requests_.begin(), own_requests_.end(), k) != own_requests_.end();
    }
    std::string request;
    if (!own) {
      // The requester sets the request right after counting it. One not there within the wait
      // was withdrawn (weft-trace --store deletes its request once it has the replies it waited
      // for): answering it now would leave a reply nobody reads.
      try {
        request = to_string(
            store.get(kRequestPrefix + std::to_string(k), std::chrono::milliseconds(500)));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::Timeout) throw;
        own = true;
      }
    }
    if (!own) {
      const size_t space = request.find(' ');
      const std::string mode = request.substr(0, space);
      const std::string why = space == std::string::npos ? "" : request.substr(space + 1);
      if (mode == "store") {
        store.set(fmt::format("{}{}/{}", kReplyPrefix, k, rank_),
                  dump_json("requested through the store: " + why));
      } else {
        dump("requested by the job: " + why);
      }
    }
    seen_ = k;
  }
}

void TraceWorld::watchdog() {
  std::vector<std::shared_ptr<FlightRecorder>> recorders;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : recorders_) {
      if (auto recorder = weak.lock()) recorders.push_back(std::move(recorder));
    }
  }
  for (const auto& recorder : recorders) {
    // What a collective's own deadline and a Work's default wait allow, and one poll more.
    const auto grace = wait_margin(recorder->info().timeout) + config().trace_poll;
    if (std::optional<std::string> overdue = recorder->overdue(grace)) {
      WEFT_LOG_ERROR("watchdog: {}", *overdue);
      dump("watchdog: " + *overdue);
    }
  }
}

std::vector<std::string> dump_all(const std::string& reason) {
  std::vector<std::shared_ptr<TraceWorld>> live;
  {
    Worlds& all = worlds();
    std::lock_guard<std::mutex> lock(all.mutex);
    for (const auto& weak : all.list) {
      if (auto world = weak.lock()) live.push_back(std::move(world));
    }
  }
  std::vector<std::string> paths;
  for (const auto& world : live) {
    std::string path = world->dump(reason);
    if (!path.empty()) paths.push_back(std::move(path));
  }
  return paths;
}

}  // namespace weft::trace
