#include "stitch/refengine/engine_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include <boost/asio/awaitable.hpp>
#include <boost/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/core/manifest.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/format/index.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/sse.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/model.h"
#include "stitch/refengine/sequence.h"
#include "stitch/refengine/test_models.h"

namespace stitch::testing {

namespace fs = std::filesystem;
namespace json = boost::json;

ModelConfig EngineTestConfig() {
  ModelConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 258;
  c.max_position_embeddings = 384;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

std::vector<HostTensor> EngineTestTensors(const ModelConfig& config, uint64_t seed) {
  return RandomTensors(config, seed, 0.3);
}

std::vector<HostTensor> PerturbTensors(const std::vector<HostTensor>& base, double delta,
                                       size_t every) {
  std::vector<HostTensor> out;
  for (size_t t = 0; t < base.size(); ++t) {
    const HostTensor& h = base[t];
    std::vector<float> values(h.data.size() / sizeof(float));
    std::memcpy(values.data(), h.data.data(), h.data.size());
    if (t % every == 0) {
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] += static_cast<float>(delta * ((i % 7) - 3.0) / 3.0);
      }
    }
    out.push_back(HostTensor::FromFloats(h.name, h.shape, values, h.dtype));
  }
  return out;
}

std::vector<HostTensor> SparselyPerturbTensors(const std::vector<HostTensor>& base, size_t every,
                                               double delta, size_t offset) {
  std::vector<HostTensor> out;
  for (const HostTensor& h : base) {
    const bool bf16 = h.dtype == DType::kBF16;
    std::vector<float> values(h.data.size() / (bf16 ? 2 : 4));
    for (size_t i = 0; i < values.size(); ++i) {
      if (bf16) {
        uint16_t b;
        std::memcpy(&b, h.data.data() + 2 * i, 2);
        values[i] = FloatFromBf16(b);
      } else {
        std::memcpy(&values[i], h.data.data() + 4 * i, 4);
      }
    }
    for (size_t i = offset; i < values.size(); i += every) {
      values[i] += static_cast<float>(delta) * (std::abs(values[i]) + 0.25f);
    }
    out.push_back(HostTensor::FromFloats(h.name, h.shape, values, h.dtype));
  }
  return out;
}

WeightPatch DiffWeightPatch(const std::vector<HostTensor>& from, const std::vector<HostTensor>& to,
                            VersionRef from_version, VersionRef to_version) {
  WeightPatch patch;
  patch.from = std::move(from_version);
  patch.to = std::move(to_version);
  std::map<std::string, const HostTensor*> old;
  for (const HostTensor& t : from) old.emplace(t.name, &t);
  for (const HostTensor& t : to) {
    const size_t width = DTypeSize(t.dtype);
    patch.stats.values_total += t.data.size() / width;
    const HostTensor& o = *old.at(t.name);
    TensorPatch p;
    p.name = t.name;
    p.dtype = t.dtype;
    p.shape = t.shape;
    p.checksum = Xxh3Checksum(t.data);
    for (size_t off = 0; off < t.data.size(); off += width) {
      if (std::memcmp(t.data.data() + off, o.data.data() + off, width) == 0) continue;
      p.idx.push_back(static_cast<int64_t>(off / width));
      for (size_t b = 0; b < width; ++b) {
        p.xor_bits.push_back(t.data[off + b] ^ o.data[off + b]);
        p.new_bits.push_back(t.data[off + b]);
      }
    }
    if (p.idx.empty()) continue;
    patch.stats.values_changed += p.idx.size();
    patch.tensors.push_back(std::move(p));
  }
  std::sort(patch.tensors.begin(), patch.tensors.end(),
            [](const TensorPatch& a, const TensorPatch& b) { return a.name < b.name; });
  patch.stats.tensors = patch.tensors.size();
  return patch;
}

absl::Status WriteModel(const fs::path& dir, const ModelConfig& config,
                        const std::vector<HostTensor>& tensors) {
  return WriteCheckpoint(dir, config, Views(tensors), ExistingDir::kRefuse);
}

absl::Status PublishDelta(const fs::path& updates_dir, int64_t version,
                          const std::vector<HostTensor>& base,
                          const std::vector<HostTensor>& target, const std::string& run_id) {
  std::error_code ec;
  fs::create_directories(updates_dir, ec);
  EncodeOptions options;
  options.version = version;
  options.base_version = version - 1;
  options.run_id = run_id;
  options.threads = 1;
  std::vector<TensorView> b = Views(base);
  std::vector<TensorView> t = Views(target);
  absl::StatusOr<EncodeResult> r =
      EncodeDelta(b, t, updates_dir / VersionDirName(version), options);
  return r.status();
}

absl::Status PublishFull(const fs::path& updates_dir, int64_t version,
                         const std::vector<HostTensor>& target, const std::string& run_id) {
  std::error_code ec;
  fs::create_directories(updates_dir, ec);
  FullVersionOptions options;
  options.version = version;
  options.run_id = run_id;
  std::vector<TensorView> t = Views(target);
  absl::StatusOr<FullVersionResult> r = WriteFullVersion(
      std::span<const TensorView>(t), updates_dir / VersionDirName(version), options);
  return r.status();
}

absl::Status CorruptVersion(const fs::path& version_dir) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(version_dir);
  if (!index.ok()) return index.status();
  absl::StatusOr<VersionManifest> manifest = index->ToManifest();
  if (!manifest.ok()) return manifest.status();
  if (manifest->files.empty()) {
    return absl::FailedPreconditionError("the version has no payload file to corrupt");
  }
  const fs::path file = version_dir / manifest->files.front();
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return absl::InternalError(ec.message());
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  // Past the header, into the frames: flip a run of bytes near the end.
  const std::streamoff at = static_cast<std::streamoff>(size) - 40;
  f.seekg(at);
  char bytes[24];
  f.read(bytes, sizeof(bytes));
  for (char& b : bytes) b = static_cast<char>(b ^ 0x5a);
  f.seekp(at);
  f.write(bytes, sizeof(bytes));
  return f.good() ? absl::OkStatus() : absl::InternalError("could not corrupt " + file.string());
}

std::shared_ptr<const ModelWeights> BuildWeights(const ModelConfig& config,
                                                 const std::vector<HostTensor>& tensors) {
  auto w = ModelWeights::FromTensors(config, Views(tensors));
  return w.ok() ? *w : nullptr;
}

std::vector<SampledToken> ReferenceGenerate(const ModelWeights& weights,
                                            const std::vector<int32_t>& prompt,
                                            const ReferenceOptions& options) {
  const ModelConfig& config = weights.config();
  std::vector<int32_t> tokens = prompt;
  std::vector<SampledToken> out;
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    if (static_cast<int64_t>(tokens.size()) > config.max_position_embeddings) break;
    absl::StatusOr<Matrix> hidden = ComputeHiddenStates(weights, tokens);
    if (!hidden.ok()) break;
    Matrix last(1, hidden->cols);
    std::span<const float> row = hidden->row(hidden->rows - 1);
    std::copy(row.begin(), row.end(), last.row(0).begin());
    const Matrix logits = ApplyLmHead(weights, last);
    const SampledToken t = SampleToken(logits.row(0), options.sampling, static_cast<uint64_t>(n));
    out.push_back(t);
    tokens.push_back(t.id);
    if (!options.ignore_eos && t.id == config.eos_token_id) break;
  }
  return out;
}

std::vector<SampledToken> SplitGenerate(const ModelWeights& before, const ModelWeights& after,
                                        const std::vector<int32_t>& prompt,
                                        const ReferenceOptions& options, int64_t first,
                                        bool drop_cache) {
  std::vector<SampledToken> out;
  absl::StatusOr<Sequence> seq = Sequence::Create(before.config(), prompt, options.sampling);
  if (!seq.ok()) return out;
  for (int64_t n = 0; n < options.max_new_tokens && seq->CanAdvance(); ++n) {
    if (n == first && drop_cache) seq->DropCache();
    const ModelWeights& w = n < first ? before : after;
    Sequence* s = &*seq;
    std::optional<SampledToken> t;
    while (!t.has_value()) {
      auto step = StepSequences(w, std::span<Sequence* const>(&s, 1));
      if (!step.ok()) return out;
      t = (*step)[0];
    }
    out.push_back(*t);
    if (!options.ignore_eos && t->id == before.config().eos_token_id) break;
  }
  return out;
}

std::vector<int32_t> Ids(const std::vector<SampledToken>& tokens) {
  std::vector<int32_t> ids;
  for (const SampledToken& t : tokens) ids.push_back(t.id);
  return ids;
}

std::vector<double> Logprobs(const std::vector<SampledToken>& tokens) {
  std::vector<double> out;
  for (const SampledToken& t : tokens) out.push_back(t.logprob);
  return out;
}

namespace {

const json::value* Walk(const json::value& root, std::string_view path) {
  const json::value* v = &root;
  for (absl::string_view part : absl::StrSplit(AbslView(path), '.')) {
    if (const json::object* o = v->if_object()) {
      auto it = o->find(json::string_view(part.data(), part.size()));
      if (it == o->end()) return nullptr;
      v = &it->value();
    } else if (const json::array* a = v->if_array()) {
      size_t i = 0;
      if (!absl::SimpleAtoi(part, &i) || i >= a->size()) return nullptr;
      v = &(*a)[i];
    } else {
      return nullptr;
    }
  }
  return v;
}

std::optional<json::value> Parse(std::string_view body) {
  boost::system::error_code ec;
  json::value v = json::parse(json::string_view(body.data(), body.size()), ec);
  if (ec) return std::nullopt;
  return v;
}

double NumberOf(const json::value& v) {
  if (v.is_double()) return v.get_double();
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  return std::nan("");
}

}  // namespace

std::optional<std::string> JsonGet(std::string_view body, std::string_view path) {
  std::optional<json::value> root = Parse(body);
  if (!root) return std::nullopt;
  const json::value* v = Walk(*root, path);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return std::string(v->get_string().data(), v->get_string().size());
  return json::serialize(*v);
}

std::vector<int64_t> JsonInts(std::string_view body, std::string_view path) {
  std::vector<int64_t> out;
  for (double d : JsonNumbers(body, path)) out.push_back(static_cast<int64_t>(d));
  return out;
}

std::vector<double> JsonNumbers(std::string_view body, std::string_view path, int column) {
  std::vector<double> out;
  std::optional<json::value> root = Parse(body);
  if (!root) return out;
  const json::value* v = Walk(*root, path);
  if (v == nullptr || !v->is_array()) return out;
  for (const json::value& item : v->get_array()) {
    if (column < 0) {
      out.push_back(NumberOf(item));
    } else if (item.is_array() && static_cast<size_t>(column) < item.get_array().size()) {
      out.push_back(NumberOf(item.get_array()[static_cast<size_t>(column)]));
    }
  }
  return out;
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// --- SseClient ------------------------------------------------------------

struct SseClient::Impl {
  EventLoop loop;
  std::optional<HttpClient> client;
  std::optional<HttpResponseStream> stream;
  SseEventSplitter splitter;

  Impl() { client.emplace(loop.executor()); }
  ~Impl() {
    auto drop = [this]() -> boost::asio::awaitable<void> {
      stream.reset();
      client.reset();
      co_return;
    };
    loop.BlockOn(drop());
  }
};

SseClient::SseClient() : impl_(std::make_unique<Impl>()) {}
SseClient::~SseClient() = default;

absl::StatusOr<int> SseClient::Open(const std::string& url, const std::string& path,
                                    const std::string& body) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return parsed.status();
  HttpRequest request;
  request.method = "POST";
  request.target = path;
  request.headers.Add("Content-Type", "application/json");
  request.body = body;
  CallOptions options;
  options.timeout = std::chrono::seconds(30);
  options.stream_idle_timeout = std::chrono::seconds(30);
  Impl* impl = impl_.get();
  const HttpOrigin origin = parsed->origin;
  auto open = [impl, origin, &request,
               options]() -> boost::asio::awaitable<absl::StatusOr<HttpResponseStream>> {
    co_return co_await impl->client->SendStreamed(origin, std::move(request), options);
  };
  absl::StatusOr<HttpResponseStream> stream = impl->loop.BlockOn(open());
  if (!stream.ok()) return stream.status();
  impl->stream.emplace(*std::move(stream));
  return impl->stream->status();
}

absl::StatusOr<std::optional<std::string>> SseClient::Next() {
  Impl* impl = impl_.get();
  for (;;) {
    if (std::optional<std::string> event = impl->splitter.Next()) {
      if (std::optional<std::string> data = SseData(*event)) return data;
      continue;
    }
    if (!impl->stream.has_value()) return std::optional<std::string>();
    auto read = [impl]() -> boost::asio::awaitable<absl::StatusOr<std::string>> {
      co_return co_await impl->stream->Read();
    };
    absl::StatusOr<std::string> bytes = impl->loop.BlockOn(read());
    if (!bytes.ok()) return bytes.status();
    if (bytes->empty()) return std::optional<std::string>();
    impl->splitter.Append(*bytes);
  }
}

absl::StatusOr<std::vector<std::string>> SseClient::ReadAll() {
  std::vector<std::string> out;
  for (;;) {
    absl::StatusOr<std::optional<std::string>> next = Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return out;
    out.push_back(**next);
  }
}

void SseClient::Close() {
  Impl* impl = impl_.get();
  auto close = [impl]() -> boost::asio::awaitable<void> {
    if (impl->stream.has_value()) impl->stream->Close();
    impl->stream.reset();
    co_return;
  };
  impl->loop.BlockOn(close());
}

// --- RawHttpRequest ------------------------------------------------------------

RawHttpRequest::RawHttpRequest(uint16_t port, std::string_view path, std::string_view body) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
  std::string request = absl::StrCat("POST ", AbslView(path),
                                     " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                     "application/json\r\nContent-Length: ",
                                     body.size(), "\r\n\r\n", AbslView(body));
  std::string_view rest = request;
  while (!rest.empty()) {
    const ssize_t n = ::send(fd_, rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    rest.remove_prefix(static_cast<size_t>(n));
  }
  sent_ = true;
}

RawHttpRequest::~RawHttpRequest() { Close(); }

void RawHttpRequest::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// --- SchedulerGate ------------------------------------------------------------

struct SchedulerGate::State {
  absl::Mutex mu;
  bool armed ABSL_GUARDED_BY(mu) = false;
  bool held ABSL_GUARDED_BY(mu) = false;
  bool released ABSL_GUARDED_BY(mu) = false;
  std::function<bool()> when ABSL_GUARDED_BY(mu);
};

std::shared_ptr<SchedulerGate::State> SchedulerGate::MakeState() {
  return std::make_shared<State>();
}

std::function<void()> SchedulerGate::Hook() {
  return [s = state_] {
    std::function<bool()> when;
    {
      absl::MutexLock lock(&s->mu);
      if (!s->armed) return;
      when = s->when;
    }
    if (!when()) return;
    absl::MutexLock lock(&s->mu);
    s->armed = false;
    s->held = true;
    s->mu.Await(absl::Condition(&s->released));
    s->held = false;
    s->released = false;
  };
}

void SchedulerGate::Arm(std::function<bool()> when) {
  absl::MutexLock lock(&state_->mu);
  state_->when = std::move(when);
  state_->armed = true;
  state_->released = false;
}

bool SchedulerGate::WaitHeld(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&state_->mu);
  return state_->mu.AwaitWithTimeout(absl::Condition(&state_->held), absl::FromChrono(timeout));
}

void SchedulerGate::Release() {
  absl::MutexLock lock(&state_->mu);
  state_->armed = false;
  state_->released = true;
}

}  // namespace stitch::testing
