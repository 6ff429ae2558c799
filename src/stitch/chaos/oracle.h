// The chaos run's oracle: the weights of every version the trainer
// publishes, and a judge that says which of them produced an answer.
//
// Version 0 is the base checkpoint, RandomCheckpointTensors(config, seed).
// Version v > 0 is the base with the LM head drawn afresh from (seed, v):
// every version has distinct weights and distinct greedy outputs, a DELTA
// between two versions is one tensor, and the weights of any version can be
// rebuilt at any time from the seed alone, so nothing per version has to be
// kept. Because versions differ only in the LM head, the keys and values a
// request cached under one version are the ones it would have cached under
// another: a request that crosses an in-place commit continues exactly as
// the next version's greedy continuation of prompt plus prefix.
//
// Answers are greedy (temperature 0, ignore_eos, a given number of tokens), so
// the weights that produced one can be told exactly: the reference engine
// computes every number the same way whatever the batch (docs/engine.md,
// "Determinism"), and the judge runs the same forward pass (refengine's
// Sequence and StepSequences).
//
// Thread-safe: the caches are guarded; judging runs outside the lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>
#include "absl/synchronization/mutex.h"

#include "absl/base/thread_annotations.h"
#include "stitch/api/response.h"
#include "stitch/chaos/history.h"
#include "stitch/format/checksum.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

// The chaos run's model: a small Llama (2 layers, hidden 64, vocabulary
// 258) with an untied LM head. With `real_engine` its head dimension is 32
// (vLLM's CPU attention needs at least 32) and its weights bfloat16, as real
// engines serve them and transformers judges them.
ModelConfig ChaosModel(bool real_engine);

struct OracleOptions {
  ModelConfig config;  // REQUIRES: config.Validate() is OK, LM head untied
  uint64_t seed = 0;
  std::vector<std::vector<int32_t>> prompts;  // token ids, BOS first
  // Nodes (single-token forward steps) one judgement may explore before it
  // gives up and says kUnjudged.
  int64_t search_budget = 20000;
};

// What the judge found (history.h's Verdict and its explanation).
struct Judgement {
  Verdict verdict = Verdict::kNone;
  std::vector<int64_t> versions;   // the weights, in order
  std::vector<int> switch_at;      // token index at which each next version took over
  std::optional<int64_t> matches;  // kMismatch: a nearby version whose greedy output it is
};

class Oracle {
 public:
  explicit Oracle(OracleOptions options);

  const OracleOptions& options() const { return options_; }

  // The tensors of `version` (>= 0), in ExpectedTensors order.
  std::vector<HostTensor> Tensors(int64_t version) const;
  // Its weights, built once and kept for the most recent versions asked.
  std::shared_ptr<const ModelWeights> Weights(int64_t version);
  // WeightsFingerprint of its tensors: what an engine reports once it holds
  // them, and what the store's bytes of that version must give.
  Checksum128 Fingerprint(int64_t version);
  // The greedy output of `version` for prompt `prompt`, `tokens` tokens
  // long (fewer when the context fills up; computed once).
  std::vector<int32_t> Greedy(int64_t version, int prompt, int64_t tokens);

  // Judges an answer to prompt `prompt` (`length` tokens asked for)
  // stamped [start, end] (start <= end):
  // its output ids (route generate) or its text (route completions, compared
  // with the byte tokenizer's decoding). kSame when start == end and it is
  // start's greedy output; kCrossed when start < end and a non-decreasing
  // sequence of versions within [start, end], switching at token positions,
  // produces it (the first such, preferring fewer switches); kUnjudged when
  // the search ran out of budget; kMismatch otherwise, with `matches` set to
  // a version within 8 of the labels whose greedy output it is, if any.
  Judgement JudgeTokens(int prompt, int64_t length, std::span<const int32_t> tokens, int64_t start,
                        int64_t end);
  Judgement JudgeText(int prompt, int64_t length, std::string_view text, int64_t start,
                      int64_t end);

  // Whether version spans ([offset, version] pairs) explain an answer to
  // prompt `prompt`: the version each span names, producing the tokens from
  // its offset up to the next span's, gives exactly the answer's output ids
  // (or its text). Every span must cover at least one token, the first at
  // offset 0; no tokens, no spans.
  bool SpansExplainTokens(int prompt, int64_t length, std::span<const int32_t> tokens,
                          const VersionSpans& spans);
  bool SpansExplainText(int prompt, int64_t length, std::string_view text,
                        const VersionSpans& spans);

 private:
  struct Observed {
    std::span<const int32_t> tokens;  // empty when judging text
    std::string_view text;
    bool by_text = false;
  };
  Judgement Judge(int prompt, int64_t length, const Observed& observed, int64_t start, int64_t end);
  bool Equal(const Observed& observed, const std::vector<int32_t>& candidate) const;
  bool Follows(int prompt, int64_t length, const Observed& observed, const VersionSpans& spans);

  const OracleOptions options_;
  const std::vector<HostTensor> base_;

  absl::Mutex mu_;
  // Most recently used last.
  std::vector<std::pair<int64_t, std::shared_ptr<const ModelWeights>>> weights_
      ABSL_GUARDED_BY(mu_);
  // By (version, prompt, length).
  std::map<std::tuple<int64_t, int, int64_t>, std::vector<int32_t>> greedy_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stitch
