// Helpers for the engine's tests (in-process and against the `stitch engine`
// process): small checkpoints and version directories on disk, the reference
// generation the engine must reproduce, JSON field access, a blocking SSE
// client, and waits on conditions with deadlines. Boost headers stay in the
// .cc so that test files compile quickly.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/sampler.h"
#include "stitch/refengine/scheduler.h"
#include "stitch/refengine/weights.h"

namespace stitch::testing {

// A small model: 2 layers, hidden 48 in 4 heads sharing 2 key/value heads,
// untied, vocab 258, context 384. Generates thousands of tokens per second.
ModelConfig EngineTestConfig();

// Random tensors of `config` (test_models.h's RandomTensors, scale 0.3) with
// seed `seed`.
std::vector<HostTensor> EngineTestTensors(const ModelConfig& config, uint64_t seed);

// `base` with every element of the tensors whose index is a multiple of
// `every` changed by `delta` (a trainer's small step).
std::vector<HostTensor> PerturbTensors(const std::vector<HostTensor>& base, double delta,
                                       size_t every = 2);

// `base` with one element in `every` of each tensor (those at positions
// `offset` modulo `every`) moved by `delta` (relative to the element): a
// sparse step, as most of a trained step's bfloat16 values stay the same.
// Float32 or bfloat16 tensors.
std::vector<HostTensor> SparselyPerturbTensors(const std::vector<HostTensor>& base, size_t every,
                                               double delta, size_t offset = 0);

// The weight patch from `from` to `to` (tensors of the same names, shapes
// and dtypes), computed element by element: what BuildWeightPatch makes of
// the deltas between them.
WeightPatch DiffWeightPatch(const std::vector<HostTensor>& from, const std::vector<HostTensor>& to,
                            VersionRef from_version, VersionRef to_version);

// Writes a checkpoint directory (config.json, model.safetensors, index).
[[nodiscard]] absl::Status WriteModel(const std::filesystem::path& dir, const ModelConfig& config,
                                      const std::vector<HostTensor>& tensors);

// Publishes versions into `updates_dir` (a store's updates/ directory) as
// `weight_vNNNNNN`: a DELTA from `base` to `target`, or a FULL of `target`.
[[nodiscard]] absl::Status PublishDelta(const std::filesystem::path& updates_dir, int64_t version,
                                        const std::vector<HostTensor>& base,
                                        const std::vector<HostTensor>& target,
                                        const std::string& run_id);
[[nodiscard]] absl::Status PublishFull(const std::filesystem::path& updates_dir, int64_t version,
                                       const std::vector<HostTensor>& target,
                                       const std::string& run_id);

// Flips bytes in the middle of the first payload file of a version
// directory, so that its frames or checksums no longer hold.
[[nodiscard]] absl::Status CorruptVersion(const std::filesystem::path& version_dir);

std::shared_ptr<const ModelWeights> BuildWeights(const ModelConfig& config,
                                                 const std::vector<HostTensor>& tensors);

// The tokens the engine must produce: the prompt recomputed from scratch
// for every token (no KV cache: ComputeHiddenStates, ApplyLmHead,
// SampleToken with draw index n for the n-th token). Stops at EOS unless
// ignore_eos, after max_new_tokens, or when the context is full.
struct ReferenceOptions {
  SamplingParams sampling;
  int64_t max_new_tokens = 16;
  bool ignore_eos = false;
};
std::vector<SampledToken> ReferenceGenerate(const ModelWeights& weights,
                                            const std::vector<int32_t>& prompt,
                                            const ReferenceOptions& options);

// Continuous generation across a weight change, with a KV cache, the way the
// engine runs an in-place update: `first` tokens under `before`, then the rest
// under `after` (keeping the cache computed under `before`, or recomputing it
// under `after` when `drop_cache`, as after a retract).
std::vector<SampledToken> SplitGenerate(const ModelWeights& before, const ModelWeights& after,
                                        const std::vector<int32_t>& prompt,
                                        const ReferenceOptions& options, int64_t first,
                                        bool drop_cache);

std::vector<int32_t> Ids(const std::vector<SampledToken>& tokens);
std::vector<double> Logprobs(const std::vector<SampledToken>& tokens);

// JSON access by a dotted path ("meta_info.weight_version",
// "choices.0.text"). String values come back without quotes, others as
// compact JSON. nullopt when the body is not JSON or the path is absent.
std::optional<std::string> JsonGet(std::string_view body, std::string_view path);
// An array of integers at `path` (output_ids).
std::vector<int64_t> JsonInts(std::string_view body, std::string_view path);
// Numbers at `path`: an array of numbers, or with `column` >= 0 the
// `column`-th element of each inner array.
std::vector<double> JsonNumbers(std::string_view body, std::string_view path, int column = -1);

// Polls `condition` until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::seconds(20));

// A blocking client for one server-sent-events response.
class SseClient {
 public:
  SseClient();
  ~SseClient();
  SseClient(const SseClient&) = delete;
  SseClient& operator=(const SseClient&) = delete;

  // POSTs `body` to `url` + `path` and waits for the response header.
  // Returns the HTTP status.
  [[nodiscard]] absl::StatusOr<int> Open(const std::string& url, const std::string& path,
                                         const std::string& body);
  // The next event's data, or nullopt when the body ended.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> Next();
  // Every remaining event's data, until the body ends.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ReadAll();
  // Drops the connection (the server sees the client go away).
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// An HTTP request written by hand on a plain socket to 127.0.0.1:`port`, for
// a client that goes away before the answer (Close()).
class RawHttpRequest {
 public:
  RawHttpRequest(uint16_t port, std::string_view path, std::string_view body);
  ~RawHttpRequest();
  RawHttpRequest(const RawHttpRequest&) = delete;
  RawHttpRequest& operator=(const RawHttpRequest&) = delete;

  // Whether it connected and the whole request went out.
  bool sent() const { return sent_; }
  void Close();

 private:
  int fd_ = -1;
  bool sent_ = false;
};

// A hook for SchedulerOptions::before_iteration that holds the scheduler
// between two steps once `when` holds (checked at every iteration while
// armed), until Release(). One hold per Arm().
class SchedulerGate {
 public:
  SchedulerGate() = default;
  SchedulerGate(const SchedulerGate&) = delete;
  SchedulerGate& operator=(const SchedulerGate&) = delete;

  std::function<void()> Hook();
  void Arm(std::function<bool()> when);
  // Waits until the scheduler is held; false after the timeout.
  bool WaitHeld(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  void Release();

 private:
  struct State;
  std::shared_ptr<State> state_ = MakeState();
  static std::shared_ptr<State> MakeState();
};

}  // namespace stitch::testing
