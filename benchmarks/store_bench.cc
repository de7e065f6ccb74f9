// store_bench: throughput and rendezvous time of weft's TCPStore client against a TCPStore server:
// weft's own (started in-process, the default) or any other given by --host/--port, such as
// PyTorch's, so that both servers are measured under the same client load.
//
//   store_bench                                   # in-process weft server
//   store_bench --host 127.0.0.1 --port 29500     # an external server (PyTorch's, weft-store)
//   store_bench --clients 1,16,256 --seconds 3 --rendezvous 256,1024
//
// set+get: each client (a thread with its own TCPStore, so its own connection) repeats SET of its
// own key then GET of it; ops/s counts both. add: each client repeats ADD on a shared counter.
// raw set+get: the same SET and GET, hand-encoded and sent in one write per pair on a plain
// socket (SET has no reply; the GET follows it on the same connection, so its key exists and no
// WAIT is needed). One round trip per pair and no client library: the figure says what the
// server sustains, where set+get says what an application using the client sees.
// rendezvous N: N clients connect, each sets its own key, then each does one multi_get of all N
// keys; the time is from the start signal to the last client's reply. Values are checked, so a
// wrong reply fails the run (exit 1) instead of inflating it.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/tcp_store.h"
#include "weft/tcp_store_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Args {
  std::string host;  // empty: start a weft server in-process
  uint16_t port = 0;
  std::vector<int> clients = {1, 16, 256};
  std::vector<int> rendezvous = {256, 1024};
  double seconds = 3.0;
  int repeat = 1;  // runs of each figure; the median is printed
};

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  std::string s = text;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty()) out.push_back(std::atoi(item.c_str()));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--host H --port P] [--clients 1,16,256] [--seconds 3] "
               "[--rendezvous 256,1024] [--repeat 1]\n",
               argv0);
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage(argv[0]);
    const char* value = argv[++i];
    if (flag == "--host") {
      args.host = value;
    } else if (flag == "--port") {
      args.port = static_cast<uint16_t>(std::atoi(value));
    } else if (flag == "--clients") {
      args.clients = parse_list(value);
    } else if (flag == "--rendezvous") {
      args.rendezvous = parse_list(value);
    } else if (flag == "--seconds") {
      args.seconds = std::atof(value);
    } else if (flag == "--repeat") {
      args.repeat = std::max(1, std::atoi(value));
    } else {
      usage(argv[0]);
    }
  }
  if (!args.host.empty() && args.port == 0) usage(argv[0]);
  return args;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

void print_header(const Args& args, const std::string& server) {
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  utsname u{};
  uname(&u);
  std::printf("weft store_bench\n");
  std::printf("Date:       %s\n", date);
  std::printf("CPU:        %u x %s\n", std::thread::hardware_concurrency(), cpu_model().c_str());
  std::printf("Kernel:     %s %s\n", u.sysname, u.release);
#ifdef NDEBUG
  std::printf("Build:      optimised, assertions off\n");
#else
  std::printf("Build:      assertions ON\n");
  std::printf("WARNING: assertions are enabled; figures are not representative\n");
#endif
  std::printf("Server:     %s\n", server.c_str());
  std::printf("Load:       %.1f s per throughput figure, median of %d run(s)\n", args.seconds,
              args.repeat);
  std::printf("------------------------------------------------------------------------\n");
}

// Lets many threads start at once, after all have finished setting up.
class StartLine {
 public:
  explicit StartLine(int parties) : waiting_(parties) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (--waiting_ == 0) {
      start_ = Clock::now();
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return waiting_ == 0; });
  }
  Clock::time_point start() const { return start_; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_;
  Clock::time_point start_;
};

weft::TCPStoreOptions client_options(const std::string& host, uint16_t port) {
  return {.host = host, .port = port, .timeout = 60s, .token = std::nullopt};
}

enum class Load { SetGet, Add, RawSetGet };

const char* load_name(Load load) {
  switch (load) {
    case Load::SetGet:
      return "set+get";
    case Load::Add:
      return "add";
    case Load::RawSetGet:
      return "raw set+get";
  }
  return "?";
}

// A plain TCP connection speaking the TCPStore protocol by hand (docs/store-protocol.md), for the
// raw load. Integers little-endian, strings as a u64 length then the bytes.
class RawConnection {
 public:
  RawConnection(const std::string& host, uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (fd_ < 0 || host != "127.0.0.1" ||
        ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw std::runtime_error("raw set+get: cannot connect to " + host + ":" +
                               std::to_string(port) + " (the raw load supports 127.0.0.1 only)");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::string validate(1, '\0');
    put_u32(validate, 0x3C85F7CE);
    send_all(validate);
  }
  ~RawConnection() { ::close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  static void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); }
  static void put_str(std::string& out, const std::string& s) {
    uint64_t n = s.size();
    out.append(reinterpret_cast<char*>(&n), 8);
    out += s;
  }
  void send_all(const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("raw set+get: send failed");
      done += static_cast<size_t>(n);
    }
  }
  void recv_all(char* out, size_t size) {
    for (size_t done = 0; done < size;) {
      ssize_t n = ::recv(fd_, out + done, size - done, 0);
      if (n <= 0) throw std::runtime_error("raw set+get: the server closed the connection");
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_ = -1;
};

// SET then GET of one key in one write; returns whether GET gave back the value.
bool raw_set_get(RawConnection& c, const std::string& key, const std::string& value) {
  constexpr char kSet = 1, kGet = 3;  // query types (runtime/store_protocol.h)
  std::string request(1, kSet);
  RawConnection::put_str(request, "/" + key);
  RawConnection::put_str(request, value);
  request += kGet;
  RawConnection::put_str(request, "/" + key);
  c.send_all(request);
  char reply[8 + 64];
  c.recv_all(reply, 8 + value.size());
  uint64_t length = 0;
  std::memcpy(&length, reply, 8);
  return length == value.size() && std::memcmp(reply + 8, value.data(), value.size()) == 0;
}

// Ops per second of `clients` clients running `load` for `seconds`.
double throughput(const std::string& host, uint16_t port, int clients, Load load, double seconds,
                  int run) {
  std::vector<std::unique_ptr<weft::TCPStore>> stores;
  std::vector<std::unique_ptr<RawConnection>> raw;
  for (int c = 0; c < clients; ++c) {
    if (load == Load::RawSetGet) {
      raw.push_back(std::make_unique<RawConnection>(host, port));
    } else {
      stores.push_back(std::make_unique<weft::TCPStore>(client_options(host, port)));
    }
  }
  StartLine start(clients + 1);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> total_ops{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::string key = fmt::format("bench/{}/{}", run, c);
      weft::Bytes value(32, static_cast<uint8_t>(c));
      int64_t ops = 0;
      start.arrive_and_wait();
      while (!stop.load(std::memory_order_relaxed)) {
        if (load == Load::SetGet) {
          weft::TCPStore& store = *stores[c];
          value[0] = static_cast<uint8_t>(ops);
          store.set(key, value);
          if (store.get(key) != value) ++wrong;
          ops += 2;
        } else if (load == Load::RawSetGet) {
          value[0] = static_cast<uint8_t>(ops);
          if (!raw_set_get(*raw[c], key, std::string(value.begin(), value.end()))) ++wrong;
          ops += 2;
        } else {
          stores[c]->add(fmt::format("bench/{}/counter", run), 1);
          ops += 1;
        }
      }
      total_ops += ops;
    });
  }
  start.arrive_and_wait();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start.start()).count();
  if (wrong > 0) {
    std::fprintf(stderr, "store_bench: %d wrong GET replies\n", wrong.load());
    std::exit(1);
  }
  return static_cast<double>(total_ops) / elapsed;
}

struct RendezvousTime {
  double connected = 0;  // seconds until the last client had connected (and passed the handshake)
  double total = 0;      // seconds until the last client had every value
};

// Time for `clients` clients to connect, set their key and multi_get every key.
RendezvousTime rendezvous(const std::string& host, uint16_t port, int clients, int run) {
  std::vector<std::string> keys;
  for (int c = 0; c < clients; ++c) keys.push_back(fmt::format("rdzv/{}/{}/{}", run, clients, c));
  StartLine start(clients + 1);
  std::atomic<int> wrong{0};
  std::vector<Clock::time_point> connected(clients);
  std::vector<Clock::time_point> done(clients);
  std::vector<std::thread> threads;
  threads.reserve(clients);
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      start.arrive_and_wait();
      weft::TCPStore store(client_options(host, port));
      connected[c] = Clock::now();
      store.set(keys[c], std::string_view(keys[c]));
      auto values = store.multi_get(keys);
      for (int i = 0; i < clients; ++i) {
        if (weft::to_string(values[i]) != keys[i]) ++wrong;
      }
      done[c] = Clock::now();
    });
  }
  start.arrive_and_wait();
  for (auto& t : threads) t.join();
  if (wrong > 0) {
    std::fprintf(stderr, "store_bench: %d wrong multi_get values\n", wrong.load());
    std::exit(1);
  }
  auto seconds_to = [&](const std::vector<Clock::time_point>& times) {
    auto last = *std::max_element(times.begin(), times.end());
    return std::chrono::duration<double>(last - start.start()).count();
  };
  return {seconds_to(connected), seconds_to(done)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  raise_fd_limit();
  try {
    std::unique_ptr<weft::TcpStoreServer> server;
    std::string host = args.host;
    uint16_t port = args.port;
    std::string description;
    if (host.empty()) {
      weft::TcpStoreServerOptions options;
      options.host = "127.0.0.1";
      options.token = "";
      server = std::make_unique<weft::TcpStoreServer>(options);
      host = "127.0.0.1";
      port = server->port();
      description = fmt::format("weft TcpStoreServer, in-process, {}:{}", host, port);
    } else {
      description = fmt::format("external, {}:{}", host, port);
    }
    print_header(args, description);
    int run = 0;
    for (Load load : {Load::SetGet, Load::RawSetGet, Load::Add}) {
      for (int clients : args.clients) {
        std::vector<double> figures;
        for (int r = 0; r < args.repeat; ++r) {
          figures.push_back(throughput(host, port, clients, load, args.seconds, run++));
        }
        double ops = median(figures);
        std::printf("%-11s %5d clients : %10.0f ops/s %9.1f us/op per client\n", load_name(load),
                    clients, ops, 1e6 * clients / ops);
        std::fflush(stdout);
      }
    }
    for (int clients : args.rendezvous) {
      std::vector<double> totals, connects;
      for (int r = 0; r < args.repeat; ++r) {
        auto time = rendezvous(host, port, clients, run++);
        totals.push_back(time.total);
        connects.push_back(time.connected);
      }
      std::printf("rendezvous %5d clients : %8.3f s (all connected after %.3f s)\n", clients,
                  median(totals), median(connects));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
