#include "stitch/chaos/oracle.h"

#include <algorithm>
#include <functional>

#include "stitch/refengine/init_model.h"
#include "stitch/refengine/sequence.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

constexpr size_t kCachedWeights = 24;
constexpr int64_t kDiagnosticRange = 8;
constexpr std::string_view kLmHead = "lm_head.weight";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// The seed of version v's LM head: distinct from the base's seed and from
// every other version's.
uint64_t VersionSeed(uint64_t seed, int64_t version) {
  return seed * 0x9E3779B97F4A7C15ULL + 0xD1B54A32D192ED03ULL * static_cast<uint64_t>(version);
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

// One more token of `seq` under `weights` (feeding its prefill first).
std::optional<int32_t> Step(const ModelWeights& weights, Sequence& seq) {
  Sequence* s = &seq;
  for (;;) {
    auto step = StepSequences(weights, std::span<Sequence* const>(&s, 1));
    if (!step.ok()) return std::nullopt;
    if ((*step)[0].has_value()) return (*step)[0]->id;
  }
}

// The text a prefix of the output has settled: its decoding without the
// replacement characters at its end, which a later byte may still complete.
std::string SettledText(std::span<const int32_t> ids) {
  std::string text = DecodeTokens(ids);
  while (text.size() >= kReplacement.size() &&
         std::string_view(text).substr(text.size() - kReplacement.size()) == kReplacement) {
    text.resize(text.size() - kReplacement.size());
  }
  return text;
}

}  // namespace

Oracle::Oracle(OracleOptions options)
    : options_(std::move(options)),
      base_(RandomCheckpointTensors(options_.config, options_.seed)) {}

std::vector<HostTensor> Oracle::Tensors(int64_t version) const {
  std::vector<HostTensor> out = base_;
  if (version == 0) return out;
  std::vector<HostTensor> fresh =
      RandomCheckpointTensors(options_.config, VersionSeed(options_.seed, version));
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].name == kLmHead) out[i] = std::move(fresh[i]);
  }
  return out;
}

std::shared_ptr<const ModelWeights> Oracle::Weights(int64_t version) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = weights_.begin(); it != weights_.end(); ++it) {
      if (it->first != version) continue;
      auto found = std::move(*it);
      weights_.erase(it);
      weights_.push_back(found);
      return found.second;
    }
  }
  const std::vector<HostTensor> tensors = Tensors(version);
  std::vector<TensorView> views;
  for (const HostTensor& t : tensors) views.push_back(t.view());
  auto built = ModelWeights::FromTensors(options_.config, views);
  // The tensors are ours and match the configuration: failing here is a bug.
  if (!built.ok()) std::abort();
  absl::MutexLock lock(&mu_);
  weights_.emplace_back(version, *built);
  if (weights_.size() > kCachedWeights) weights_.erase(weights_.begin());
  return *built;
}

Checksum128 Oracle::Fingerprint(int64_t version) { return Weights(version)->fingerprint(); }

std::vector<int32_t> Oracle::Greedy(int64_t version, int prompt, int64_t tokens) {
  {
    absl::MutexLock lock(&mu_);
    auto it = greedy_.find({version, prompt, tokens});
    if (it != greedy_.end()) return it->second;
  }
  std::shared_ptr<const ModelWeights> weights = Weights(version);
  std::vector<int32_t> out;
  auto seq = Sequence::Create(options_.config, options_.prompts.at(static_cast<size_t>(prompt)),
                              ::stitch::Greedy());
  if (seq.ok()) {
    for (int64_t n = 0; n < tokens && seq->CanAdvance(); ++n) {
      std::optional<int32_t> t = Step(*weights, *seq);
      if (!t.has_value()) break;
      out.push_back(*t);
    }
  }
  absl::MutexLock lock(&mu_);
  greedy_[{version, prompt, tokens}] = out;
  return out;
}

Judgement Oracle::JudgeTokens(int prompt, int64_t length, std::span<const int32_t> tokens,
                              int64_t start, int64_t end) {
  Observed observed;
  observed.tokens = tokens;
  return Judge(prompt, length, observed, start, end);
}

Judgement Oracle::JudgeText(int prompt, int64_t length, std::string_view text, int64_t start,
                            int64_t end) {
  Observed observed;
  observed.text = text;
  observed.by_text = true;
  return Judge(prompt, length, observed, start, end);
}

bool Oracle::SpansExplainTokens(int prompt, int64_t length, std::span<const int32_t> tokens,
                                const VersionSpans& spans) {
  Observed observed;
  observed.tokens = tokens;
  return Follows(prompt, length, observed, spans);
}

bool Oracle::SpansExplainText(int prompt, int64_t length, std::string_view text,
                              const VersionSpans& spans) {
  Observed observed;
  observed.text = text;
  observed.by_text = true;
  return Follows(prompt, length, observed, spans);
}

bool Oracle::Follows(int prompt, int64_t length, const Observed& observed,
                     const VersionSpans& spans) {
  if (prompt < 0 || static_cast<size_t>(prompt) >= options_.prompts.size()) return false;
  if (!spans.empty() && spans.front().offset != 0) return false;
  if (spans.size() == 1) {
    // One version: its greedy output, computed once.
    const std::vector<int32_t> greedy = Greedy(spans[0].version, prompt, length);
    return !greedy.empty() && Equal(observed, greedy);
  }
  std::vector<std::shared_ptr<const ModelWeights>> weights;
  for (const VersionSpan& span : spans) {
    if (span.version < 0) return false;
    weights.push_back(Weights(span.version));
  }
  auto seq = Sequence::Create(options_.config, options_.prompts[static_cast<size_t>(prompt)],
                              ::stitch::Greedy());
  if (!seq.ok()) return false;
  size_t s = 0;
  int64_t pos = 0;
  for (; pos < length && seq->CanAdvance(); ++pos) {
    if (spans.empty()) return false;
    while (s + 1 < spans.size() && spans[s + 1].offset <= pos) ++s;
    std::optional<int32_t> t = Step(*weights[s], *seq);
    if (!t.has_value()) return false;
    if (!observed.by_text && (static_cast<size_t>(pos) >= observed.tokens.size() ||
                              *t != observed.tokens[static_cast<size_t>(pos)])) {
      return false;
    }
  }
  // Each span covers at least one of the tokens generated.
  if (!spans.empty() && spans.back().offset >= pos) return false;
  if (observed.by_text) return DecodeTokens(seq->generated()) == observed.text;
  return static_cast<size_t>(pos) == observed.tokens.size();
}

bool Oracle::Equal(const Observed& observed, const std::vector<int32_t>& candidate) const {
  if (observed.by_text) return DecodeTokens(candidate) == observed.text;
  return std::equal(observed.tokens.begin(), observed.tokens.end(), candidate.begin(),
                    candidate.end());
}

ModelConfig ChaosModel(bool real_engine) {
  ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = real_engine ? 2 : 4;
  c.num_key_value_heads = real_engine ? 1 : 2;
  c.vocab_size = 258;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = false;
  if (real_engine) c.weight_dtype = DType::kBF16;
  return c;
}

Judgement Oracle::Judge(int prompt, int64_t length, const Observed& observed, int64_t start,
                        int64_t end) {
  Judgement j;
  if (prompt < 0 || static_cast<size_t>(prompt) >= options_.prompts.size() || start < 0 ||
      end < start) {
    j.verdict = Verdict::kMismatch;
    return j;
  }
  if (start == end && Equal(observed, Greedy(start, prompt, length))) {
    j.verdict = Verdict::kSame;
    j.versions = {start};
    return j;
  }
  if (start < end) {
    // Depth-first over which version produced each token, fewest switches
    // first. A token explored is one forward step of one sequence.
    std::vector<std::shared_ptr<const ModelWeights>> weights;
    for (int64_t v = start; v <= end; ++v) weights.push_back(Weights(v));
    const int64_t m = length;
    int64_t budget = options_.search_budget;
    bool exhausted = false;
    std::vector<int64_t> path;  // version of each token so far
    auto seq = Sequence::Create(options_.config, options_.prompts[static_cast<size_t>(prompt)],
                                ::stitch::Greedy());
    if (!seq.ok()) {
      j.verdict = Verdict::kMismatch;
      return j;
    }
    std::function<bool(const Sequence&, int64_t, int64_t, int64_t)> search =
        [&](const Sequence& at, int64_t pos, int64_t current, int64_t switches_left) -> bool {
      if (pos == m || !at.CanAdvance()) {
        if (observed.by_text) return DecodeTokens(at.generated()) == observed.text;
        return static_cast<size_t>(pos) == observed.tokens.size();
      }
      if (!observed.by_text && static_cast<size_t>(pos) >= observed.tokens.size()) return false;
      const int64_t last = switches_left > 0 || current < start ? end : current;
      for (int64_t v = std::max(current, start); v <= last; ++v) {
        const bool switching = current >= start && v != current;
        if (--budget < 0) {
          exhausted = true;
          return false;
        }
        Sequence next = at;
        std::optional<int32_t> t = Step(*weights[static_cast<size_t>(v - start)], next);
        if (!t.has_value()) continue;
        if (!observed.by_text && *t != observed.tokens[static_cast<size_t>(pos)]) continue;
        if (observed.by_text) {
          const std::string settled = SettledText(next.generated());
          if (observed.text.substr(0, settled.size()) != settled) continue;
        }
        path.push_back(v);
        if (search(next, pos + 1, v, switches_left - (switching ? 1 : 0))) return true;
        path.pop_back();
        if (exhausted) return false;
      }
      return false;
    };
    for (int64_t switches = 0; switches <= end - start && !exhausted; ++switches) {
      path.clear();
      if (!search(*seq, 0, start - 1, switches)) continue;
      j.verdict = Verdict::kCrossed;
      for (size_t i = 0; i < path.size(); ++i) {
        if (i == 0 || path[i] != path[i - 1]) {
          j.versions.push_back(path[i]);
          if (i > 0) j.switch_at.push_back(static_cast<int>(i));
        }
      }
      return j;
    }
    if (exhausted) {
      j.verdict = Verdict::kUnjudged;
      return j;
    }
  }
  j.verdict = Verdict::kMismatch;
  for (int64_t v = std::max<int64_t>(0, start - kDiagnosticRange); v <= end + kDiagnosticRange;
       ++v) {
    if (v >= start && v <= end) continue;
    if (Equal(observed, Greedy(v, prompt, length))) {
      j.matches = v;
      break;
    }
  }
  return j;
}

}  // namespace stitch
