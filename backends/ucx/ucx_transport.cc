#include "backends/ucx/ucx_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include "weft/config.h"

#include "backends/common/cross_memory.h"
#include "backends/common/transport_util.h"
#include "runtime/log.h"
#include "runtime/reduce.h"

namespace weft::ucx {

using collectives::Clock;
using collectives::Request;
using collectives::Tag;
using collectives::tag_text;

namespace {

enum Kind : int { kSend = 0, kRecv = 1, kRecvReduce = 2 };

// The UCP tag: bit 63 the kind, bits 62..61 the class, bits 60..45 the sender, 44..0 the message.
constexpr int kRankShift = 45;
constexpr int kClassShift = 61;
constexpr uint64_t kLowMask = (uint64_t{1} << kRankShift) - 1;
constexpr uint64_t kRankMask = (uint64_t{1} << 16) - 1;  // the sender's bits
constexpr int kStepBitsKept = 18;                        // four phases of kStepsPerPhase steps
constexpr int kSeqBitsKept = 26;
// Message classes: a message sent whole, the header of one sent in pieces, and its pieces.
constexpr uint64_t kWholeClass = 0;
constexpr uint64_t kHeaderClass = 1;
constexpr uint64_t kPieceClass = 2;
// Class 3 is no data message's: the acknowledgements of single-copy messages (kind bit 0, the
// acknowledging rank, the sender's request id) and the hang-up (all ones).
constexpr uint64_t kAckClass = 3;
constexpr uint64_t kHangupTag = ~uint64_t{0};
// Unexpected messages (ucx_transport.h): how long a wait finds nothing to do before it takes them,
// and the most bytes held taken at once.
constexpr std::chrono::milliseconds kAbsorbAfter{100};
// The longest progress_beside() drives the messages it took in: 16 MiB at this host's slowest
// measured shared-memory rate, with room.
constexpr std::chrono::milliseconds kBesideBound{200};
constexpr size_t kAbsorbLimit = size_t{256} << 20;
constexpr size_t kHangupBytes = 512;
// Messages of at least kPiecedFrom bytes travel as a header and pieces of piece_bytes() each:
// a receive-and-reduce combines each piece as it lands, while the next ones are in transfer.
constexpr size_t kPiecedFrom = size_t{512} << 10;
constexpr size_t kMinPiece = size_t{256} << 10;
constexpr size_t kMaxPieces = 16;
constexpr uint64_t kHeaderMagic = 0x7765667470696563;  // "weftpiec"
// Single copy (ucx_transport.h): the header {kSingleCopyMagic, bytes, address, request id} of a
// message the receiver reads from the sender's memory, and the acknowledgement's word.
constexpr uint64_t kSingleCopyMagic = 0x7765667473696e67;  // "weftsing"
constexpr uint64_t kAckRead = 1;
constexpr uint64_t kAckRefused = 2;
constexpr uint64_t kAckSendPieces = 3;  // a receive-and-reduce: send the data in pieces after all
// The longest one sleep lasts before the worker is progressed again (UCX's keepalive runs in
// progress).
constexpr std::chrono::milliseconds kSleepSlice{100};
// How long abort() and destruction wait for UCX to let go of requests and endpoints.
constexpr std::chrono::milliseconds kLetGoBound{1000};
constexpr std::chrono::milliseconds kHangupBound{200};
// How long after a peer's hang-up requests with other peers are abandoned (see handle_news).
constexpr std::chrono::milliseconds kHangupGrace{1000};

static_assert(kStepBitsKept + 1 + kSeqBitsKept == kRankShift);
static_assert(kRankShift + 16 == kClassShift);
static_assert(uint64_t{collectives::kStepsPerPhase} * 4 == uint64_t{1} << kStepBitsKept);

std::string status_text(ucs_status_t status) {
  return fmt::format("{} (UCS status {})", ucs_status_string(status), static_cast<int>(status));
}

[[noreturn]] void throw_ucs(std::string_view where, std::string_view call, ucs_status_t status) {
  throw_error(ErrorCode::Io, where, fmt::format("{}: {}", call, status_text(status)));
}

// Sets a UCX setting the user did not set in the environment (UCX_<name>).
void default_setting(ucp_config_t* config, const char* name, const char* value) {
  if (std::getenv(fmt::format("UCX_{}", name).c_str()) != nullptr) return;
  ucs_status_t status = ucp_config_modify(config, name, value);
  if (status != UCS_OK) {
    WEFT_LOG_DEBUG("ucx: cannot set {}={}: {}", name, value, status_text(status));
  }
}

// UCX_TLS as the user set it: whether it is an exclusion list ("^tcp"), and whether it names any
// of `names`. nullopt when it is unset or empty (UCX's own choice).
struct TlsNames {
  bool exclude = false;
  bool named = false;
};
std::optional<TlsNames> tls_names(std::initializer_list<std::string_view> names) {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr || *tls == '\0') return std::nullopt;
  TlsNames out;
  out.exclude = *tls == '^';
  std::string_view rest(tls + (out.exclude ? 1 : 0));
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    for (std::string_view wanted : names) out.named = out.named || name == wanted;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

// Whether UCX_TLS allows cross-memory attach, which the single-copy path is: unset, "all", an
// exclusion list that does not exclude it, or a list naming "cma" or "sm".
bool tls_may_use_cma() {
  const auto tls = tls_names({"all", "sm", "shm", "cma"});
  return !tls || (tls->exclude ? !tls->named : tls->named);
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

bool tls_may_use_shared_memory() {
  const auto any = tls_names({"all", "sm", "shm", "mm", "posix", "sysv"});
  if (!any) return true;
  if (!any->exclude) return any->named;
  // "^tcp" leaves shared memory in; "^posix,sysv" (or "^sm", "^mm") takes it out.
  const bool all_out = tls_names({"all", "sm", "shm", "mm"})->named;
  return !(all_out || (tls_names({"posix"})->named && tls_names({"sysv"})->named));
}

uint64_t ucp_tag_of(Tag tag, int sender) {
  uint64_t low;
  uint64_t kind;
  if (tag & collectives::kPointToPointBit) {
    const uint64_t user = tag & ~collectives::kPointToPointBit;
    low = (user ^ (user >> kRankShift)) & kLowMask;
    kind = 1;
  } else {
    const uint64_t step = tag & ((uint64_t{1} << kStepBitsKept) - 1);
    const uint64_t internal = (tag >> 62) & 1;
    const uint64_t seq = (tag >> collectives::kStepBits) & ((uint64_t{1} << kSeqBitsKept) - 1);
    low = (seq << (kStepBitsKept + 1)) | (internal << kStepBitsKept) | step;
    kind = 0;
  }
  return (kind << 63) | (static_cast<uint64_t>(sender) << kRankShift) | low;
}

// One UCX request of an Op: its whole message, or its header or one of its pieces.
struct UcxTransport::Piece {
  UcxTransport::Op* op = nullptr;
  size_t offset = 0;  // into the op's data; the header's is unused
  size_t bytes = 0;
  bool header = false;
  bool ack = false;         // a single-copy send's acknowledgement (a receive)
  void* request = nullptr;  // UCX's, while it holds the buffer
  bool done = false;        // its callback ran
};

struct UcxTransport::Op {
  UcxTransport* transport = nullptr;
  uint64_t id = 0;
  int peer = 0;
  int kind = kSend;
  Tag tag = 0;
  size_t bytes = 0;
  uint8_t* data = nullptr;  // what is sent, or where a receive lands (recv_reduce: staging)
  // Whole: pieces[0] is the message. Pieced: pieces[0] the header, then the pieces. Never
  // resized once a request is posted (UCX's callbacks hold pointers into it).
  std::vector<Piece> pieces;
  bool pieced = false;
  bool posting = false;  // send(): its requests are being posted
  // {kHeaderMagic, bytes, 0, 0} or {kSingleCopyMagic, bytes, address, request id}: sent, or landed
  uint64_t header[4] = {0, 0, 0, 0};
  // By single copy: a send posts its header only (the receiver reads the data from its memory);
  // a receive expects such a header.
  bool single_copy = false;
  uint64_t ack = 0;     // what the receiver of a single-copy send answered
  int outstanding = 0;  // UCX requests not let go of yet
  size_t landed = 0;    // pieces (not the header) received
  bool ucx_done() const { return outstanding == 0; }
  bool finished = false;  // the result is known
  bool reported = false;  // wait() returned or threw
  // Why it failed, in the words of the failure; finish() puts this rank's context in front.
  std::optional<std::pair<ErrorCode, std::string>> error;
  int* source = nullptr;  // recv_any: where the sender's rank goes
  // recv_reduce
  void* dst = nullptr;
  size_t count = 0;
  DType dtype = DType::Float32;
  ReduceOp reduce_op;
  Staging staging;

  void fail(ErrorCode code, std::string why) {
    if (finished) return;
    finished = true;
    error.emplace(code, std::move(why));
  }
};

struct UcxTransport::Hangup {
  uint8_t buffer[kHangupBytes] = {};
  void* request = nullptr;
  bool landed = false;
  size_t length = 0;
};

using Piece = UcxTransport::Piece;

namespace {

// The UCP tag of a message of class `cls` (kWholeClass, ...).
uint64_t tag_in_class(uint64_t ucp_tag, uint64_t cls) {
  return (ucp_tag & ~(uint64_t{3} << kClassShift)) | (cls << kClassShift);
}

// The tag of the acknowledgement `acker` sends for the single-copy send `id` of the rank it read.
uint64_t ack_tag(int acker, uint64_t id) {
  return (kAckClass << kClassShift) | (static_cast<uint64_t>(acker) << kRankShift) |
         (id & kLowMask);
}

// The size of each piece of a message of `bytes` bytes sent in pieces (the last one may be
// shorter): at least kMinPiece, at most kMaxPieces pieces, a multiple of 4 KiB (so of every
// element size). Both sides compute it from the size alone.
size_t piece_bytes(size_t bytes) {
  const size_t per = (bytes + kMaxPieces - 1) / kMaxPieces;
  return std::max(kMinPiece, (per + 4095) / 4096 * 4096);
}

// Lays out an op's requests: one whole message, or a header and pieces (from kPiecedFrom bytes
// on, or where `pieced`).
void lay_out(UcxTransport::Op& op, bool pieced = false) {
  op.pieced = pieced || op.bytes >= kPiecedFrom;
  if (!op.pieced) {
    op.pieces.assign(1, Piece{&op, 0, op.bytes, false, false, nullptr, false});
    return;
  }
  const size_t each = piece_bytes(op.bytes);
  op.pieces.reserve(2 + (op.bytes + each - 1) / each);
  op.pieces.push_back(Piece{&op, 0, sizeof(op.header), true, false, nullptr, false});
  if (op.single_copy && op.kind == kSend) {
    op.pieces.push_back(Piece{&op, 0, sizeof(op.ack), false, true, nullptr, false});
  }
  for (size_t offset = 0; offset < op.bytes; offset += each) {
    op.pieces.push_back(
        Piece{&op, offset, std::min(each, op.bytes - offset), false, false, nullptr, false});
  }
}

// UCX is done with one request of `piece`'s op.
void release(Piece& piece, void* request) {
  UcxTransport::Op& op = *piece.op;
  piece.done = true;
  piece.request = nullptr;
  if (request != nullptr) ucp_request_free(request);  // null: an absorption was delivered
  if (--op.outstanding == 0 && op.reported) op.transport->note_released(op.id);
}

}  // namespace

// ---- UCX's callbacks (inside ucp_worker_progress, on the owner, mutex held).

extern "C" {

static void weft_ucx_send_done(void* request, ucs_status_t status, void* user_data) {
  auto& piece = *static_cast<Piece*>(user_data);
  UcxTransport::Op& op = *piece.op;
  if (status != UCS_OK) {
    op.fail(ErrorCode::PeerLost,
            fmt::format("ucx send to rank {} ({}, {} bytes) failed: {}", op.peer, tag_text(op.tag),
                        op.bytes, status_text(status)));
  }
  release(piece, request);
  if (op.outstanding == 0 && !op.posting) op.finished = true;
}

static void weft_ucx_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                               void* user_data) {
  auto& piece = *static_cast<Piece*>(user_data);
  UcxTransport::Op& op = *piece.op;
  if (piece.ack) {
    // A single-copy send's acknowledgement: the receiver has read the data, or refused it, or
    // asks for the data in pieces after all (it reduces them as they land: see read_single_copy).
    if (status == UCS_OK && op.ack == kAckSendPieces) {
      op.posting = true;                 // not finished: its pieces are still to be sent
      op.transport->note_header(op.id);  // posted after this progress round
    } else if (status == UCS_OK && op.ack != kAckRead) {
      op.fail(ErrorCode::Protocol,
              fmt::format("rank {} did not take the {}-byte message with {}: its receive failed "
                          "(its own error says why)",
                          op.peer, op.bytes, tag_text(op.tag)));
    } else if (status != UCS_OK && status != UCS_ERR_CANCELED) {
      op.fail(ErrorCode::PeerLost,
              fmt::format("ucx send to rank {} ({}, {} bytes) got no acknowledgement: {}", op.peer,
                          tag_text(op.tag), op.bytes, status_text(status)));
    }
    release(piece, request);
    if (op.outstanding == 0 && !op.posting) op.finished = true;
    return;
  }
  if (!op.finished) {
    if (op.peer == collectives::kAnySource &&
        (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED)) {
      op.peer = static_cast<int>((info->sender_tag >> kRankShift) & kRankMask);
      if (op.source != nullptr) *op.source = op.peer;
    }
    if (status == UCS_OK && piece.header) {
      const bool single_copy = op.header[0] == kSingleCopyMagic;
      if (info->length != sizeof(op.header) || (op.header[0] != kHeaderMagic && !single_copy)) {
        op.fail(ErrorCode::Protocol,
                fmt::format("rank {} sent a malformed piece header ({} bytes) with {}", op.peer,
                            info->length, tag_text(op.tag)));
      } else if (single_copy != op.single_copy) {
        op.fail(ErrorCode::Protocol,
                fmt::format("rank {} sent {} bytes with {} {}, where this rank expects {}", op.peer,
                            op.header[1], tag_text(op.tag),
                            single_copy ? "to be read from its memory" : "in pieces",
                            op.single_copy ? "to read them from its memory" : "pieces"));
      } else if (op.header[1] != op.bytes) {
        op.fail(ErrorCode::Protocol,
                fmt::format("rank {} sent {} bytes with {} but this rank expects {} bytes", op.peer,
                            op.header[1], tag_text(op.tag), op.bytes));
      }
      // Its pieces are posted, or its data read, after this progress round; a single-copy
      // sender is answered even when the receive failed, so that it does not wait for nothing.
      if (!op.finished || single_copy) op.transport->note_header(op.id);
    } else if (status == UCS_OK && info->length != piece.bytes) {
      op.fail(ErrorCode::Protocol,
              op.pieced
                  ? fmt::format("rank {} sent a piece of {} bytes at offset {} with {}, "
                                "where this rank expects {} bytes",
                                op.peer, info->length, piece.offset, tag_text(op.tag), piece.bytes)
                  : fmt::format("rank {} sent {} bytes with {} but this rank expects {} bytes",
                                op.peer, info->length, tag_text(op.tag), op.bytes));
    } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
      op.fail(
          ErrorCode::Protocol,
          fmt::format("rank {} sent more than the {} bytes this rank expects with {}: {}", op.peer,
                      op.pieced ? piece.bytes : op.bytes, tag_text(op.tag), status_text(status)));
    } else if (status != UCS_OK) {
      op.fail(ErrorCode::PeerLost,
              fmt::format("ucx receive from rank {} ({}, {} bytes) failed: {}", op.peer,
                          tag_text(op.tag), op.bytes, status_text(status)));
    } else {
      // A piece, or the whole message, has landed.
      if (op.kind == kRecvReduce) {
        const size_t element = dtype_size(op.dtype);
        reduce::accumulate(static_cast<uint8_t*>(op.dst) + piece.offset, op.data + piece.offset,
                           piece.bytes / element, op.dtype, op.reduce_op);
      }
      if (++op.landed == op.pieces.size() - (op.pieced ? 1 : 0)) op.finished = true;
    }
  }
  release(piece, request);
}

static void weft_ucx_absorbed(void* request, ucs_status_t status, const ucp_tag_recv_info_t*,
                              void* user_data) {
  auto& absorption = *static_cast<UcxTransport::Absorption*>(user_data);
  absorption.done = true;
  absorption.status = static_cast<int>(status);
  if (request != nullptr) ucp_request_free(request);
  absorption.transport->note_absorbed(absorption);  // may free `absorption`: nothing after
}

static void weft_ucx_hangup_landed(void* request, ucs_status_t status,
                                   const ucp_tag_recv_info_t* info, void* user_data) {
  auto& transport = *static_cast<UcxTransport*>(user_data);
  ucp_request_free(request);
  if (status == UCS_ERR_CANCELED) return;
  (void)info;
  transport.note_hangup();
}

static void weft_ucx_ep_failed(void* arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  auto* peer = static_cast<std::pair<UcxTransport*, int>*>(arg);
  peer->first->note_lost(peer->second,
                         fmt::format("is lost: its UCX endpoint failed: {}", status_text(status)));
}

static void weft_ucx_closed(void* request, ucs_status_t status, void* user_data) {
  (void)status;
  *static_cast<bool*>(user_data) = true;
  ucp_request_free(request);
}

}  // extern "C"

// ---- Set-up.

UcxTransport::UcxTransport(int rank, int size, Options options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      names_{"ucx send", "ucx recv", "ucx recv_reduce"} {}

namespace {
// The (transport, peer) each endpoint's error handler gets.
using PeerArg = std::pair<UcxTransport*, int>;
}  // namespace

std::unique_ptr<UcxTransport> UcxTransport::connect(Store& store, int rank, int size,
                                                    const Options& options) {
  const std::string where =
      fmt::format("rank {}/{} group \"{}\" ucx connect", rank, size, options.group_name);
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    throw_error(ErrorCode::InvalidArgument, where,
                fmt::format("rank {} of {}: UCX groups have 1 to {} ranks", rank, size, kMaxRanks));
  }
  std::unique_ptr<UcxTransport> t(new UcxTransport(rank, size, options));

  ucp_config_t* ucx_config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &ucx_config); s != UCS_OK) {
    throw_ucs(where, "ucp_config_read", s);
  }
  const char* keepalive = std::getenv("WEFT_UCX_KEEPALIVE");
  default_setting(ucx_config, "KEEPALIVE_INTERVAL", keepalive && *keepalive ? keepalive : "1s");
  if (tls_may_use_shared_memory()) default_setting(ucx_config, "MM_ERROR_HANDLING", "y");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucs_status_t status = ucp_init(&params, ucx_config, &t->context_);
  ucp_config_release(ucx_config);
  if (status != UCS_OK) throw_ucs(where, "ucp_init", status);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if (status = ucp_worker_create(t->context_, &worker_params, &t->worker_); status != UCS_OK) {
    throw_ucs(where, "ucp_worker_create", status);
  }
  if (status = ucp_worker_get_efd(t->worker_, &t->worker_fd_); status != UCS_OK) {
    throw_ucs(where, "ucp_worker_get_efd", status);
  }
  t->abort_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->abort_fd_ < 0) {
    throw_error(ErrorCode::Io, where, fmt::format("eventfd: {}", std::strerror(errno)));
  }

  // 1. Publish this rank's record: its host, its pid and probe address (single copy), then its
  // worker address.
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  if (status = ucp_worker_get_address(t->worker_, &address, &address_length); status != UCS_OK) {
    throw_ucs(where, "ucp_worker_get_address", status);
  }
  const std::string host = host_name();
  Bytes record(host.begin(), host.end());
  record.push_back(0);
  const uint64_t identity[2] = {static_cast<uint64_t>(::getpid()),
                                backends::cross_memory_probe_address()};
  const auto* id_bytes = reinterpret_cast<const uint8_t*>(identity);
  record.insert(record.end(), id_bytes, id_bytes + sizeof(identity));
  const auto* raw = reinterpret_cast<const uint8_t*>(address);
  record.insert(record.end(), raw, raw + address_length);
  ucp_worker_release_address(t->worker_, address);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/{}", options.key_prefix, r));
  store.set(keys[rank], record);

  // A store wait for one key per rank that timed out: Timeout naming the ranks whose key is
  // missing ("rank 3 did not ..." / "ranks 1, 3 did not ...").
  auto missing_ranks = [&](const std::vector<std::string>& per_rank, std::string_view singular,
                           std::string_view plural) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({per_rank[r]})) missing.push_back(r);
    }
    throw_error(ErrorCode::Timeout, where,
                fmt::format("{} under \"{}/\" within {} ms",
                            backends::ranks_that(missing, singular, plural), options.key_prefix,
                            options.timeout.count()));
  };

  // 2. Read every rank's record in one request.
  std::vector<Bytes> records;
  try {
    records = store.multi_get(keys, options.timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    missing_ranks(keys, "did not publish its UCX address", "did not publish their UCX addresses");
  }

  // 3. One endpoint per peer, failing (not hanging) when the peer dies; and, for single copy,
  // which peers on this host this rank can read.
  size_t single_copy = options.single_copy_bytes;
  if (const char* v = std::getenv("WEFT_UCX_SINGLE_COPY"); v != nullptr && *v != '\0') {
    single_copy = 0;
    const std::string_view text(v);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), single_copy);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw_error(
          ErrorCode::InvalidArgument, where,
          fmt::format("WEFT_UCX_SINGLE_COPY=\"{}\" is not valid; expected bytes (0: off)", text));
    }
  }
  if (!tls_may_use_cma()) single_copy = 0;
  int local = 0;
  t->endpoints_.assign(size, nullptr);
  t->lost_.assign(size, "");
  t->readable_pid_.assign(size, 0);
  t->stuck_with_.assign(size, 0);
  t->copy_from_.assign(size, 0);
  t->single_copy_from_ = single_copy;
  std::string readable;  // the ranks this rank can read, "3,5,"
  for (int r = 0; r < size; ++r) {
    const Bytes& value = records[r];
    auto nul = std::find(value.begin(), value.end(), uint8_t{0});
    if (nul == value.end() || value.end() - nul <= static_cast<ptrdiff_t>(1 + 16)) {
      throw_error(ErrorCode::InvalidArgument, where,
                  fmt::format("rank {}'s record under \"{}\" is malformed ({} bytes)", r, keys[r],
                              value.size()));
    }
    uint64_t peer_identity[2];
    std::memcpy(peer_identity, &*(nul + 1), sizeof(peer_identity));
    const bool same_host = std::string(value.begin(), nul) == host;
    if (same_host) ++local;
    if (r == rank) continue;
    const auto peer_pid = static_cast<pid_t>(peer_identity[0]);
    if (single_copy > 0 && same_host && backends::can_read_process(peer_pid, peer_identity[1])) {
      t->readable_pid_[r] = peer_pid;
      readable += fmt::format("{},", r);
    }
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(&*(nul + 1 + 16));
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = weft_ucx_ep_failed;
    t->handler_args_.push_back(std::make_unique<PeerArg>(t.get(), r));
    ep_params.err_handler.arg = t->handler_args_.back().get();
    if (status = ucp_ep_create(t->worker_, &ep_params, &t->endpoints_[r]); status != UCS_OK) {
      throw_ucs(where, fmt::format("ucp_ep_create to rank {}", r), status);
    }
  }
  // 4. Nobody leaves before everyone has its endpoints: ucp_ep_create attaches the peer's
  // shared-memory FIFO, which disappears with the peer, and a rank whose work needs no reply
  // (one eager send) can finish and exit before a slower peer has connected to it (seen: shmat
  // EINVAL, "ucp_ep_create to rank 1: Shared memory error"). Each rank's "connected" record
  // says from how many bytes on it reads messages by single copy, and from which ranks
  // ("1:65536:3,5,"): to those, this rank sends such messages by single copy.
  std::vector<std::string> connected;
  for (int r = 0; r < size; ++r) {
    connected.push_back(fmt::format("{}/connected/{}", options.key_prefix, r));
  }
  const std::string connected_record = fmt::format("1:{}:{}", single_copy, readable);
  store.set(connected[rank], Bytes(connected_record.begin(), connected_record.end()));
  std::vector<Bytes> readers;
  try {
    readers = store.multi_get(connected, options.timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    missing_ranks(connected, "did not connect its UCX endpoints",
                  "did not connect their UCX endpoints");
  }
  const std::string me = fmt::format("{},", rank);
  for (int r = 0; r < size; ++r) {
    const std::string text(readers[r].begin(), readers[r].end());
    size_t from = 0;
    const char* begin = text.data() + std::min<size_t>(2, text.size());
    auto [end, ec] = std::from_chars(begin, text.data() + text.size(), from);
    if (!text.starts_with("1:") || ec != std::errc() || end == text.data() + text.size() ||
        *end != ':') {
      throw_error(ErrorCode::InvalidArgument, where,
                  fmt::format("rank {}'s record under \"{}\" is malformed (\"{}\")", r,
                              connected[r], text));
    }
    // ",3,5," holds ",<rank>," exactly when the rank is listed.
    std::string listed(1, ',');
    listed.append(end + 1, text.data() + text.size());
    if (r != rank && listed.find("," + me) != std::string::npos) t->copy_from_[r] = from;
  }
  t->spin_budget_ = config().spin_us >= 0 ? std::chrono::microseconds(config().spin_us)
                                          : backends::spin_budget_for(local);
  if (t->spin_budget_.count() == 0) t->yield_rounds_ = backends::kOversubscribedYieldRounds;
  t->hangup_ = std::make_unique<Hangup>();
  t->post_hangup_receive();
  WEFT_LOG_DEBUG("{}: {} peers, {} ranks on this host, spin {} us, single copy from [{}]", where,
                 size - 1, local,
                 std::chrono::duration_cast<std::chrono::microseconds>(t->spin_budget_).count(),
                 readable);
  return t;
}

UcxTransport::~UcxTransport() {
  if (single_copy_from_ > 0) {
    WEFT_LOG_DEBUG(
        "rank {}/{} group \"{}\" ucx: {} messages read by single copy, {} received in "
        "pieces instead (to be reduced)",
        rank_, size_, options_.group_name, single_copy_reads_, single_copy_declined_);
  }
  if (worker_ != nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    // Cancel what is still posted (nothing, after a clean run), then close the endpoints,
    // flushing what is in flight, bounded.
    for (auto& [id, op] : ops_) {
      cancel_receives(*op);
    }
    if (hangup_ && hangup_->request != nullptr) ucp_request_cancel(worker_, hangup_->request);
    for (size_t r = 0; r < endpoints_.size(); ++r) {
      if (endpoints_[r] != nullptr) close_endpoint(static_cast<int>(r), abort_handled_);
    }
    progress_until(
        [&] {
          return std::all_of(ops_.begin(), ops_.end(),
                             [](const auto& entry) { return entry.second->ucx_done(); });
        },
        kLetGoBound);
    ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) {
    for (Staging& staging : staging_free_) unmap(staging);
    for (auto& [id, op] : ops_) unmap(op->staging);
    ucp_cleanup(context_);
  }
  if (abort_fd_ >= 0) ::close(abort_fd_);
}

// ---- Requests.

Error UcxTransport::error(ErrorCode code, const char* op, const std::string& detail) const {
  ErrorContext context;
  context.rank = rank_;
  context.size = size_;
  context.group = options_.group_name;
  context.op = op;
  return Error(code, context, detail);
}

UcxTransport::Staging UcxTransport::take_staging(size_t bytes) {
  // The smallest free buffer that fits; else a new one, touched now so that no receive pays for
  // its page faults, and registered with UCX once for all the receives that will use it.
  auto best = staging_free_.end();
  for (auto it = staging_free_.begin(); it != staging_free_.end(); ++it) {
    if (it->capacity >= bytes && (best == staging_free_.end() || it->capacity < best->capacity)) {
      best = it;
    }
  }
  if (best != staging_free_.end()) {
    Staging staging = std::move(*best);
    staging_free_.erase(best);
    return staging;
  }
  Staging staging;
  staging.capacity = std::bit_ceil(std::max<size_t>(bytes, 64));
  staging.data = std::make_unique<uint8_t[]>(staging.capacity);  // value-initialised: touched
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = staging.data.get();
  params.length = staging.capacity;
  ucp_mem_h memh = nullptr;
  if (ucs_status_t status = ucp_mem_map(context_, &params, &memh); status == UCS_OK) {
    staging.memh = memh;
  } else {
    // Still correct: UCX registers the buffer itself, through its registration cache.
    WEFT_LOG_DEBUG("rank {}/{} group \"{}\" ucx: cannot register a {}-byte staging buffer: {}",
                   rank_, size_, options_.group_name, staging.capacity, status_text(status));
  }
  return staging;
}

void UcxTransport::unmap(Staging& staging) {
  if (staging.memh != nullptr) ucp_mem_unmap(context_, staging.memh);
  staging.memh = nullptr;
}

UcxTransport::Op& UcxTransport::post(int peer, int kind, Tag tag, size_t bytes) {
  WEFT_CHECK((peer >= 0 && peer < size_ && peer != rank_) ||
             (peer == collectives::kAnySource && kind == kRecv));
  auto owned = std::make_unique<Op>();
  Op& op = *owned;
  op.transport = this;
  op.id = next_id_++;
  op.peer = peer;
  op.kind = kind;
  op.tag = tag;
  op.bytes = bytes;
  ops_.emplace(op.id, std::move(owned));
  if (abort_handled_) {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    op.finished = true;
    op.error.emplace(ErrorCode::Aborted, abort_reason_);
  } else if (peer == collectives::kAnySource) {
    for (int r = 0; r < size_; ++r) {
      if (lost_[r].empty()) continue;
      op.finished = true;
      op.error.emplace(ErrorCode::PeerLost,
                       fmt::format("rank {} {}, and this receive from any source may have been "
                                   "waiting for it",
                                   r, lost_[r]));
      break;
    }
  } else if (!lost_[peer].empty()) {
    op.finished = true;
    op.error.emplace(ErrorCode::PeerLost, fmt::format("rank {} {}", peer, lost_[peer]));
  }
  return op;
}

void UcxTransport::post_piece(Op& op, Piece& piece, uint64_t ucp_tag, uint64_t tag_mask) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = &piece;
  void* buffer = piece.ack      ? static_cast<void*>(&op.ack)
                 : piece.header ? static_cast<void*>(op.header)
                                : op.data + piece.offset;
  if (!piece.header && !piece.ack && op.staging.memh != nullptr) {
    // The pool's buffers are registered once, when they are made (take_staging).
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = op.staging.memh;
  }
  ++op.outstanding;
  piece.done = false;
  void* request;
  if (op.kind == kSend && !piece.ack) {
    param.cb.send = weft_ucx_send_done;
    request = ucp_tag_send_nbx(endpoints_[op.peer], buffer, piece.bytes, ucp_tag, &param);
    if (request == nullptr) {  // complete already: no callback comes
      --op.outstanding;
      piece.done = true;
      return;
    }
  } else {
    // Taken earlier: see ucx_transport.h (never an acknowledgement, posted before its send).
    if (!piece.ack && take_absorbed(piece, ucp_tag, tag_mask)) return;
    // Never complete in place: the callback says what landed (it may run before this returns).
    param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = weft_ucx_recv_done;
    request = ucp_tag_recv_nbx(worker_, buffer, piece.bytes, ucp_tag, tag_mask, &param);
  }
  if (UCS_PTR_IS_ERR(request)) {
    --op.outstanding;
    piece.done = true;
    const std::string who =
        op.peer == collectives::kAnySource
            ? std::string("receive from any rank")
            : fmt::format("{} rank {}", op.kind == kSend ? "send to" : "receive from", op.peer);
    op.fail(op.kind == kSend ? ErrorCode::PeerLost : ErrorCode::Io,
            fmt::format("{} ({}, {} bytes): {}", who, tag_text(op.tag), op.bytes,
                        status_text(UCS_PTR_STATUS(request))));
    return;
  }
  if (!piece.done) piece.request = request;
}

void UcxTransport::cancel_receives(Op& op) {
  // A send ends with its endpoint; a single-copy send's acknowledgement is a receive.
  for (Piece& piece : op.pieces) {
    if (piece.request != nullptr && (op.kind != kSend || piece.ack)) {
      ucp_request_cancel(worker_, piece.request);
    }
  }
  if (op.kind == kSend) return;
  // A piece bound to an absorption still landing: the absorption goes back to the list (UCX keeps
  // a message whose receive was cancelled), and the piece is let go of.
  for (auto& absorption : absorbed_) {
    if (absorption->bound == nullptr || absorption->bound->op != &op) continue;
    Piece& piece = *absorption->bound;
    absorption->bound = nullptr;
    release(piece, nullptr);
  }
}

void UcxTransport::deliver(const Absorption& absorption, Piece& piece) {
  Op& op = *piece.op;
  void* buffer = piece.header ? static_cast<void*>(op.header) : op.data + piece.offset;
  ucp_tag_recv_info_t info{};
  info.sender_tag = absorption.tag;
  info.length = std::min(absorption.data.size(), piece.bytes);
  auto status = static_cast<ucs_status_t>(absorption.status);
  if (status == UCS_OK) {
    if (info.length > 0) std::memcpy(buffer, absorption.data.data(), info.length);
    if (absorption.data.size() > piece.bytes) status = UCS_ERR_MESSAGE_TRUNCATED;
  }
  weft_ucx_recv_done(nullptr, status, &info, &piece);
}

bool UcxTransport::take_absorbed(Piece& piece, uint64_t ucp_tag, uint64_t tag_mask) {
  for (auto it = absorbed_.begin(); it != absorbed_.end(); ++it) {
    Absorption& absorption = **it;
    if (absorption.bound != nullptr || ((absorption.tag ^ ucp_tag) & tag_mask) != 0) continue;
    if (!absorption.done) {
      absorption.bound = &piece;  // delivered when it lands (note_absorbed)
      return true;
    }
    std::unique_ptr<Absorption> taken = std::move(*it);
    absorbed_.erase(it);
    absorbed_bytes_ -= taken->data.size();
    deliver(*taken, piece);
    return true;
  }
  return false;
}

void UcxTransport::note_absorbed(Absorption& absorption) {
  if (absorption.bound == nullptr) return;  // kept for the receive that comes
  Piece& piece = *absorption.bound;
  absorption.bound = nullptr;
  deliver(absorption, piece);
  for (auto it = absorbed_.begin(); it != absorbed_.end(); ++it) {
    if (it->get() != &absorption) continue;
    absorbed_bytes_ -= absorption.data.size();
    absorbed_.erase(it);  // frees `absorption`
    return;
  }
}

bool UcxTransport::absorb_unexpected() {
  bool took = false;
  // Peer by peer, from live ones only, class by class (whole messages, piece headers, pieces):
  // never the hang-up (class 3), whose receive stays posted. Sender and class are part of the
  // tag and UCX keeps each tag's messages in order, so taking one peer's or class's before
  // another's reorders nothing that matches alike.
  const uint64_t mask = (uint64_t{3} << kClassShift) | (kRankMask << kRankShift);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !lost_[peer].empty()) continue;
    for (uint64_t cls : {kWholeClass, kHeaderClass, kPieceClass}) {
      while (absorbed_bytes_ < kAbsorbLimit) {
        const uint64_t tag = (cls << kClassShift) | (static_cast<uint64_t>(peer) << kRankShift);
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h message = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
        if (message == nullptr) break;
        auto absorption = std::make_unique<Absorption>();
        absorption->transport = this;
        absorption->tag = info.sender_tag;
        absorption->data.resize(info.length);
        Absorption& a = *absorption;
        absorbed_bytes_ += info.length;
        absorbed_.push_back(std::move(absorption));
        took = true;
        ucp_request_param_t param{};
        param.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.user_data = &a;
        param.cb.recv = weft_ucx_absorbed;
        void* request = ucp_tag_msg_recv_nbx(worker_, a.data.data(), info.length, message, &param);
        if (UCS_PTR_IS_ERR(request)) {
          // Its receive fails as a posted one would have.
          a.done = true;
          a.status = static_cast<int>(UCS_PTR_STATUS(request));
        }
      }
    }
  }
  return took;
}

void UcxTransport::progress_beside() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_.load(std::memory_order_relaxed) || abort_handled_) return;
  progress();
  if (!absorb_unexpected()) return;
  const Clock::time_point bound = Clock::now() + kBesideBound;
  auto landing = [&] {
    return std::any_of(absorbed_.begin(), absorbed_.end(), [](const auto& a) { return !a->done; });
  };
  while (landing() && Clock::now() < bound) {
    if (!progress()) sched_yield();
  }
}

Request UcxTransport::send(int peer, const void* data, size_t bytes, Tag tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  Op& op = post(peer, kSend, tag, bytes);
  if (op.finished) return Request{op.id};
  op.data = static_cast<uint8_t*>(const_cast<void*>(data));  // only read
  op.header[0] = kHeaderMagic;
  op.header[1] = bytes;
  // Single copy (see ucx_transport.h): collectives only, whose peers post their receives within
  // the same call; a point-to-point receive may come much later, and the sender would wait.
  op.single_copy = copy_from_[peer] > 0 && bytes >= copy_from_[peer] &&
                   (tag & collectives::kPointToPointBit) == 0;
  if (op.single_copy) {
    op.header[0] = kSingleCopyMagic;
    op.header[2] = reinterpret_cast<uintptr_t>(data);
    op.header[3] = op.id;
  }
  // A single-copy send lays out its pieces too: it sends them if the receiver asks.
  lay_out(op, op.single_copy);
  const uint64_t base = ucp_tag_of(tag, rank_);
  // A whole message; or its header, then its pieces, all at once; or the receive of its
  // acknowledgement, then its header.
  op.posting = true;
  if (op.single_copy) post_piece(op, op.pieces[1], ack_tag(peer, op.id), ~uint64_t{0});
  for (Piece& piece : op.pieces) {
    if (op.finished) break;
    if (piece.ack) continue;
    if (op.single_copy && !piece.header) break;
    const uint64_t cls = !op.pieced ? kWholeClass : piece.header ? kHeaderClass : kPieceClass;
    post_piece(op, piece, tag_in_class(base, cls), ~uint64_t{0});
  }
  op.posting = false;
  if (op.outstanding == 0) op.finished = true;
  return Request{op.id};
}

void UcxTransport::start_receive(Op& op, uint64_t ucp_tag, uint64_t tag_mask) {
  // A whole message, or the header of one in pieces: its pieces are posted when it has landed
  // (post_pieces), in the order the headers land, which is the order their messages were sent;
  // a receive from any source learns its sender from the header.
  // By single copy when the sender is a peer this rank reads (as send() decides on its side).
  op.single_copy = op.peer != collectives::kAnySource && readable_pid_[op.peer] != 0 &&
                   op.bytes >= single_copy_from_ && (op.tag & collectives::kPointToPointBit) == 0;
  if (op.single_copy && op.kind == kRecv) {
    op.pieced = true;
    op.pieces.assign(1, Piece{&op, 0, sizeof(op.header), true, false, nullptr, false});
  } else {
    lay_out(op, op.single_copy);  // a receive-and-reduce asks for the pieces (read_single_copy)
  }
  post_piece(op, op.pieces[0], tag_in_class(ucp_tag, op.pieced ? kHeaderClass : kWholeClass),
             tag_mask);
}

void UcxTransport::post_pieces(uint64_t id) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Op& op = *it->second;
  if (op.kind == kSend) {
    // A single-copy send whose receiver asked for the pieces.
    for (size_t i = 2; i < op.pieces.size() && !op.finished; ++i) {
      post_piece(op, op.pieces[i], tag_in_class(ucp_tag_of(op.tag, rank_), kPieceClass),
                 ~uint64_t{0});
    }
    op.posting = false;
    if (op.outstanding == 0) op.finished = true;
    return;
  }
  if (op.header[0] == kSingleCopyMagic) {
    // A receive reads the data; a receive-and-reduce asks for the pieces instead: reading then
    // reducing each piece costs the receiver more than reducing what the sender's UCX copied
    // (measured in docs/ucx.md), and the sender's core is free to copy.
    if (op.kind == kRecv || op.finished) return read_single_copy(op);
    ++single_copy_declined_;
    send_ack(op.peer, op.header[3], kAckSendPieces);
  }
  if (op.finished) return;
  const uint64_t tag = tag_in_class(ucp_tag_of(op.tag, op.peer), kPieceClass);
  for (size_t i = 1; i < op.pieces.size() && !op.finished; ++i) {
    post_piece(op, op.pieces[i], tag, ~uint64_t{0});
  }
}

void UcxTransport::read_single_copy(Op& op) {
  // A receive from a peer this rank reads (weft_ucx_recv_done checked that the header is what
  // this receive expects): the data straight into it. One that failed refuses the data.
  uint64_t answer = kAckRefused;
  if (!op.finished) {
    const pid_t pid = readable_pid_[op.peer];
    if (int err = backends::read_process(pid, op.data, op.header[2], op.bytes); err == 0) {
      op.finished = true;
      answer = kAckRead;
      ++single_copy_reads_;
    } else {
      auto [code, why] = backends::describe_read_failure(err, op.peer, pid, op.bytes);
      op.fail(code, fmt::format("{} ({})", why, tag_text(op.tag)));
    }
  }
  send_ack(op.peer, op.header[3], answer);
}

void UcxTransport::send_ack(int peer, uint64_t sender_op, uint64_t answer) {
  if (peer < 0 || peer >= size_ || endpoints_[peer] == nullptr || !lost_[peer].empty()) return;
  // The word is sent from a constant: nothing to keep alive while UCX holds the request.
  static const uint64_t kAnswers[] = {kAckRead, kAckRefused, kAckSendPieces};
  const uint64_t* word = &kAnswers[answer - kAckRead];
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = [](void* request, ucs_status_t, void*) { ucp_request_free(request); };
  void* request =
      ucp_tag_send_nbx(endpoints_[peer], word, sizeof(*word), ack_tag(rank_, sender_op), &param);
  if (UCS_PTR_IS_ERR(request)) {
    // The endpoint failed: the peer learns of this rank's loss, and this rank of its, from UCX.
    WEFT_LOG_DEBUG("rank {}/{} group \"{}\" ucx: acknowledging to rank {}: {}", rank_, size_,
                   options_.group_name, peer, status_text(UCS_PTR_STATUS(request)));
  }
}

Request UcxTransport::recv(int peer, void* data, size_t bytes, Tag tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  Op& op = post(peer, kRecv, tag, bytes);
  if (op.finished) return Request{op.id};
  op.data = static_cast<uint8_t*>(data);
  start_receive(op, ucp_tag_of(tag, peer), ~uint64_t{0});
  return Request{op.id};
}

Request UcxTransport::recv_any(void* data, size_t bytes, Tag tag, int* source) {
  std::lock_guard<std::mutex> lock(mutex_);
  Op& op = post(collectives::kAnySource, kRecv, tag, bytes);
  if (op.finished) return Request{op.id};
  op.source = source;
  op.data = static_cast<uint8_t*>(data);
  // Every sender's bits masked out: the first message with the tag from any rank matches.
  start_receive(op, ucp_tag_of(tag, 0), ~(kRankMask << kRankShift));
  return Request{op.id};
}

Request UcxTransport::recv_reduce(int peer, void* dst, size_t count, DType dtype, ReduceOp op_,
                                  Tag tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t bytes = count * dtype_size(dtype);
  Op& op = post(peer, kRecvReduce, tag, bytes);
  if (op.finished) return Request{op.id};
  op.dst = dst;
  op.count = count;
  op.dtype = dtype;
  op.reduce_op = op_;
  op.staging = take_staging(bytes);
  op.data = op.staging.data.get();
  start_receive(op, ucp_tag_of(tag, peer), ~uint64_t{0});
  return Request{op.id};
}

UcxTransport::Op& UcxTransport::pending(Request request, const char* what) {
  auto it = ops_.find(request.id);
  if (it == ops_.end() || it->second->reported) {
    throw error(
        ErrorCode::InvalidArgument, what,
        fmt::format("request {} is not pending (never posted, or already waited for)", request.id));
  }
  return *it->second;
}

void UcxTransport::finish(Op& op) {
  if (!op.ucx_done()) {
    // It failed with requests still at UCX (a send, or a piece matched before the failure): the
    // caller's buffer is borrowed until UCX lets go. Unmatched receives are taken back; what is
    // in transfer ends only with its endpoint, as after a timeout (the group is broken anyway).
    cancel_receives(op);
    if (!op.ucx_done() && op.peer != collectives::kAnySource) {
      lose_peer(op.peer,
                "was given up on: a request with it failed while in transfer, and its "
                "endpoint was closed");
    }
    // A send's buffer is only read, and with its endpoint closed nothing sends from it: only a
    // receive is waited for (UCX writes into it until it lets go).
    // Once UCX has kept one such receive past the bound, the lost peer's others are not waited
    // for again: a ring step has dozens of segments in transfer, and waiting the bound for each
    // held this rank for half a minute (seen under load), so that its peers timed out instead
    // of learning of the failure.
    const bool stuck = op.peer >= 0 && stuck_with_[op.peer] != 0;
    if (op.kind != kSend && !stuck) progress_until([&] { return op.ucx_done(); }, kLetGoBound);
    if (!op.ucx_done() && op.kind != kSend && !stuck) {
      if (op.peer >= 0) stuck_with_[op.peer] = 1;
      WEFT_LOG_WARN(
          "rank {}/{} group \"{}\" {}: UCX still holds {} request(s) with rank {} {} ms "
          "after it failed (its other failed requests are not waited for)",
          rank_, size_, options_.group_name, names_[op.kind], op.outstanding, op.peer,
          kLetGoBound.count());
    }
  }
  op.reported = true;
  std::optional<Error> failure;
  if (op.error) failure.emplace(error(op.error->first, names_[op.kind].c_str(), op.error->second));
  if (op.ucx_done()) {
    if (op.staging.data) staging_free_.push_back(std::move(op.staging));
    ops_.erase(op.id);
  }
  if (failure) throw *failure;
}

// ---- Progress.

bool UcxTransport::progress() {
  bool any = false;
  while (ucp_worker_progress(worker_) != 0) any = true;
  if (!lost_news_.empty() || !released_.empty() || !headers_.empty() ||
      (hangup_ && hangup_->landed)) {
    handle_news();
    any = true;
  }
  return any;
}

void UcxTransport::note_hangup() {
  hangup_->landed = true;
  hangup_->request = nullptr;  // freed by the callback
}

void UcxTransport::post_hangup_receive() {
  hangup_->landed = false;
  hangup_->request = nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = weft_ucx_hangup_landed;
  param.user_data = this;
  void* request =
      ucp_tag_recv_nbx(worker_, hangup_->buffer, kHangupBytes, kHangupTag, ~uint64_t{0}, &param);
  if (!UCS_PTR_IS_ERR(request) && !hangup_->landed) hangup_->request = request;
}

void UcxTransport::handle_news() {
  // Closing an endpoint progresses the worker, which may bring more news: it waits for the
  // outer call, which is iterating over the requests.
  if (in_news_) return;
  in_news_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{in_news_};
  if (hangup_ && hangup_->landed) {
    // "<rank>\0<reason>": a peer aborted and hung up on this rank.
    const char* text = reinterpret_cast<const char*>(hangup_->buffer);
    const int peer = std::atoi(text);
    std::string reason(text + std::strlen(text) + 1,
                       strnlen(text + std::strlen(text) + 1, kHangupBytes - std::strlen(text) - 1));
    std::memset(hangup_->buffer, 0, kHangupBytes);
    if (!closing_) post_hangup_receive();
    WEFT_LOG_DEBUG("rank {}/{} group \"{}\" ucx: rank {} hung up", rank_, size_,
                   options_.group_name, peer);
    if (peer >= 0 && peer < size_ && peer != rank_) {
      const std::string why = fmt::format("hung up: it aborted its group ({})", reason);
      lost_news_.emplace_back(peer, why);
      // A hang-up means the group is over (it broke, or was aborted). Requests with other peers
      // are abandoned too after a grace period (abandon_after_hangup), so that a rank waiting on
      // a peer whose death UCX has not noticed yet (a keepalive away) learns within it, while
      // one whose own wait ends first (its own timeout, its own peer's failure) says so.
      if (!hangup_grace_end_) {
        hangup_grace_end_ = Clock::now() + kHangupGrace;
        hangup_peer_ = peer;
        hangup_why_ = why;
      }
    }
  }
  while (!lost_news_.empty() || !headers_.empty()) {
    // Pieces are posted in the order their headers landed (posting one may land more).
    auto headers = std::move(headers_);
    headers_.clear();
    for (uint64_t id : headers) post_pieces(id);
    auto lost = std::move(lost_news_);
    lost_news_.clear();
    for (const auto& [peer, why] : lost) lose_peer(peer, why);
  }
  auto released = std::move(released_);
  released_.clear();
  for (uint64_t id : released) {
    auto it = ops_.find(id);
    if (it == ops_.end() || !it->second->reported || !it->second->ucx_done()) continue;
    if (it->second->staging.data) staging_free_.push_back(std::move(it->second->staging));
    ops_.erase(it);
  }
}

void UcxTransport::lose_peer(int peer, const std::string& why) {
  if (!lost_[peer].empty()) return;
  lost_[peer] = why;
  WEFT_LOG_DEBUG("rank {}/{} group \"{}\" ucx: rank {} {}", rank_, size_, options_.group_name, peer,
                 why);
  for (auto& [id, op] : ops_) {
    // An unmatched receive from any source fails too: the lost rank may have been its sender.
    if ((op->peer != peer && op->peer != collectives::kAnySource) || op->finished) continue;
    op->finished = true;
    op->error.emplace(ErrorCode::PeerLost, fmt::format("rank {} {} ({}, {} bytes)", peer, why,
                                                       tag_text(op->tag), op->bytes));
    // A receive stays posted on the worker until cancelled; a send fails with its endpoint.
    cancel_receives(*op);
  }
  // A failed endpoint must be closed (UCX's rule); one whose peer hung up holds sends that will
  // never complete: closing it ends them.
  close_endpoint(peer, /*force=*/true);
}

void UcxTransport::abandon_after_hangup() {
  if (!hangup_grace_end_ || Clock::now() < *hangup_grace_end_) return;
  for (auto& [id, op] : ops_) {
    if (op->finished) continue;
    op->finished = true;
    op->error.emplace(ErrorCode::PeerLost,
                      fmt::format("rank {} {}; the group is over ({} with rank {}, {}, {} bytes, "
                                  "abandoned {} ms later)",
                                  hangup_peer_, hangup_why_, names_[op->kind], op->peer,
                                  tag_text(op->tag), op->bytes, kHangupGrace.count()));
    cancel_receives(*op);
  }
}

template <class Done>
void UcxTransport::progress_until(Done&& done, std::chrono::milliseconds bound) {
  const auto until = Clock::now() + bound;
  while (!done() && Clock::now() < until) {
    if (!progress()) std::this_thread::yield();
  }
}

void UcxTransport::close_endpoint(int peer, bool force) {
  ucp_ep_h ep = endpoints_[peer];
  endpoints_[peer] = nullptr;
  if (ep == nullptr) return;
  // The flag the callback sets lives on the heap: past the bound it is left to UCX.
  auto* closed = new bool(false);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  param.cb.send = weft_ucx_closed;
  param.user_data = closed;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    delete closed;
    return;
  }
  progress_until([&] { return *closed; }, kLetGoBound);
  if (*closed) {
    delete closed;
  } else {
    WEFT_LOG_WARN("rank {}/{} group \"{}\" ucx: closing the endpoint to rank {} took over {} ms",
                  rank_, size_, options_.group_name, peer, kLetGoBound.count());
  }
}

void UcxTransport::handle_abort() {
  if (abort_handled_) return;
  abort_handled_ = true;
  WEFT_LOG_DEBUG("rank {}/{} group \"{}\" ucx: aborting", rank_, size_, options_.group_name);
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    reason = abort_reason_;
  }
  // 1. Hang up on every live peer, so that one blocked on this rank learns now. Sent locally
  // is not delivered (TCP may still hold it), so each endpoint is flushed too, all bounded.
  // What UCX's callbacks touch lives on the heap: it is let go of only once they all ran.
  struct Hangups {
    std::string notice;
    int pending = 0;
  };
  auto* hangups = new Hangups;
  hangups->notice = fmt::format("{}", rank_);
  hangups->notice.push_back('\0');
  hangups->notice += reason.substr(0, kHangupBytes - hangups->notice.size() - 1);
  auto post = [&](auto&& start) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || endpoints_[r] == nullptr || !lost_[r].empty()) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = [](void* request, ucs_status_t, void* user_data) {
        --static_cast<Hangups*>(user_data)->pending;
        ucp_request_free(request);
      };
      param.user_data = hangups;
      void* request = start(endpoints_[r], &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) ++hangups->pending;
    }
  };
  const auto hangup_until = Clock::now() + kHangupBound;
  post([&](ucp_ep_h ep, const ucp_request_param_t* param) {
    return ucp_tag_send_nbx(ep, hangups->notice.data(), hangups->notice.size() + 1, kHangupTag,
                            param);
  });
  progress_until([&] { return hangups->pending == 0; }, kHangupBound);
  post([&](ucp_ep_h ep, const ucp_request_param_t* param) { return ucp_ep_flush_nbx(ep, param); });
  progress_until(
      [&] { return hangups->pending == 0; },
      std::max(std::chrono::milliseconds(1),
               std::chrono::duration_cast<std::chrono::milliseconds>(hangup_until - Clock::now())));
  // 2. Fail every request; receives are withdrawn from the worker, sends end with their
  // endpoints.
  for (auto& [id, op] : ops_) {
    if (!op->finished) {
      op->finished = true;
      op->error.emplace(ErrorCode::Aborted, reason);
    }
    cancel_receives(*op);
  }
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) close_endpoint(r, /*force=*/true);
  }
  // The forced closes above ended the hang-ups and flushes still pending.
  progress_until([&] { return hangups->pending == 0; }, kLetGoBound);
  // The closes also end receives already matched (a rendezvous in progress), which cancelling
  // cannot: the buffers they hold are free once UCX has let go of them.
  progress_until(
      [&] {
        return std::all_of(ops_.begin(), ops_.end(),
                           [](const auto& entry) { return entry.second->ucx_done(); });
      },
      kLetGoBound);
  if (hangups->pending == 0) delete hangups;  // else left to UCX: a callback may still come
}

void UcxTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
  }
  aborted_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(abort_fd_, &one, sizeof(one));
  // The owner notices within one progress round and sleeps only outside the mutex, so this is
  // bounded: it hangs up now when no wait() is running.
  std::lock_guard<std::mutex> lock(mutex_);
  handle_abort();
}

void UcxTransport::sleep_until(Clock::time_point until) {
  pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {abort_fd_, POLLIN, 0}};
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  const int timeout_ms =
      static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, kSleepSlice.count()));
  mutex_.unlock();
  ::poll(fds, 2, timeout_ms);
  mutex_.lock();
}

bool UcxTransport::test(Request request) {
  std::lock_guard<std::mutex> lock(mutex_);
  Op& op = pending(request, "ucx test");
  if (aborted_.load(std::memory_order_relaxed)) handle_abort();
  if (!op.finished) progress();
  return op.finished;
}

void UcxTransport::wait(Request request, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  Op& op = pending(request, "ucx wait");
  Clock::time_point spin_end = Clock::now() + spin_budget_;
  Clock::time_point absorb_at = Clock::now() + kAbsorbAfter;
  int yields = yield_rounds_;
  for (;;) {
    if (aborted_.load(std::memory_order_relaxed)) handle_abort();
    abandon_after_hangup();
    if (op.finished) return finish(op);
    if (progress()) {
      spin_end = Clock::now() + spin_budget_;
      absorb_at = Clock::now() + kAbsorbAfter;
      yields = yield_rounds_;
      continue;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (now >= absorb_at && !abort_handled_) {
      // Nothing for a while: a peer may be waiting for this rank to take its message.
      absorb_at = now + kAbsorbAfter;
      if (absorb_unexpected()) continue;
    }
    if (now < spin_end) continue;
    if (yields > 0) {
      // Ranks outnumber cores: hand the core to the rank this one waits for, a few times, before
      // paying for a sleep and a wake-up (a ring step's messages come many at a time).
      --yields;
      sched_yield();
      continue;
    }
    // Nothing to do for a while: sleep on the worker's fd once it is armed (BUSY: events are
    // pending, progress again).
    ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) continue;
    sleep_until(hangup_grace_end_ ? std::min(deadline, *hangup_grace_end_) : deadline);
    spin_end = Clock::now() + spin_budget_;
  }
  // Past the deadline: say what is outstanding, then make UCX let go of the buffer.
  Error timeout =
      error(ErrorCode::Timeout, names_[op.kind].c_str(),
            op.kind == kSend ? fmt::format("send to rank {} ({}, {} bytes) not complete", op.peer,
                                           tag_text(op.tag), op.bytes)
            : op.peer == collectives::kAnySource
                ? fmt::format("no message from any rank ({}): {} bytes expected", tag_text(op.tag),
                              op.bytes)
                : fmt::format("nothing complete from rank {} ({}): {} bytes outstanding", op.peer,
                              tag_text(op.tag), op.bytes));
  op.finished = true;
  if (!op.ucx_done()) {
    if (op.kind == kSend) {
      // UCX cannot take back a send in flight: closing the endpoint (lose_peer) ends it.
      lose_peer(op.peer, "was given up on: a send to it timed out and its endpoint was closed");
    } else {
      cancel_receives(op);
    }
    progress_until([&] { return op.ucx_done(); }, kLetGoBound);
  }
  op.reported = true;
  if (op.ucx_done()) {
    if (op.staging.data) staging_free_.push_back(std::move(op.staging));
    ops_.erase(op.id);
  }
  throw timeout;
}

}  // namespace weft::ucx
