// collectives/tag.h: the layout of a 64-bit Tag, the one place that assigns its bits.
//
// Every message between two ranks carries a Tag (transport.h); a receive matches a send by peer
// and tag. Tags of different kinds must never be equal, so each kind owns a field or a bit:
//
//   bit 63  62        61 .. 46          45 .. 24            23 .. 0
//       0   internal  call fingerprint  sequence number     step (24 bits)    a collective's
//                     (16 bits)         (22 bits)                             message
//       1   user tag (62 bits: 0 .. kMaxUserTag) ..........................    a user's send/recv
//       1   1         all ones ............................................    kTransportControlTag
//
// - The sequence number is the collective's in its group (ProcessGroup numbers them), modulo
//   2^22, so the messages of consecutive collectives never match: two collectives 4 million
//   apart are never in flight together.
// - The call fingerprint is a 16-bit digest of what the rank was called with (collective, dtype,
//   reduce op, root, counts: runtime/desync_check.h), the same on every rank of a correct
//   program. Ranks that disagree at equal byte sizes (float32 against int32, 2 float32 against
//   1 float64) send tags that differ only there, so their messages never match, instead of
//   being reduced as garbage; a transport that sees such a near miss fails the receive with
//   Error(Desync) at once (differs_only_in_fingerprint()), one that does not reaches its
//   Timeout. 0: no fingerprint (algorithms called directly, as the tests do).
//   Together they fill the 38-bit sequence field that make_tag() shifts into place.
// - The internal bit marks collectives the runtime issues itself (WEFT_DEBUG=detail fingerprint
//   checks, split's color exchange): their sequence number is the user collective's they guard,
//   with kInternalSeqBit set, so they never match a user collective's messages.
// - The step tells apart the messages of one collective. An algorithm with several phases that
//   pair the same ranks gives each phase its own block of kStepsPerPhase steps (phase_step()),
//   so a rank running ahead into the next phase never matches a message of the previous one.
// - A send/recv's user tag sits under kPointToPointBit, so it never matches a collective's.
// - kTransportControlTag (all ones) is no collective's and no user's: a transport may use it for
//   messages of its own (the shared-memory transport's single-copy acknowledgements).
//
// tag_text() prints a tag as its user reads it: "tag 5" for a send/recv the user tagged 5,
// "tag 17:3 (seq 17 step 3)" for a collective's.
#pragma once

#include <cstdint>
#include <string>

namespace weft::collectives {

using Tag = uint64_t;

inline constexpr int kStepBits = 24;
inline constexpr int kSeqBits = 38;
inline constexpr Tag kStepMask = (Tag{1} << kStepBits) - 1;
// Of the sequence field: the sequence number's bits, then the call fingerprint's.
inline constexpr int kTagSeqBits = 22;
inline constexpr int kFingerprintBits = 16;
// In a sequence number (not a tag): make_tag() moves it to tag bit 62.
inline constexpr uint64_t kInternalSeqBit = uint64_t{1} << kSeqBits;
inline constexpr Tag kPointToPointBit = Tag{1} << 63;
// The largest tag a user may give send/recv: everything below kPointToPointBit's neighbour, so
// that no user tag reaches kTransportControlTag.
inline constexpr uint64_t kMaxUserTag = (uint64_t{1} << 62) - 1;
inline constexpr Tag kTransportControlTag = ~Tag{0};
// Steps per phase of a multi-phase algorithm: a ring's phase has P-1 steps, so this bounds the
// world size an algorithm's phase can number (65536 ranks).
inline constexpr uint32_t kStepsPerPhase = 1u << 16;

// The fields, as masks over a tag. They must not overlap, and together they cover every bit, so
// that widening one without narrowing another fails to compile here rather than colliding.
inline constexpr Tag kStepField = kStepMask;
inline constexpr Tag kSeqField = ((Tag{1} << kSeqBits) - 1) << kStepBits;
inline constexpr Tag kInternalField = Tag{kInternalSeqBit} << kStepBits;
inline constexpr Tag kFingerprintField = ((Tag{1} << kFingerprintBits) - 1)
                                         << (kStepBits + kTagSeqBits);
static_assert(kTagSeqBits + kFingerprintBits == kSeqBits,
              "the sequence number and the fingerprint must fill the sequence field");
static_assert((kFingerprintField & ~kSeqField) == 0, "the fingerprint leaves the sequence field");
static_assert((kStepField & kSeqField) == 0 && (kStepField & kInternalField) == 0 &&
                  (kSeqField & kInternalField) == 0,
              "step, sequence number and internal bit overlap");
static_assert(((kStepField | kSeqField | kInternalField) & kPointToPointBit) == 0,
              "a collective's tag reaches the point-to-point bit");
static_assert((kStepField | kSeqField | kInternalField | kPointToPointBit) == ~Tag{0},
              "the fields leave bits unassigned");
static_assert((kMaxUserTag & kPointToPointBit) == 0, "user tags reach the point-to-point bit");
static_assert((kPointToPointBit | kMaxUserTag) < kTransportControlTag,
              "a user tag reaches the transport's control tag");
static_assert(uint64_t{kStepsPerPhase} * 4 <= kStepField + 1,
              "an algorithm may have up to four phases of kStepsPerPhase steps");

// The tag of step `step` of collective number `seq` (kInternalSeqBit may be set in seq).
constexpr Tag make_tag(uint64_t seq, uint32_t step) {
  return (seq << kStepBits) | (static_cast<uint64_t>(step) & kStepMask);
}

// The `seq` to give an algorithm (Context::seq) for collective number `seq` (kInternalSeqBit
// may be set) whose call has fingerprint `fingerprint`: the number modulo 2^22 with the
// fingerprint above it.
constexpr uint64_t fingerprinted_seq(uint64_t seq, uint16_t fingerprint) {
  return (seq & kInternalSeqBit) | (uint64_t{fingerprint} << kTagSeqBits) |
         (seq & ((uint64_t{1} << kTagSeqBits) - 1));
}

// The call fingerprint a collective's tag carries (0 for none, and for send/recv tags).
constexpr uint16_t tag_fingerprint(Tag tag) {
  return (tag & kPointToPointBit) != 0
             ? 0
             : static_cast<uint16_t>((tag & kFingerprintField) >> (kStepBits + kTagSeqBits));
}

// True when a and b are the same step of the same collective called differently on two ranks:
// collective tags equal but for their call fingerprints.
constexpr bool differs_only_in_fingerprint(Tag a, Tag b) {
  return a != b && ((a | b) & kPointToPointBit) == 0 && ((a ^ b) & ~kFingerprintField) == 0;
}

// The first step of phase `phase` (0, 1, 2, ...) of a multi-phase algorithm.
constexpr uint32_t phase_step(uint32_t phase) { return phase * kStepsPerPhase; }

// The tag of a user's send/recv with tag `user_tag`. REQUIRES: user_tag <= kMaxUserTag.
constexpr Tag point_to_point_tag(uint64_t user_tag) { return kPointToPointBit | user_tag; }

// How a message's tag reads in an error message: "tag 5" (a user's send/recv tag, as the user
// gave it), "tag 17:3 (seq 17 step 3)", "tag 17:65539 (seq 17 phase 1 step 3)", "tag 17:3
// (internal seq 17 step 3)", or "transport control message".
std::string tag_text(Tag tag);

// What a transport appends to a message that shows two ranks disagree about one collective (a
// size mismatch on a matching tag): what it probably means and what to do next.
inline constexpr const char* kDesyncHint =
    "the ranks disagree about this collective: probably a desync (a different collective, count "
    "or dtype on each rank); rerun with WEFT_DEBUG=detail to have every rank's call compared";

}  // namespace weft::collectives
