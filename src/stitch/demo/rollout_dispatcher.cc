#include "stitch/demo/rollout_dispatcher.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "stitch/net/client.h"

namespace stitch {
namespace {

constexpr int kRolloutThreads = 16;
constexpr int kMaxAttempts = 6;
constexpr auto kRolloutTimeout = std::chrono::seconds(90);

}  // namespace

RolloutDispatcher::RolloutDispatcher(std::string gateway, EngineApi api,
                                     std::function<double()> now, const std::atomic<bool>* stop)
    : gateway_(std::move(gateway)), api_(api), now_(std::move(now)), stop_(stop) {
  for (int i = 0; i < kRolloutThreads; ++i) threads_.emplace_back([this] { Work(); });
}

RolloutDispatcher::~RolloutDispatcher() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<PendingBatch> RolloutDispatcher::Launch(std::vector<RolloutRequest> requests) {
  auto batch = std::make_shared<PendingBatch>();
  for (const RolloutRequest& r : requests) batch->prompts.push_back(r.prompt);
  if (!requests.empty()) batch->min_version = requests.front().min_version.value_or(0);
  {
    absl::MutexLock lock(&batch->mu);
    batch->results.resize(requests.size());
    batch->remaining = static_cast<int>(requests.size());
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    jobs_.push_back(Job{batch, i, std::move(requests[i])});
  }
  return batch;
}

absl::StatusOr<std::vector<RolloutOutcome>> RolloutDispatcher::Wait(PendingBatch& batch) {
  absl::MutexLock lock(&batch.mu);
  while (!batch.Done()) {
    if (stop_->load()) return absl::CancelledError("demo: interrupted");
    batch.mu.AwaitWithTimeout(absl::Condition(&batch, &PendingBatch::Done),
                              absl::Milliseconds(100));
  }
  if (batch.error.has_value()) return *batch.error;
  std::vector<RolloutOutcome> out;
  for (auto& r : batch.results) out.push_back(*std::move(r));
  return out;
}

void RolloutDispatcher::Work() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &RolloutDispatcher::HasWorkOrClosing));
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    absl::StatusOr<RolloutOutcome> outcome = Run(job.request);
    absl::MutexLock lock(&job.batch->mu);
    if (outcome.ok()) {
      job.batch->results[job.index] = *std::move(outcome);
    } else if (!job.batch->error.has_value()) {
      job.batch->error = outcome.status();
    }
    --job.batch->remaining;
  }
}

absl::StatusOr<RolloutOutcome> RolloutDispatcher::Run(const RolloutRequest& request) {
  const bool vllm = api_ == EngineApi::kVllm;
  const std::string body = vllm ? CompletionRequestBody(request) : GenerateRequestBody(request);
  const std::string route = vllm ? "/v1/completions" : "/generate";
  std::string last_error;
  for (int attempt = 1; attempt <= kMaxAttempts; ++attempt) {
    if (stop_->load()) return absl::CancelledError("demo: interrupted");
    if (attempt > 1) {
      ++retries_;
      std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
    }
    FetchOptions options;
    options.timeout = kRolloutTimeout;
    auto response = HttpFetch("POST", gateway_ + route, body, options);
    if (!response.ok()) {
      last_error = std::string(response.status().message());
      continue;
    }
    if (response->status != 200) {
      last_error = absl::StrCat("HTTP ", response->status, ": ", response->body.substr(0, 200));
      continue;
    }
    auto generated =
        vllm ? ParseCompletionResponse(response->body) : ParseGenerateResponse(response->body);
    if (!generated.ok()) return generated.status();
    RolloutOutcome out;
    out.response.min_version = request.min_version.value_or(0);
    out.response.version_start = generated->version_start;
    out.response.version_end = generated->version_end;
    out.response.received_at = now_();
    if (auto replica = response->headers.Get("X-Stitch-Replica")) {
      out.response.replica = std::string(*replica);
    }
    out.generated = *std::move(generated);
    return out;
  }
  return absl::UnavailableError(absl::StrCat("demo: a rollout failed ", kMaxAttempts,
                                             " times through the gateway ", gateway_,
                                             "; last: ", last_error));
}

}  // namespace stitch
