#include "weft/file_store.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/error.h"

#include "tests/store/store_contract.h"
#include "tests/support/multiproc.h"

namespace {

using namespace std::chrono_literals;
using weft::Bytes;

// A fresh directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/weft-file-store-XXXXXX";
    if (::mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct FileStoreFixture {
  TempDir dir;
  std::string path = dir.file("store");
  // A new FileStore per client: clients share nothing but the file, as processes would.
  std::shared_ptr<weft::Store> client() { return std::make_shared<weft::FileStore>(path); }
};

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One record as c10d's FileStore writes it: u32 length, key, u32 length, value (little-endian).
Bytes record(const std::string& key, const std::string& value) {
  Bytes out;
  for (const std::string* part : {&key, &value}) {
    uint32_t n = static_cast<uint32_t>(part->size());
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(n >> shift));
    out.insert(out.end(), part->begin(), part->end());
  }
  return out;
}

Bytes concat(const std::vector<Bytes>& parts) {
  Bytes out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

}  // namespace

WEFT_STORE_CONTRACT_TESTS(FileStoreFixture, "FileStore", "[file_store]")
WEFT_STORE_INPUT_TESTS(FileStoreFixture, "FileStore", "[file_store]")

TEST_CASE("FileStore writes c10d's record format byte for byte", "[store][file_store]") {
  TempDir dir;
  auto path = dir.file("store");
  {
    weft::FileStore store(path);
    store.set("k", std::string_view("v"));
    CHECK(store.add("n", 12) == 12);
    CHECK(store.delete_key("k"));
  }
  // Made and destroyed, it counts itself in and out as c10d's does.
  CHECK(read_file(path) ==
        concat({record("refcount/", "1"), record("/k", "v"), record("/n", "12"), record("-/k", ""),
                record("cleanup/", "1"), record("refcount/", "0")}));
}

TEST_CASE("FileStore reads a log that c10d's format wrote", "[store][file_store]") {
  TempDir dir;
  auto path = dir.file("store");
  {
    std::ofstream out(path, std::ios::binary);
    auto log = concat({record("/a", "1"), record("/gone", "x"), record("-/gone", ""),
                       record("cleanup/", "3"), record("/a", "2")});
    out.write(reinterpret_cast<const char*>(log.data()), static_cast<std::streamsize>(log.size()));
  }
  weft::FileStore store(path);
  CHECK(store.get_string("a", 0ms) == "2");
  CHECK_FALSE(store.check({"gone"}));
  CHECK(store.num_keys() == 1);
}

TEST_CASE("8 processes sharing one FileStore pass 3 barriers made of add and wait",
          "[store][file_store][multiproc]") {
  TempDir dir;
  auto path = dir.file("store");
  constexpr int kRanks = 8;
  weft::test::run_ranks_ok(
      kRanks,
      [&](int rank) {
        weft::FileStore store(path, kRanks);
        for (int round = 0; round < 3; ++round) {
          store.set(fmt::format("round {} rank {}", round, rank), std::to_string(rank));
          auto count_key = fmt::format("round {} arrived", round);
          auto done_key = fmt::format("round {} done", round);
          if (store.add(count_key, 1) == kRanks) store.set(done_key, std::string_view(""));
          store.wait({done_key}, 30s);
          // Nobody left the barrier before everybody entered it.
          for (int r = 0; r < kRanks; ++r) {
            RANK_CHECK(store.check({fmt::format("round {} rank {}", round, r)}),
                       "round {}: rank {} passed before rank {} arrived", round, rank, r);
          }
          RANK_CHECK(store.get_string(count_key, 0ms) == std::to_string(kRanks));
        }
      },
      60s);
  // The last of the 8 FileStores deleted the file.
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE(
    "a record cut short by a writer killed mid-append is ignored, then cut by the next writer",
    "[store][file_store][multiproc]") {
  TempDir dir;
  auto path = dir.file("store");
  {
    weft::FileStore store(path);
    store.set("before", std::string_view("kept"));
  }
  weft::FileStore reader(path);  // made before the kill: making one writes a record
  auto intact = read_file(path);
  // What a writer killed at various points of appending record("/torn", "0123456789") leaves.
  Bytes full = record("/torn", "0123456789");
  size_t cut = GENERATE(1, 3, 4, 7, 9, 12, 20, 22);  // 22: longer than the next record
  INFO("the killed writer wrote " << cut << " of the record's " << full.size() << " bytes");
  auto results = weft::test::run_ranks(1, [&](int) {
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    RANK_CHECK(fd >= 0);
    RANK_CHECK(::flock(fd, LOCK_EX) == 0);
    RANK_CHECK(::write(fd, full.data(), cut) == static_cast<ssize_t>(cut));
    ::raise(SIGKILL);  // dies holding the lock; the kernel releases it
  });
  REQUIRE(results[0].signal == SIGKILL);
  REQUIRE(read_file(path).size() == intact.size() + cut);

  CHECK(reader.get_string("before", 1s) == "kept");
  CHECK_FALSE(reader.check({"torn"}));
  CHECK(reader.num_keys() == 1);
  CHECK(read_file(path).size() == intact.size() + cut);  // readers leave the tail alone

  reader.set("after", std::string_view("written"));
  CHECK(read_file(path) == concat({intact, record("/after", "written")}));
  weft::FileStore fresh(path);  // replays the log from its first byte
  CHECK(fresh.get_string("after", 1s) == "written");
  CHECK(fresh.get_string("before", 1s) == "kept");
  CHECK_FALSE(fresh.check({"torn"}));
}

TEST_CASE("a FileStore made before fork works in the children, whose locks exclude each other",
          "[store][file_store][multiproc]") {
  TempDir dir;
  auto path = dir.file("store");
  weft::FileStore store(path);
  store.set("seen by children", std::string_view("yes"));
  weft::test::run_ranks_ok(4, [&](int) {
    RANK_CHECK(store.get_string("seen by children", 1s) == "yes");
    for (int i = 0; i < 50; ++i) store.add("n", 1);
  });
  // Children sharing the parent's open file would not exclude each other and lose adds.
  CHECK(store.get_string("n", 1s) == "200");
}

TEST_CASE("a process holding the file's lock makes FileStore calls time out, not hang",
          "[store][file_store][multiproc]") {
  TempDir dir;
  auto path = dir.file("store");
  weft::FileStore store(path);
  store.set("k", std::string_view("v"));
  int locked[2];
  int release[2];
  REQUIRE(::pipe(locked) == 0);
  REQUIRE(::pipe(release) == 0);
  auto holder = std::async(std::launch::async, [&] {
    return weft::test::run_ranks(1, [&](int) {
      int fd = ::open(path.c_str(), O_RDWR);
      RANK_CHECK(fd >= 0 && ::flock(fd, LOCK_EX) == 0);
      char byte = 1;
      RANK_CHECK(::write(locked[1], &byte, 1) == 1);
      RANK_CHECK(::read(release[0], &byte, 1) == 1);  // hold the lock until the parent is done
    });
  });
  char byte = 0;
  REQUIRE(::read(locked[0], &byte, 1) == 1);
  store.set_timeout(300ms);
  for (auto call : std::vector<std::function<void()>>{
           [&] { store.set("k", std::string_view("w")); }, [&] { store.check({"k"}); },
           [&] { store.get("absent", 300ms); }}) {
    auto start = std::chrono::steady_clock::now();
    try {
      call();
      FAIL("a call returned while another process held the lock");
    } catch (const weft::Error& e) {
      CHECK(e.code() == weft::ErrorCode::Timeout);
      CHECK_THAT(e.what(), Catch::Contains(path));
    }
    auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 300ms);
    CHECK(elapsed < 5s);
  }
  REQUIRE(::write(release[1], &byte, 1) == 1);
  auto results = holder.get();
  CHECK(weft::test::describe_failures(results).empty());
  CHECK(store.get_string("k", 1s) == "v");
  for (int fd : {locked[0], locked[1], release[0], release[1]}) ::close(fd);
}

TEST_CASE("FileStore refuses a file that is not a store file and leaves it untouched",
          "[store][file_store]") {
  TempDir dir;
  auto path = dir.file("notes.txt");
  std::string text = GENERATE(std::string("some text that is not a store\n"), std::string(16, '\0'),
                              std::string("\x7f"
                                          "ELF\x02\x01\x01",
                                          7));
  {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }
  try {
    weft::FileStore store(path);
    FAIL("opened a file that is not a store file");
  } catch (const weft::Error& e) {
    CHECK(e.code() == weft::ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains(path));
  }
  CHECK(read_file(path) == weft::to_bytes(text));
}

TEST_CASE("the last of num_workers FileStores deletes the file, and -1 keeps it",
          "[store][file_store]") {
  TempDir dir;
  auto counted = dir.file("counted");
  auto kept = dir.file("kept");
  {
    auto first = std::make_unique<weft::FileStore>(counted, 2);
    auto second = std::make_unique<weft::FileStore>(counted, 2);
    first.reset();
    CHECK(std::filesystem::exists(counted));
    second->set("still", std::string_view("usable"));
    second.reset();
    CHECK_FALSE(std::filesystem::exists(counted));
  }
  {
    weft::FileStore a(kept);
    weft::FileStore b(kept);
  }
  CHECK(std::filesystem::exists(kept));
  CHECK_THROWS_AS(weft::FileStore(kept, 0), weft::Error);
}

TEST_CASE("FileStore calls throw Io once its file is deleted under it", "[store][file_store]") {
  TempDir dir;
  auto path = dir.file("store");
  weft::FileStore store(path);
  store.set("k", std::string_view("v"));
  std::filesystem::remove(path);
  try {
    store.set("k", std::string_view("w"));
    FAIL("set succeeded on a deleted file");
  } catch (const weft::Error& e) {
    CHECK(e.code() == weft::ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::Contains("deleted or replaced"));
  }
}

TEST_CASE("FileStore in a missing directory fails with Io naming the path", "[store][file_store]") {
  try {
    weft::FileStore store("/nonexistent-weft-dir/store");
    FAIL("opened a file in a missing directory");
  } catch (const weft::Error& e) {
    CHECK(e.code() == weft::ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent-weft-dir/store"));
  }
}
