// Error vocabulary shared by every layer.
//
// Fallible operations return absl::Status / absl::StatusOr<T>. The status code
// says where recovery happens:
//   kFailedPrecondition  version not ready / request cannot be served yet (HTTP 409)
//   kUnavailable         transient: engine, network or store flake (HTTP 503, retry)
//   kAborted             a lost compare-and-swap on the pointer
//   kDataLoss            a checksum mismatch or corrupt bytes
//   kInvalidArgument     bad input from the caller
// A few errors carry a kind (as a status payload) so callers, including the
// Python bindings, can tell them apart without parsing messages.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace stitch {

// Debian's abseil is built with its own absl::string_view, which does not
// convert from std::string_view. Our interfaces speak std::string_view; this
// bridges them for absl::StrCat, absl::Status and friends.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

enum class ErrorKind {
  kOther,
  kPointerRewind,     // a pointer move to a lower or equal version of the same run
  kPointerConflict,   // the pointer changed between read and compare-and-swap
  kChecksumMismatch,  // bytes do not hash to what was recorded
  kVersionNotReady,   // a request's constraint is not met by the applied version
  kPointerMalformed,  // the store answered, but its pointer is not a version identity
};

// Returns `status` with `kind` attached. REQUIRES: !status.ok().
absl::Status WithKind(absl::Status status, ErrorKind kind);

// The kind attached by WithKind, or kOther (also for OK statuses).
ErrorKind GetErrorKind(const absl::Status& status);

// The three pointer values of a lost compare-and-swap, as version identities
// ("" when the pointer was or would be unset).
struct ConflictDetails {
  std::string expected;
  std::string actual;
  std::string proposed;
};

// An kAborted status of kind kPointerConflict carrying `details`.
absl::Status ConflictError(std::string_view where, const ConflictDetails& details);

// The details of a ConflictError, or nullopt for any other status.
std::optional<ConflictDetails> GetConflictDetails(const absl::Status& status);

// Prefixes the message of a non-OK status with `context` ("context: message"),
// keeping its code and payloads. Returns OK unchanged.
absl::Status Annotate(const absl::Status& status, std::string_view context);

}  // namespace stitch
