#include "stitch/refengine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// NaN sorts last, so that corrupt logits cannot break the ordering.
double SortKey(double logprob) {
  return std::isnan(logprob) ? -std::numeric_limits<double>::infinity() : logprob;
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(std::isfinite(temperature) && temperature >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be a finite number >= 0, got ", temperature));
  }
  if (!(std::isfinite(top_p) && top_p > 0 && top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

std::vector<double> LogSoftmax(std::span<const float> logits, float temperature) {
  const double t = temperature > 0 ? static_cast<double>(temperature) : 1.0;
  std::vector<double> out(logits.size());
  double max = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<double>(logits[i]) / t;
    max = std::max(max, out[i]);
  }
  double sum = 0;
  for (double z : out) sum += std::exp(z - max);
  const double log_sum = std::log(sum);
  for (double& z : out) z = (z - max) - log_sum;
  return out;
}

double UniformDraw(uint64_t seed, uint64_t index) {
  const uint64_t z = Mix64(Mix64(seed) + (index + 1) * 0x9e3779b97f4a7c15ull);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params,
                         uint64_t draw_index) {
  const std::vector<double> logprobs = LogSoftmax(logits, params.temperature);
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params.temperature == 0) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return {best, logprobs[best]};
  }

  const double u = UniformDraw(params.seed, draw_index);
  const bool truncated = (params.top_k > 0 && params.top_k < vocab) || params.top_p < 1.0f;
  if (!truncated) {
    double cum = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      cum += std::exp(logprobs[i]);
      if (u < cum) return {i, logprobs[i]};
    }
    // Rounding left the total just below u: the last token with any mass.
    int32_t last = vocab - 1;
    while (last > 0 && !(std::exp(logprobs[last]) > 0)) --last;
    return {last, logprobs[last]};
  }

  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const double ka = SortKey(logprobs[a]);
    const double kb = SortKey(logprobs[b]);
    return ka > kb || (ka == kb && a < b);
  });
  const size_t limit = params.top_k > 0 ? static_cast<size_t>(params.top_k) : order.size();
  size_t kept = 0;
  double mass = 0;
  while (kept < std::min(limit, order.size()) && (kept == 0 || mass < params.top_p)) {
    mass += std::exp(logprobs[order[kept]]);
    ++kept;
  }
  const double target = u * mass;
  double cum = 0;
  for (size_t r = 0; r < kept; ++r) {
    cum += std::exp(logprobs[order[r]]);
    if (target < cum) return {order[r], logprobs[order[r]]};
  }
  return {order[kept - 1], logprobs[order[kept - 1]]};
}

}  // namespace stitch
