// Whole answers from streams: what the sidecar uses when a client asked for
// a whole /generate but the engine only places a commit exactly in its
// stream (docs/sidecar.md, "Version spans").
#pragma once

#include <cstdint>
#include <optional>

#include <boost/json/object.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stitch {

// Whether a /generate body asks for exactly one generation: one prompt
// (`text` a string or `input_ids` a list of token ids, not both) sampled
// once (`sampling_params.n` absent or 1). Batches and parallel sampling are
// answered as lists and are not assembled.
bool IsSingleGeneration(const boost::json::object& body);

// Builds the whole answer of one /generate from the events of its stream,
// in the forms SGLang streams:
//   - each event the whole answer so far (SGLang's default): `text`,
//     `output_ids` and `meta_info` are cumulative, and the last event is the
//     answer;
//   - each event only what is new (SGLang's --incremental-streaming-output):
//     `text`, `output_ids` and the per-token lists of `meta_info`
//     (`output_token_logprobs`, `output_top_logprobs`,
//     `output_token_ids_logprobs`) are concatenated, every other field is
//     the last event's.
// The two are told apart by `output_ids` against `meta_info.completion_tokens`
// (the tokens generated so far): an event whose ids fit neither form, or
// that lacks them, cannot be placed and is refused rather than guessed at.
// Pure logic; one per generation.
class GenerateAssembler {
 public:
  // One event's JSON object. InvalidArgument, saying why, when it cannot be
  // placed; the assembler is then spent.
  [[nodiscard]] absl::Status Add(boost::json::object event);

  // The whole answer: the events so far, assembled. FailedPrecondition when
  // no event was added, or one was refused.
  [[nodiscard]] absl::StatusOr<boost::json::object> Finish() &&;

  // Events added so far.
  int64_t events() const { return events_; }

 private:
  enum class Form { kUnknown, kCumulative, kIncremental };
  std::optional<boost::json::object> answer_;
  Form form_ = Form::kUnknown;
  int64_t tokens_ = 0;
  int64_t events_ = 0;
  bool spent_ = false;
};

}  // namespace stitch
