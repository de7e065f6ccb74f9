// collectives/tag.h: the layout of a 64-bit Tag, the one place that assigns its bits.
//
// Every message between two ranks carries a Tag (transport.h); a receive matches a send by peer
// and tag. Tags of different kinds must never be equal, so each kind owns a field or a bit:
//
//   bit 63  62        61 .. 24                  23 .. 0
//       0   internal  sequence number (38 bits)  step (24 bits)    a collective's message
//       1   user tag (62 bits: 0 .. kMaxUserTag) ............       a send/recv of the user's
//       1   1         all ones ..............................       kTransportControlTag
//
// - The sequence number is the collective's in its group (ProcessGroup numbers them), so the
//   messages of consecutive collectives never match. A group would need 2^38 collectives (at a
//   million a second, three days) to wrap into the internal bit.
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

// The first step of phase `phase` (0, 1, 2, ...) of a multi-phase algorithm.
constexpr uint32_t phase_step(uint32_t phase) { return phase * kStepsPerPhase; }

// The tag of a user's send/recv with tag `user_tag`. REQUIRES: user_tag <= kMaxUserTag.
constexpr Tag point_to_point_tag(uint64_t user_tag) { return kPointToPointBit | user_tag; }

// How a message's tag reads in an error message: "tag 5" (a user's send/recv tag, as the user
// gave it), "tag 17:3 (seq 17 step 3)", "tag 17:65539 (seq 17 phase 1 step 3)", "tag 17:3
// (internal seq 17 step 3)", or "transport control message".
std::string tag_text(Tag tag);

}  // namespace weft::collectives
