// affinity_bench: prefix-affine routing against the power-of-two choice, on
// reference engines with their prefix cache on, in the same run.
//
// Four in-process engines; the gateway's chooser (gateway/chooser.h) picks
// the engine of every request, with and without prefix affinity, in the
// same process and on the same workloads:
//   - GRPO groups: 16 prompts of 256 tokens, each sampled 8 times, the
//     samples of all groups interleaved as a trainer sends them;
//   - multi-turn sessions: 16 conversations of 4 turns, each turn's prompt
//     the previous prompt, its answer and 16 new tokens.
// For each it prints the prefix cache hit rate (cached prompt tokens over
// prompt tokens, as the engines report in meta_info.cached_tokens) and
// generated tokens per second, and the ratios affinity / power-of-two. The
// engines' caches are flushed before each run.
//
//   affinity_bench [--rounds N]   (N runs of each policy, alternating; medians)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "stitch/api/request.h"
#include "stitch/core/errors.h"
#include "stitch/gateway/chooser.h"
#include "stitch/net/client.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/server.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kEngines = 4;
constexpr size_t kAffinityBytes = 256;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "affinity_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, std::string_view what) {
  if (!v.ok()) Die(absl::StrCat(AbslView(what), ": ", v.status().ToString()));
  return *std::move(v);
}

int64_t IntAt(const std::string& body, std::string_view path) {
  std::optional<std::string> v = testing::JsonGet(body, path);
  if (!v.has_value()) Die(absl::StrCat("no ", AbslView(path), " in ", body.substr(0, 200)));
  return std::stoll(*v);
}

enum class Policy { kTwoChoices, kAffinity };

struct Totals {
  int64_t prompt = 0;
  int64_t cached = 0;
  int64_t generated = 0;
  double seconds = 0;
  double hit_rate() const { return prompt > 0 ? static_cast<double>(cached) / prompt : 0; }
  double tokens_per_second() const { return generated / seconds; }
};

// The engines and the chooser in front of them.
class Fleet {
 public:
  explicit Fleet(const fs::path& model_dir) {
    for (int i = 0; i < kEngines; ++i) {
      EngineOptions options;
      options.model_dir = model_dir;
      options.run_id = "bench";
      options.scheduler.max_running = 32;
      options.scheduler.prefix_cache_bytes = size_t{512} << 20;
      engines_.push_back(Check(EngineServer::Start(options), "start an engine"));
      auto r = std::make_shared<ReplicaEntry>();
      r->url = engines_.back()->url();
      r->reachable = true;
      r->state.ready = true;
      r->state.applied = VersionRef{"bench", 0};
      replicas_[r->url] = r;
    }
    index_.Rebuild(replicas_);
  }
  ~Fleet() {
    for (auto& e : engines_) e->Shutdown();
  }

  void Flush() {
    for (auto& e : engines_) {
      auto r = Check(HttpFetch("POST", e->url() + "/flush_cache", ""), "flush");
      if (r.status != 200) Die("flush_cache: " + r.body);
    }
  }

  // One /generate through the chosen engine; adds to `totals`.
  std::vector<int32_t> Generate(Policy policy, const std::vector<int32_t>& prompt, int tokens,
                                uint64_t seed, Totals* totals) {
    const std::string body =
        absl::StrCat(R"({"input_ids": [)", absl::StrJoin(prompt, ","),
                     R"(], "extra_key": "bench", "sampling_params": {"max_new_tokens": )", tokens,
                     R"(, "temperature": 1, "seed": )", seed, R"(, "ignore_eos": true}})");
    ReplicaPtr replica;
    {
      absl::MutexLock lock(&mu_);
      std::optional<Affinity> affinity;
      if (policy == Policy::kAffinity) {
        affinity = Affinity{AffinityKey(0, PromptPrefix(body, kAffinityBytes)), 1.25};
      }
      replica = chooser_.Choose(index_, VersionConstraint{}, nullptr, {}, affinity);
      ++replica->in_flight;
    }
    FetchOptions options;
    options.timeout = std::chrono::minutes(10);
    auto r = Check(HttpFetch("POST", replica->url + "/generate", body, options), "generate");
    {
      absl::MutexLock lock(&mu_);
      --replica->in_flight;
      totals->prompt += static_cast<int64_t>(prompt.size());
      totals->cached += IntAt(r.body, "meta_info.cached_tokens");
      totals->generated += IntAt(r.body, "meta_info.completion_tokens");
    }
    if (r.status != 200) Die("generate: " + r.body);
    std::vector<int32_t> out;
    for (int64_t id : testing::JsonInts(r.body, "output_ids"))
      out.push_back(static_cast<int32_t>(id));
    return out;
  }

 private:
  std::vector<std::unique_ptr<EngineServer>> engines_;
  ReplicaMap replicas_;
  RoutingIndex index_;
  absl::Mutex mu_;
  Chooser chooser_{7};
};

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> byte(1, 255);
  std::vector<int32_t> out{256};  // BOS
  for (int i = 1; i < n; ++i) out.push_back(byte(rng));
  return out;
}

Totals RunGrpo(Fleet& fleet, Policy policy) {
  std::mt19937 rng(1);
  constexpr int kGroups = 16;
  constexpr int kSamples = 8;
  std::vector<std::vector<int32_t>> prompts;
  for (int g = 0; g < kGroups; ++g) prompts.push_back(RandomTokens(rng, 256));
  std::vector<int> order;
  for (int i = 0; i < kGroups * kSamples; ++i) order.push_back(i);
  std::shuffle(order.begin(), order.end(), rng);
  Totals totals;
  const auto start = Clock::now();
  // 16 workers take the shuffled samples in turn.
  std::vector<std::future<void>> workers;
  for (int w = 0; w < 16; ++w) {
    workers.push_back(std::async(std::launch::async, [&, w] {
      for (size_t i = static_cast<size_t>(w); i < order.size(); i += 16) {
        const int sample = order[i];
        fleet.Generate(policy, prompts[static_cast<size_t>(sample / kSamples)], 16,
                       static_cast<uint64_t>(sample), &totals);
      }
    }));
  }
  for (auto& w : workers) w.get();
  totals.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return totals;
}

Totals RunSessions(Fleet& fleet, Policy policy) {
  constexpr int kSessions = 16;
  constexpr int kTurns = 4;
  Totals totals;
  const auto start = Clock::now();
  std::vector<std::future<void>> sessions;
  for (int s = 0; s < kSessions; ++s) {
    sessions.push_back(std::async(std::launch::async, [&, s] {
      std::mt19937 rng(100 + static_cast<unsigned>(s));
      std::vector<int32_t> prompt = RandomTokens(rng, 128);
      for (int t = 0; t < kTurns; ++t) {
        std::vector<int32_t> answer =
            fleet.Generate(policy, prompt, 24, static_cast<uint64_t>(s * kTurns + t), &totals);
        prompt.insert(prompt.end(), answer.begin(), answer.end());
        std::vector<int32_t> user = RandomTokens(rng, 17);
        prompt.insert(prompt.end(), user.begin() + 1, user.end());
      }
    }));
  }
  for (auto& s : sessions) s.get();
  totals.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return totals;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Report(std::string_view name, Fleet& fleet, Totals (*run)(Fleet&, Policy), int rounds) {
  std::vector<double> hit[2], tps[2];
  for (int i = 0; i < rounds; ++i) {
    for (Policy p : {Policy::kTwoChoices, Policy::kAffinity}) {
      fleet.Flush();
      const Totals t = run(fleet, p);
      hit[static_cast<int>(p)].push_back(t.hit_rate());
      tps[static_cast<int>(p)].push_back(t.tokens_per_second());
    }
  }
  const double hit_p2c = Median(hit[0]), hit_aff = Median(hit[1]);
  const double tps_p2c = Median(tps[0]), tps_aff = Median(tps[1]);
  std::printf("%-18s hit rate  power-of-two %5.1f%%  affinity %5.1f%%  ratio %.2fx\n",
              std::string(name).c_str(), 100 * hit_p2c, 100 * hit_aff,
              hit_p2c > 0 ? hit_aff / hit_p2c : 0.0);
  std::printf("%-18s tokens/s  power-of-two %7.0f  affinity %7.0f  ratio %.2fx\n",
              std::string(name).c_str(), tps_p2c, tps_aff, tps_aff / tps_p2c);
}

int Main(int argc, char** argv) {
  int rounds = 1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  testing::TempDir tmp;
  ModelConfig config;
  config.hidden_size = 128;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 4;
  config.intermediate_size = 352;
  config.max_position_embeddings = 1024;
  const fs::path dir = tmp / "boot";
  if (absl::Status s = testing::WriteModel(dir, config, RandomCheckpointTensors(config, 1));
      !s.ok()) {
    Die(s.ToString());
  }
  Fleet fleet(dir);
  std::printf("affinity_bench: %d reference engines, prefix cache on; %d round(s) per policy\n",
              kEngines, rounds);
  Report("GRPO groups", fleet, RunGrpo, rounds);
  Report("multi-turn", fleet, RunSessions, rounds);
  return 0;
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) { return stitch::Main(argc, argv); }
