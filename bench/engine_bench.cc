// engine_bench: the reference engine over HTTP against baselines measured in
// the same run.
//
// 1. Generation throughput with 1, 8 and 32 concurrent /generate requests
//    through HTTP (an in-process engine on a loopback port), against the
//    same batches stepped directly through the model (StepSequences): the
//    ratio is what HTTP, JSON and the scheduler cost.
// 2. Commits for two model sizes (at least 8x apart in parameters): the
//    scheduler's pause for a cpu commit (a pointer swap: it must stay flat)
//    and the whole /update_weights_from_cpu call, against the time to load
//    the staged directory with /update_weights_from_disk and to memcpy the
//    weights once (which grow with the model).
//
//   engine_bench [--tokens N] [--reps R]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/client.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/sequence.h"
#include "stitch/refengine/server.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "engine_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, std::string_view what) {
  if (!v.ok()) Die(absl::StrCat(AbslView(what), ": ", v.status().ToString()));
  return *std::move(v);
}
void Check(const absl::Status& s, std::string_view what) {
  if (!s.ok()) Die(absl::StrCat(AbslView(what), ": ", s.ToString()));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Model {
  std::string name;
  ModelConfig config;
  fs::path dir;
  fs::path updates;
  std::vector<HostTensor> boot;
  int64_t parameters = 0;
};

Model MakeModel(const fs::path& root, std::string name, int64_t hidden, int64_t layers,
                int64_t heads, int64_t versions) {
  Model m;
  m.name = std::move(name);
  m.config.hidden_size = hidden;
  m.config.num_hidden_layers = layers;
  m.config.num_attention_heads = heads;
  m.config.num_key_value_heads = heads;
  m.config.intermediate_size = (8 * hidden / 3 + 15) / 16 * 16;
  m.config.max_position_embeddings = 1024;
  m.dir = root / m.name / "boot";
  m.updates = root / m.name / "store" / "updates";
  m.boot = RandomCheckpointTensors(m.config, 1);
  for (const HostTensor& t : m.boot) m.parameters += static_cast<int64_t>(t.data.size() / 4);
  Check(testing::WriteModel(m.dir, m.config, m.boot), "write " + m.name);
  std::vector<HostTensor> previous = m.boot;
  for (int64_t v = 1; v <= versions; ++v) {
    std::vector<HostTensor> next = testing::PerturbTensors(previous, 0.001);
    Check(testing::PublishDelta(m.updates, v, previous, next, "bench"), "delta");
    previous = std::move(next);
  }
  return m;
}

std::unique_ptr<EngineServer> StartEngine(const Model& m, int64_t max_running) {
  EngineOptions options;
  options.model_dir = m.dir;
  options.run_id = "bench";
  options.scheduler.max_running = max_running;
  return Check(EngineServer::Start(options), "start the engine");
}

HttpResponse Post(const EngineServer& server, std::string_view path, std::string body) {
  FetchOptions options;
  options.timeout = std::chrono::minutes(10);
  HttpResponse r =
      Check(HttpFetch("POST", server.url() + std::string(path), std::move(body), options), path);
  if (r.status != 200) Die(absl::StrCat(AbslView(path), ": HTTP ", r.status, ": ", r.body));
  return r;
}

std::string Prompt(int i) { return absl::StrCat("Request number ", i, " of the benchmark:"); }

// Tokens per second for `concurrency` simultaneous requests through HTTP.
double HttpTokensPerSecond(const EngineServer& server, int concurrency, int tokens) {
  const auto start = Clock::now();
  std::vector<std::future<HttpResponse>> calls;
  for (int i = 0; i < concurrency; ++i) {
    calls.push_back(std::async(std::launch::async, [&server, i, tokens] {
      return Post(
          server, "/generate",
          absl::StrCat(R"({"text": ")", Prompt(i), R"(", "sampling_params": {"max_new_tokens": )",
                       tokens, R"(, "temperature": 0, "ignore_eos": true}})"));
    }));
  }
  for (auto& c : calls) c.get();
  return concurrency * tokens / Seconds(start, Clock::now());
}

// The same batch stepped directly through the model.
double DirectTokensPerSecond(const ModelWeights& weights, int concurrency, int tokens) {
  std::vector<Sequence> sequences;
  SamplingParams greedy;
  greedy.temperature = 0;
  for (int i = 0; i < concurrency; ++i) {
    sequences.push_back(
        Check(Sequence::Create(weights.config(), EncodeText(Prompt(i), BosMode::kPrepend), greedy),
              "sequence"));
  }
  std::vector<Sequence*> batch;
  for (Sequence& s : sequences) batch.push_back(&s);
  const auto start = Clock::now();
  for (int step = 0; step < tokens; ++step) Check(StepSequences(weights, batch), "step");
  return concurrency * tokens / Seconds(start, Clock::now());
}

struct CommitTimes {
  double cpu_pause = 0;   // the scheduler's hold
  double cpu_call = 0;    // POST /update_weights_from_cpu
  double disk_call = 0;   // POST /update_weights_from_disk
  double cpu_stage = 0;   // POST /stage_weight_update (cpu)
  double disk_stage = 0;  // POST /stage_weight_update (disk)
  double memcpy = 0;      // copying the float32 weights once
};

CommitTimes MeasureCommits(const Model& m, const fs::path& local, int reps) {
  std::unique_ptr<EngineServer> server = StartEngine(m, 8);
  std::vector<double> pause, cpu_call, disk_call, cpu_stage, disk_stage;
  auto stage_body = [&](int64_t target, std::string_view destination) {
    return absl::StrCat(R"({"base_checkpoint_dir": ")", m.dir.string(),
                        R"(", "base_version": 0, "target_version": )", target,
                        R"(, "run_id": "bench", "destination": ")", std::string(destination),
                        R"(", "checkpoint_source_dir": ")", m.updates.string(),
                        R"(", "local_checkpoint_dir": ")", local.string(), R"("})");
  };
  for (int64_t v = 1; v <= reps; ++v) {
    auto t0 = Clock::now();
    Post(*server, "/stage_weight_update", stage_body(v, "cpu"));
    auto t1 = Clock::now();
    HttpResponse commit =
        Post(*server, "/update_weights_from_cpu", absl::StrCat(R"({"target_version": )", v, "}"));
    auto t2 = Clock::now();
    cpu_stage.push_back(Seconds(t0, t1));
    cpu_call.push_back(Seconds(t1, t2));
    pause.push_back(std::stod(testing::JsonGet(commit.body, "pause_seconds").value_or("0")));

    t0 = Clock::now();
    Post(*server, "/stage_weight_update", stage_body(v, "disk"));
    t1 = Clock::now();
    Post(*server, "/update_weights_from_disk",
         absl::StrCat(R"({"model_path": ")", local.string(), R"("})"));
    t2 = Clock::now();
    disk_stage.push_back(Seconds(t0, t1));
    disk_call.push_back(Seconds(t1, t2));
  }
  server->Shutdown();

  std::vector<float> from(static_cast<size_t>(m.parameters), 1.0f);
  std::vector<float> to(from.size());
  std::vector<double> copies;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(to.data(), from.data(), from.size() * sizeof(float));
    copies.push_back(Seconds(t0, Clock::now()));
  }
  return CommitTimes{Median(pause),     Median(cpu_call),   Median(disk_call),
                     Median(cpu_stage), Median(disk_stage), Median(copies)};
}

int Main(int argc, char** argv) {
  int tokens = 64;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokens" && i + 1 < argc) {
      tokens = std::atoi(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      Die("usage: engine_bench [--tokens N] [--reps R]");
    }
  }
  const fs::path root =
      fs::temp_directory_path() / absl::StrCat("engine_bench-", static_cast<int>(::getpid()));
  fs::create_directories(root);

  Model small = MakeModel(root, "small", 256, 4, 4, reps);
  std::printf("engine_bench: small model %lld parameters, %d tokens per request\n\n",
              static_cast<long long>(small.parameters), tokens);

  std::printf("%-12s %14s %14s %10s\n", "concurrency", "http tok/s", "direct tok/s", "http/direct");
  {
    std::unique_ptr<EngineServer> server = StartEngine(small, 64);
    auto weights = testing::BuildWeights(small.config, small.boot);
    HttpTokensPerSecond(*server, 1, 8);  // warm up
    double single = 0;
    for (int c : {1, 8, 32}) {
      const double http = HttpTokensPerSecond(*server, c, tokens);
      const double direct = DirectTokensPerSecond(*weights, c, tokens);
      if (c == 1) single = http;
      std::printf("%-12d %14.0f %14.0f %10.2f   (x%.1f vs 1 request)\n", c, http, direct,
                  http / direct, http / single);
    }
  }

  Model large = MakeModel(root, "large", 768, 6, 12, reps);
  std::printf("\nlarge model %lld parameters (%.1fx small)\n\n",
              static_cast<long long>(large.parameters),
              static_cast<double>(large.parameters) / static_cast<double>(small.parameters));
  const CommitTimes s = MeasureCommits(small, root / "small" / "local", reps);
  const CommitTimes l = MeasureCommits(large, root / "large" / "local", reps);
  std::printf("%-26s %12s %12s %12s\n", "(median, ms)", "small", "large", "large/small");
  auto row = [](const char* name, double a, double b) {
    std::printf("%-26s %12.3f %12.3f %12.2f\n", name, a * 1e3, b * 1e3, b / a);
  };
  row("cpu commit: pause", s.cpu_pause, l.cpu_pause);
  row("cpu commit: HTTP call", s.cpu_call, l.cpu_call);
  row("disk commit: HTTP call", s.disk_call, l.disk_call);
  row("cpu stage (1 delta)", s.cpu_stage, l.cpu_stage);
  row("disk stage (1 delta)", s.disk_stage, l.disk_stage);
  row("memcpy of the weights", s.memcpy, l.memcpy);
  std::printf("\npause_large/pause_small = %.2f (parameters x%.1f); disk_large/disk_small = %.2f\n",
              l.cpu_pause / s.cpu_pause,
              static_cast<double>(large.parameters) / static_cast<double>(small.parameters),
              l.disk_call / s.disk_call);
  std::error_code ec;
  fs::remove_all(root, ec);
  return 0;
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) { return stitch::Main(argc, argv); }
