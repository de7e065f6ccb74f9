// ShmSegment: create/open/unlink across real processes, and the errors callers see.
#include "backends/tcp/shm_segment.h"

#include <sys/statvfs.h>

#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "tests/support/multiproc.h"
#include "tests/tcp_backend/shm_test_util.h"

namespace weft::tcp {
namespace {

using test::unique_name;

// Runs f, which must throw weft::Error with `code`, and returns its message.
template <class F>
std::string error_of(F&& f, ErrorCode code) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  FAIL("no weft::Error was thrown");
  return "";
}

TEST_CASE("a segment created by one process is read and written by another that opens it",
          "[shm][multiproc]") {
  std::string name = unique_name("rw");
  ShmSegment segment = ShmSegment::create(name, 1 << 20);
  REQUIRE(segment.size() == 1 << 20);
  REQUIRE(segment.is_creator());
  REQUIRE(segment.name() == name);
  // A fresh segment reads as zeros.
  for (size_t i = 0; i < segment.size(); i += 4096) REQUIRE(segment.data()[i] == std::byte{0});
  test::fill_pattern(1, 0, {segment.data(), 4096});

  weft::test::run_ranks_ok(1, [&](int) {
    // Open by name (not the inherited mapping), check the parent's bytes, answer with ours.
    ShmSegment peer = ShmSegment::open(name, 1 << 20);
    RANK_CHECK(!peer.is_creator());
    RANK_CHECK(peer.data() != nullptr && peer.size() == 1 << 20);
    test::check_pattern(1, 0, {peer.data(), 4096});
    test::fill_pattern(2, 0, {peer.data() + (1 << 19), 4096});
  });

  // The child's writes are visible through the creator's mapping.
  for (size_t i = 0; i < 4096; ++i) {
    INFO("byte " << i);
    REQUIRE(static_cast<uint8_t>(segment.data()[(1 << 19) + i]) == test::pattern_byte(2, i));
  }
}

TEST_CASE("a segment stays mapped after unlink, but its name no longer opens", "[shm]") {
  std::string name = unique_name("unlink");
  ShmSegment segment = ShmSegment::create(name, 8192);
  ShmSegment peer = ShmSegment::open(name);
  REQUIRE(peer.size() == 8192);
  segment.unlink();
  REQUIRE(segment.is_unlinked());
  segment.unlink();  // idempotent
  peer.data()[100] = std::byte{42};
  REQUIRE(segment.data()[100] == std::byte{42});
  std::string message = error_of([&] { ShmSegment::open(name); }, ErrorCode::Io);
  CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("No such file or directory"));
}

TEST_CASE("opening a name nobody created fails with Io naming the object and errno", "[shm]") {
  std::string name = unique_name("missing");
  std::string message = error_of([&] { ShmSegment::open(name); }, ErrorCode::Io);
  CHECK_THAT(message, Catch::Contains("shm segment \"" + name + "\"") &&
                          Catch::Contains("shm_open") && Catch::Contains("errno 2"));
}

TEST_CASE("the creator's destructor removes the name; a peer's does not", "[shm]") {
  std::string name = unique_name("raii");
  {
    ShmSegment segment = ShmSegment::create(name, 4096);
    { ShmSegment peer = ShmSegment::open(name); }
    ShmSegment again = ShmSegment::open(name);  // the peer's destructor left the name
    ShmSegment moved = std::move(segment);      // a move hands over the duty to unlink
  }
  error_of([&] { ShmSegment::open(name); }, ErrorCode::Io);
}

TEST_CASE("creating a name that exists fails with Io and leaves the existing object intact",
          "[shm]") {
  std::string name = unique_name("twice");
  ShmSegment segment = ShmSegment::create(name, 4096);
  segment.data()[7] = std::byte{7};
  std::string message = error_of([&] { ShmSegment::create(name, 4096); }, ErrorCode::Io);
  CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("File exists"));
  ShmSegment peer = ShmSegment::open(name);
  REQUIRE(peer.data()[7] == std::byte{7});
}

TEST_CASE("a size that differs from the expected one is refused as InvalidArgument", "[shm]") {
  std::string name = unique_name("size");
  ShmSegment segment = ShmSegment::create(name, 4096);
  std::string message = error_of([&] { ShmSegment::open(name, 8192); }, ErrorCode::InvalidArgument);
  CHECK_THAT(message, Catch::Contains("4096") && Catch::Contains("8192"));
}

TEST_CASE("bad names and a zero size are refused before anything is created", "[shm]") {
  error_of([] { ShmSegment::create("", 4096); }, ErrorCode::InvalidArgument);
  error_of([] { ShmSegment::create("/", 4096); }, ErrorCode::InvalidArgument);
  error_of([] { ShmSegment::create("/a/b", 4096); }, ErrorCode::InvalidArgument);
  error_of([] { ShmSegment::create(std::string(300, 'x'), 4096); }, ErrorCode::InvalidArgument);
  std::string name = unique_name("zero");
  error_of([&] { ShmSegment::create(name, 0); }, ErrorCode::InvalidArgument);
  error_of([&] { ShmSegment::open(name); }, ErrorCode::Io);
  // Without the leading slash the name gets one.
  std::string bare = unique_name("bare").substr(1);
  ShmSegment segment = ShmSegment::create(bare, 4096);
  REQUIRE(segment.name() == "/" + bare);
}

TEST_CASE("a segment too large for /dev/shm fails at create and leaves no name behind", "[shm]") {
  struct statvfs fs {};
  REQUIRE(::statvfs("/dev/shm", &fs) == 0);
  // An unlimited tmpfs would try to allocate it all: only a sized one refuses up front.
  if (fs.f_blocks == 0) return;
  size_t too_big = 2 * static_cast<size_t>(fs.f_blocks) * fs.f_frsize;
  std::string name = unique_name("huge");
  std::string message = error_of([&] { ShmSegment::create(name, too_big); }, ErrorCode::Io);
  CHECK_THAT(message, Catch::Contains("No space left on device"));
  // What the user needs: which filesystem, how much was wanted, and the ways out.
  CHECK_THAT(message, Catch::Contains("/dev/shm is too small: no room for") &&
                          Catch::Contains(std::to_string(too_big) + " bytes") &&
                          Catch::Contains("WEFT_SHM=0"));
  error_of([&] { ShmSegment::open(name); }, ErrorCode::Io);
}

}  // namespace
}  // namespace weft::tcp
