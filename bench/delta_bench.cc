// delta_bench: throughput of the delta codec against floors measured in the
// same run on the same bytes.
//
// A synthetic bf16 checkpoint (default 2 GiB in 64 tensors) and a target in
// which 1% of the values moved by one mantissa step. Floors:
//   memcpy        copying the checkpoint once
//   apply floor   a minimal fused single-threaded loop: streaming zstd decode
//                 of each tensor's XOR frame into an L2-sized buffer, XOR into
//                 the base, xxh3-128 of the result
//   encode floor  the same for encode: XOR, zstd level 1, xxh3-128
//   copy floor    the I/O of applying to a directory without the codec:
//                 copying the checkpoint's files through a chunk buffer and
//                 fsync'ing them
// Then the codec itself: encode (tensors in memory -> a DELTA directory),
// apply to memory (a CheckpointImage, checksums verified) and apply to a
// directory (MaterializeCheckpoint, fsync'ed), each with 1 and 2 threads.
// Apply to a directory runs in a child process (this binary re-executed), so
// its peak RSS is its own and not this process's multi-GiB buffers. Every
// row shows wall-clock and CPU time: on a machine shared with other jobs,
// CPU time is the steadier measure of single-threaded work.
//
//   delta_bench [--size-gib G] [--tensors N] [--reps R] [--dir DIR]
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "encode_floor.h"
#include "stitch/delta/checkpoint_image.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_kernel.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/aligned_buffer.h"

extern char** environ;

namespace stitch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU time of this process (all threads), user + system.
double CpuSeconds() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

// Wall-clock and CPU seconds of one run. On a machine shared with other
// jobs, CPU time is the steadier measure of single-threaded work: it does
// not count the time spent waiting for a core.
struct Timing {
  double wall = 1e30;
  double cpu = 1e30;
};

class Stopwatch {
 public:
  Stopwatch() : wall_(Clock::now()), cpu_(CpuSeconds()) {}
  Timing Stop() const { return Timing{Seconds(wall_, Clock::now()), CpuSeconds() - cpu_}; }

 private:
  Clock::time_point wall_;
  double cpu_;
};

std::string LoadAverage() {
  std::string text;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[128];
    if (std::fgets(buf, sizeof buf, f) != nullptr) text = buf;
    std::fclose(f);
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "delta_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + std::string(s.message()));
}

AlignedBuffer Allocate(size_t n) {
  absl::StatusOr<AlignedBuffer> b = AlignedBuffer::Allocate(n, BufferInit::kZeroed);
  if (!b.ok()) Die("out of memory");
  return *std::move(b);
}

constexpr size_t kFloorChunk = kChunkBytes;

struct Model {
  std::vector<std::string> names;
  std::vector<size_t> offsets;  // into the contiguous buffers
  size_t tensor_bytes = 0;
  AlignedBuffer base, target;
  std::vector<TensorView> BaseViews() const { return Views(base); }
  std::vector<TensorView> TargetViews() const { return Views(target); }
  std::vector<TensorView> Views(const AlignedBuffer& b) const {
    std::vector<TensorView> v;
    for (size_t i = 0; i < names.size(); ++i) {
      v.push_back(TensorView{names[i],
                             DType::kBF16,
                             {static_cast<int64_t>(tensor_bytes / 2)},
                             b.span().subspan(offsets[i], tensor_bytes)});
    }
    return v;
  }
};

// Weight-like bf16 values: random sign and mantissa, exponents of values
// between about 1e-4 and 0.5; 1% of them nudged by one mantissa step.
Model MakeModel(uint64_t total_bytes, size_t tensors) {
  Model m;
  m.tensor_bytes = total_bytes / tensors / 2 * 2;
  m.base = Allocate(m.tensor_bytes * tensors);
  m.target = Allocate(m.tensor_bytes * tensors);
  std::mt19937_64 rng(42);
  auto* b = reinterpret_cast<uint16_t*>(m.base.data());
  const size_t values = m.base.size() / 2;
  for (size_t i = 0; i + 4 <= values; i += 4) {
    uint64_t r = rng();
    for (int k = 0; k < 4; ++k) {
      uint16_t bits = static_cast<uint16_t>(r >> (16 * k));
      uint16_t sign = bits & 0x8000;
      uint16_t exponent = static_cast<uint16_t>(0x71 + (bits >> 7 & 0xf) % 12);
      b[i + k] = static_cast<uint16_t>(sign | exponent << 7 | (bits & 0x7f));
    }
  }
  std::memcpy(m.target.data(), m.base.data(), m.base.size());
  auto* t = reinterpret_cast<uint16_t*>(m.target.data());
  std::geometric_distribution<size_t> gap(0.01);
  for (size_t i = gap(rng); i < values; i += 1 + gap(rng)) {
    t[i] =
        (t[i] & 0x7f) == 0x7f ? static_cast<uint16_t>(t[i] - 1) : static_cast<uint16_t>(t[i] + 1);
  }
  for (size_t i = 0; i < tensors; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%03zu.mlp.weight", i);
    m.names.push_back(name);
    m.offsets.push_back(i * m.tensor_bytes);
  }
  return m;
}

// The encode floor (encode_floor.h): one thread, fused XOR + zstd level 1 +
// xxh3-128. Keeps the frames for the apply floor.
Timing EncodeFloor(const Model& m, std::vector<std::vector<std::byte>>* frames,
                   std::vector<XXH128_hash_t>* sums) {
  AlignedBuffer x = Allocate(kFloorChunk), out = Allocate(ZSTD_CStreamOutSize());
  bench::FloorEncoder floor(x.span(), out.span());
  frames->assign(m.names.size(), {});
  sums->assign(m.names.size(), {});
  const Stopwatch watch;
  for (size_t k = 0; k < m.names.size(); ++k) {
    std::optional<XXH128_hash_t> sum = floor.Encode(
        m.base.data() + m.offsets[k], m.target.data() + m.offsets[k], m.tensor_bytes, (*frames)[k]);
    if (!sum.has_value()) Die("zstd");
    (*sums)[k] = *sum;
  }
  return watch.Stop();
}

// The apply floor: one thread, streaming decode + XOR into the base + xxh3.
Timing ApplyFloor(const Model& m, AlignedBuffer& work,
                  const std::vector<std::vector<std::byte>>& frames,
                  const std::vector<XXH128_hash_t>& sums) {
  std::memcpy(work.data(), m.base.data(), m.base.size());
  ZSTD_DCtx* d = ZSTD_createDCtx();
  XXH3_state_t* h = XXH3_createState();
  AlignedBuffer x = Allocate(kFloorChunk);
  const Stopwatch watch;
  for (size_t k = 0; k < m.names.size(); ++k) {
    ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
    XXH3_128bits_reset(h);
    ZSTD_inBuffer in{frames[k].data(), frames[k].size(), 0};
    std::byte* w = work.data() + m.offsets[k];
    for (size_t off = 0; off < m.tensor_bytes; off += kFloorChunk) {
      const size_t n = std::min(kFloorChunk, m.tensor_bytes - off);
      ZSTD_outBuffer o{x.data(), n, 0};
      while (o.pos < o.size) {
        size_t r = ZSTD_decompressStream(d, &o, &in);
        if (ZSTD_isError(r)) Die("zstd decode");
      }
      XorBytes(w + off, w + off, x.data(), n);
      XXH3_128bits_update(h, w + off, n);
    }
    XXH128_hash_t got = XXH3_128bits_digest(h);
    if (!XXH128_isEqual(got, sums[k])) Die("apply floor: checksum mismatch");
  }
  const Timing s = watch.Stop();
  XXH3_freeState(h);
  ZSTD_freeDCtx(d);
  if (std::memcmp(work.data(), m.target.data(), work.size()) != 0) Die("apply floor: wrong result");
  return s;
}

Timing Memcpy(const Model& m, AlignedBuffer& work) {
  const Stopwatch watch;
  std::memcpy(work.data(), m.base.data(), m.base.size());
  return watch.Stop();
}

// Writes `views` as a checkpoint directory of `shards` files.
void WriteCheckpointDir(const fs::path& dir, const std::vector<TensorView>& views, size_t shards) {
  fs::create_directories(dir);
  CheckpointIndex index;
  index.metadata["version"] = VersionMetadataString(0);
  const size_t per = (views.size() + shards - 1) / shards;
  for (size_t s = 0; s * per < views.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards);
    std::vector<TensorView> part(
        views.begin() + static_cast<long>(s * per),
        views.begin() + static_cast<long>(std::min(views.size(), (s + 1) * per)));
    for (const TensorView& v : part) index.weight_map[v.name] = name;
    Check(WriteSafetensors(dir / name, part), "write checkpoint");
  }
  Check(WriteIndex(dir, index), "write index");
}

// The I/O floor of applying to a directory: copying the checkpoint's files
// through a chunk buffer (pread, pwrite) and fsync'ing them, as apply does
// around its decoding.
Timing CopyFloor(const fs::path& from_dir, const fs::path& to_dir) {
  fs::remove_all(to_dir);
  fs::create_directories(to_dir);
  AlignedBuffer buf = Allocate(kFloorChunk);
  const Stopwatch watch;
  for (const auto& e : fs::directory_iterator(from_dir)) {
    const int in = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    const fs::path to = to_dir / e.path().filename();
    const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (in < 0 || out < 0) Die("copy floor: open");
    for (off_t off = 0;;) {
      const ssize_t n = ::pread(in, buf.data(), buf.size(), off);
      if (n < 0) Die("copy floor: read");
      if (n == 0) break;
      if (::pwrite(out, buf.data(), static_cast<size_t>(n), off) != n) Die("copy floor: write");
      off += n;
    }
    if (::fsync(out) != 0) Die("copy floor: fsync");
    ::close(in);
    ::close(out);
  }
  return watch.Stop();
}

struct ChildResult {
  Timing t;
  double write_seconds = 0, sync_seconds = 0;
  long max_rss_kib = 0;
};

// Re-executes this binary to apply `delta` to `anchor` into `out`.
ChildResult ApplyToDirectoryInChild(const fs::path& anchor, const fs::path& delta,
                                    const fs::path& out, int threads) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) Die("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 1);
  posix_spawn_file_actions_addclose(&actions, pipefd[0]);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string t = std::to_string(threads);
  std::vector<std::string> args{self,           "--child-apply", anchor.string(),
                                delta.string(), out.string(),    t};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), environ) != 0) Die("spawn");
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("apply child failed: " + text);
  }
  ChildResult r;
  if (std::sscanf(text.c_str(), "%lf %lf %lf %lf %ld", &r.t.wall, &r.t.cpu, &r.write_seconds,
                  &r.sync_seconds, &r.max_rss_kib) != 5 ||
      r.max_rss_kib < 0) {
    Die("apply child said: " + text);
  }
  return r;
}

int ChildApply(int argc, char** argv) {
  if (argc != 6) Die("--child-apply ANCHOR DELTA OUT THREADS");
  ApplyOptions o;
  o.threads = std::atoi(argv[5]);
  std::vector<fs::path> deltas{argv[3]};
  const Stopwatch watch;
  absl::StatusOr<MaterializeResult> r = MaterializeCheckpoint(argv[2], deltas, argv[4], o);
  const Timing s = watch.Stop();
  Check(r.status(), "apply to directory");
  // VmHWM is this process's own peak RSS: exec started a fresh address
  // space. (getrusage's ru_maxrss would also count the parent's peak, which
  // exec folds into the child's accounting.)
  long hwm_kib = -1;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::sscanf(line, "VmHWM: %ld kB", &hwm_kib) == 1) break;
    }
    std::fclose(f);
  }
  std::printf("%.6f %.6f %.6f %.6f %ld\n", s.wall, s.cpu, r->write_seconds, r->sync_seconds,
              hwm_kib);
  return 0;
}

struct Row {
  std::string op;
  int threads;
  Timing t;
  std::optional<Timing> floor;
  std::string note;
};

int Main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--child-apply") return ChildApply(argc, argv);
  double size_gib = 2.0;
  size_t tensors = 64;
  int reps = 3;
  fs::path root = fs::temp_directory_path();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--size-gib") {
      size_gib = std::atof(value().c_str());
    } else if (a == "--tensors") {
      tensors = static_cast<size_t>(std::atoll(value().c_str()));
    } else if (a == "--reps") {
      reps = std::atoi(value().c_str());
    } else if (a == "--dir") {
      root = value();
    } else {
      Die("usage: delta_bench [--size-gib G] [--tensors N] [--reps R] [--dir DIR]");
    }
  }
  if (size_gib <= 0 || tensors == 0 || reps <= 0) Die("sizes and counts must be positive");
  const uint64_t total = static_cast<uint64_t>(size_gib * (1ull << 30));
  std::string tmpl = (root / "delta-bench-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp in " + root.string());
  const fs::path dir = tmpl;
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};

  std::printf(
      "delta_bench: %.2f GiB of bf16 in %zu tensors, 1%% of values one mantissa step apart; "
      "best of %d runs; %u cores; load average at start: %s\n",
      size_gib, tensors, reps, std::thread::hardware_concurrency(), LoadAverage().c_str());
  Model m = MakeModel(total, tensors);
  const double bytes = static_cast<double>(m.base.size());
  // Best of `reps` runs, wall and CPU time each.
  auto best = [&](auto fn) {
    Timing b;
    for (int r = 0; r < reps; ++r) {
      const Timing t = fn();
      b.wall = std::min(b.wall, t.wall);
      b.cpu = std::min(b.cpu, t.cpu);
    }
    return b;
  };

  AlignedBuffer work = Allocate(m.base.size());
  const Timing memcpy_s = best([&] { return Memcpy(m, work); });
  std::vector<std::vector<std::byte>> frames;
  std::vector<XXH128_hash_t> sums;
  const Timing encode_floor_s = best([&] { return EncodeFloor(m, &frames, &sums); });
  const Timing apply_floor_s = best([&] { return ApplyFloor(m, work, frames, sums); });
  uint64_t compressed = 0;
  for (const auto& f : frames) compressed += f.size();
  frames.clear();
  frames.shrink_to_fit();
  work = AlignedBuffer();

  std::vector<Row> rows;
  rows.push_back({"memcpy", 1, memcpy_s, std::nullopt, ""});
  rows.push_back({"apply floor (decode+xor+xxh3)", 1, apply_floor_s, std::nullopt, ""});
  rows.push_back({"encode floor (xor+zstd-1+xxh3)", 1, encode_floor_s, std::nullopt, ""});

  const std::vector<TensorView> base_views = m.BaseViews(), target_views = m.TargetViews();
  const fs::path delta = dir / "weight_v000001";
  uint64_t payload = 0;
  for (int threads : {1, 2}) {
    const Timing s = best([&] {
      fs::remove_all(delta);
      EncodeOptions o;
      o.version = 1;
      o.base_version = 0;
      o.threads = threads;
      const Stopwatch watch;
      absl::StatusOr<EncodeResult> r = EncodeDelta(base_views, target_views, delta, o);
      const Timing t = watch.Stop();
      Check(r.status(), "encode");
      payload = r->payload_bytes;
      return t;
    });
    rows.push_back({"encode (memory -> DELTA dir)", threads, s, encode_floor_s, ""});
  }

  for (int threads : {1, 2}) {
    const Timing s = best([&] {
      absl::StatusOr<CheckpointImage> image =
          CheckpointImage::FromTensors(base_views, VersionRef{"", 0});
      Check(image.status(), "image");
      ApplyOptions o;
      o.threads = threads;
      std::vector<fs::path> deltas{delta};
      const Stopwatch watch;
      absl::StatusOr<ImageApplyResult> r = image->ApplyDeltas(deltas, o);
      const Timing t = watch.Stop();
      Check(r.status(), "apply to memory");
      if (threads == 2 && std::memcmp(image->tensors().begin()->second.data.data(),
                                      m.target.data() + m.offsets[0], m.tensor_bytes) != 0) {
        Die("apply to memory: wrong result");
      }
      return t;
    });
    rows.push_back({"apply to memory (verified)", threads, s, apply_floor_s, ""});
  }

  // The directory runs need the anchor on disk; the big buffers go first so
  // the page cache has room.
  const fs::path anchor = dir / "anchor";
  WriteCheckpointDir(anchor, base_views, 4);
  m.target = AlignedBuffer();
  const Timing copy_floor = best([&] { return CopyFloor(anchor, dir / "copy"); });
  fs::remove_all(dir / "copy");
  rows.push_back({"copy floor (pread+pwrite+fsync)", 1, copy_floor, std::nullopt, ""});
  long rss[3] = {0, 0, 0};
  for (int threads : {1, 2}) {
    ChildResult bestr;
    double best_cpu = 1e30;
    for (int r = 0; r < reps; ++r) {
      const fs::path out = dir / "out";
      fs::remove_all(out);
      ChildResult c = ApplyToDirectoryInChild(anchor, delta, out, threads);
      rss[threads] = std::max(rss[threads], c.max_rss_kib);
      best_cpu = std::min(best_cpu, c.t.cpu);
      if (c.t.wall < bestr.t.wall) bestr = c;
    }
    bestr.t.cpu = best_cpu;
    char note[192];
    std::snprintf(note, sizeof note,
                  "decode+write %.3fs, fsync+swap %.3fs; x (apply floor + copy floor) %.2f",
                  bestr.write_seconds, bestr.sync_seconds,
                  (apply_floor_s.wall + copy_floor.wall) / bestr.t.wall);
    rows.push_back({"apply to directory (verified)", threads, bestr.t, apply_floor_s, note});
  }

  std::printf("\n%-31s %3s %8s %6s %7s %8s %7s %8s %7s  %s\n", "operation", "thr", "wall s", "GB/s",
              "x floor", "x memcpy", "x 1 thr", "cpu s", "x floor", "note");
  std::printf("%-31s %3s %8s %6s %7s %8s %7s %8s %7s\n", "", "", "", "", "(wall)", "(wall)",
              "(wall)", "", "(cpu)");
  std::map<std::string, double> one_thread;
  for (const Row& r : rows) {
    const double gbs = bytes / r.t.wall / 1e9;
    if (r.threads == 1) one_thread[r.op] = r.t.wall;
    char floor[16] = "-", cpu_floor[16] = "-", speedup[16] = "-";
    if (r.floor) {
      std::snprintf(floor, sizeof floor, "%.2f", r.floor->wall / r.t.wall);
      if (r.threads == 1)
        std::snprintf(cpu_floor, sizeof cpu_floor, "%.2f", r.floor->cpu / r.t.cpu);
    }
    if (r.threads > 1 && one_thread.contains(r.op)) {
      std::snprintf(speedup, sizeof speedup, "%.2f", one_thread[r.op] / r.t.wall);
    }
    std::printf("%-31s %3d %8.3f %6.2f %7s %8.2f %7s %8.3f %7s  %s\n", r.op.c_str(), r.threads,
                r.t.wall, gbs, floor, memcpy_s.wall / r.t.wall, speedup, r.t.cpu, cpu_floor,
                r.note.c_str());
  }
  std::printf(
      "\ncompressed size: %.1f MiB of frames (%.2f%% of the checkpoint); payload files %.1f MiB\n",
      static_cast<double>(compressed) / (1 << 20), 100.0 * static_cast<double>(compressed) / bytes,
      static_cast<double>(payload) / (1 << 20));
  std::printf(
      "peak RSS of apply to directory: %.1f MiB with 1 thread, %.1f MiB with 2 (target < 256 "
      "MiB)\n",
      static_cast<double>(rss[1]) / 1024, static_cast<double>(rss[2]) / 1024);
  std::printf(
      "x floor: floor time / time (target >= 0.85 with 1 thread); x 1 thr: speedup of 2 threads "
      "(target >= 1.7); load average at end: %s\n",
      LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) { return stitch::Main(argc, argv); }
