#include "stitch/delta/checkpoint_image.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_chain.h"
#include "stitch/delta/delta_kernel.h"
#include "stitch/delta/delta_version.h"
#include "stitch/format/checkpoint_reader.h"

namespace stitch {
namespace fs = std::filesystem;

absl::StatusOr<CheckpointImage> CheckpointImage::Load(const fs::path& dir,
                                                      const LoadOptions& options) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  if (reader->index().is_delta()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir.string(), " is a DELTA version, not a checkpoint; load its anchor and apply it"));
  }
  std::optional<int64_t> version = reader->version() ? reader->version() : options.version;
  if (!version) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", dir.string(), " records no version; say which version it holds"));
  }
  std::string run = options.run_id;
  if (auto it = reader->index().metadata.find(std::string(kRunIdMetadataKey));
      it != reader->index().metadata.end()) {
    if (!run.empty() && run != it->second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir.string(), " belongs to run \"", it->second, "\", not \"", run, "\""));
    }
    run = it->second;
  }
  CheckpointImage image;
  std::vector<ImageTensor*> slots;
  for (const CheckpointTensor& t : reader->tensors()) {
    absl::StatusOr<AlignedBuffer> buf =
        AlignedBuffer::Allocate(t.nbytes, BufferInit::kUninitialized);
    if (!buf.ok()) return Annotate(buf.status(), absl::StrCat("tensor \"", t.name, "\""));
    ImageTensor& it = image.tensors_[t.name];
    it.dtype = t.dtype;
    it.shape = t.shape;
    it.data = *std::move(buf);
    slots.push_back(&it);
  }
  std::vector<uint64_t> sizes;
  for (const CheckpointTensor& t : reader->tensors()) sizes.push_back(t.nbytes);
  const std::vector<size_t> order = LargestFirst(sizes);
  absl::Status st = ParallelFor(order.size(), options.threads, [&](size_t i, int) -> absl::Status {
    const CheckpointTensor& t = reader->tensors()[order[i]];
    const CheckpointFile& f = reader->files()[t.file];
    std::span<std::byte> dst = slots[order[i]]->data.span();
    if (absl::Status read = ReadFully(f.fd.get(), t.offset, dst, f.path); !read.ok()) return read;
    // A FULL version that records checksums is checked as it is loaded: a
    // flipped byte must never reach the served weights.
    if (t.checksum) return CompareRecordedChecksum(t, f, Xxh3Checksum(dst));
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  image.version_ = VersionRef{run, *version};
  return image;
}

absl::StatusOr<CheckpointImage> CheckpointImage::FromTensors(std::span<const TensorView> tensors,
                                                             const VersionRef& version) {
  CheckpointImage image;
  for (const TensorView& t : tensors) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", t.name, "\" has an invalid shape ", ShapeText(t.shape)));
      }
    }
    if (elements * DTypeSize(t.dtype) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" has ", t.data.size(),
                                                     " bytes, but ", AbslView(DTypeName(t.dtype)),
                                                     " ", ShapeText(t.shape), " needs ",
                                                     elements * DTypeSize(t.dtype)));
    }
    if (image.tensors_.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" appears twice"));
    }
    absl::StatusOr<AlignedBuffer> buf =
        AlignedBuffer::Allocate(t.data.size(), BufferInit::kUninitialized);
    if (!buf.ok()) return buf.status();
    if (!t.data.empty()) std::memcpy(buf->data(), t.data.data(), t.data.size());
    image.tensors_.emplace(t.name, ImageTensor{t.dtype, t.shape, *std::move(buf)});
  }
  image.version_ = version;
  return image;
}

const ImageTensor* CheckpointImage::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t CheckpointImage::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.data.size();
  return n;
}

std::vector<TensorView> CheckpointImage::Views() const {
  std::vector<TensorView> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_)
    out.push_back(TensorView{name, t.dtype, t.shape, t.data.span()});
  return out;
}

void CheckpointImage::Swap(CheckpointImage& other) noexcept {
  tensors_.swap(other.tensors_);
  version_.swap(other.version_);
}

namespace {

// One tensor an apply changes in place.
struct Job {
  const std::string* name;
  const TensorChange* change;
  std::span<std::byte> bytes;
};

// The deltas after `held` (for `options.run_id`, or the run the image
// holds), checked to continue from it: same run, no gap, not behind it.
absl::StatusOr<DeltaChain> OpenChainAfter(const VersionRef& held,
                                          std::span<const fs::path> delta_dirs,
                                          const ApplyOptions& options) {
  if (!options.run_id.empty() && !held.run_id.empty() && options.run_id != held.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("the image holds run \"", held.run_id, "\", the deltas are for run \"",
                     options.run_id, "\"; load that run's boot checkpoint first"));
  }
  const std::string run = options.run_id.empty() ? held.run_id : options.run_id;
  absl::StatusOr<DeltaChain> chain = OpenDeltaChain(delta_dirs, run);
  if (!chain.ok()) return chain.status();
  if (!held.run_id.empty() && !chain->run_id.empty() && chain->run_id != held.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("the image holds run \"", held.run_id, "\", the deltas belong to run \"",
                     chain->run_id, "\"; load that run's boot checkpoint first"));
  }
  if (chain->empty()) return chain;
  if (chain->target_version() < held.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the image holds version ", held.version, ", newer than the deltas' target version ",
        chain->target_version(), "; reload the image from an anchor to go back"));
  }
  if (chain->base_version() > held.version) {
    return absl::InvalidArgumentError(
        absl::StrCat("the lineage has a gap: the image holds version ", held.version,
                     ", the first delta ", chain->deltas.front().dir().string(),
                     " applies to version ", chain->base_version(), "; the deltas for versions ",
                     held.version + 1, "..", chain->base_version(), " are missing"));
  }
  return chain;
}

// Undoes a partial apply: XOR is its own inverse, so the frames each job
// had folded (progress) are folded again over the same bytes.
absl::Status UndoFolds(std::span<const Job> jobs, std::span<const FoldProgress> progress,
                       std::vector<CodecWorkspace>& workspaces, int threads) {
  return ParallelFor(jobs.size(), threads, [&](size_t k, int worker) -> absl::Status {
    const Job& job = jobs[k];
    const FoldProgress& p = progress[k];
    std::span<const FrameRef> frames = job.change->frames;
    MemorySource src(job.bytes);
    MemorySink sink(job.bytes);
    CodecWorkspace& ws = workspaces[static_cast<size_t>(worker)];
    if (p.frames_done > 0) {
      FoldSpec spec{*job.name, job.bytes.size(), frames.first(p.frames_done)};
      if (absl::Status s = FoldFrames(ws, spec, src, sink); !s.ok()) return s;
    }
    if (p.prefix_done > 0) {
      const size_t n = std::min(kMaxFramesPerPass, frames.size() - p.frames_done);
      FoldSpec spec{*job.name, job.bytes.size(), frames.subspan(p.frames_done, n)};
      spec.limit = p.prefix_done;
      if (absl::Status s = FoldFrames(ws, spec, src, sink); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<ImageApplyResult> CheckpointImage::ApplyDeltas(std::span<const fs::path> delta_dirs,
                                                              const ApplyOptions& options) {
  if (!version_) {
    return absl::FailedPreconditionError("the image holds no checkpoint; load one first");
  }
  const VersionRef held = *version_;
  absl::StatusOr<DeltaChain> chain = OpenChainAfter(held, delta_dirs, options);
  if (!chain.ok()) return chain.status();
  ImageApplyResult result;
  result.version = held;
  if (chain->empty()) return result;
  if (absl::Status s = CheckChainAgainst(*chain,
                                         [&](std::string_view name) -> std::optional<uint64_t> {
                                           const ImageTensor* t = Find(name);
                                           if (t == nullptr) return std::nullopt;
                                           return t->data.size();
                                         });
      !s.ok()) {
    return s;
  }
  const size_t first = static_cast<size_t>(held.version - chain->base_version());
  const std::map<std::string, TensorChange, std::less<>> plan = PlanChanges(*chain, first);
  result.version =
      VersionRef{chain->run_id.empty() ? held.run_id : chain->run_id, chain->target_version()};
  result.deltas_applied = chain->deltas.size() - first;
  result.tensors_changed = plan.size();

  std::vector<Job> jobs;
  std::vector<uint64_t> sizes;
  for (const auto& [name, change] : plan) {
    jobs.push_back(Job{&name, &change, tensors_.find(name)->second.data.span()});
    sizes.push_back(jobs.back().bytes.size());
    result.bytes_decoded += jobs.back().bytes.size();
  }
  const std::vector<size_t> order = LargestFirst(sizes);
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  std::vector<CodecWorkspace> workspaces(static_cast<size_t>(threads));
  std::vector<FoldProgress> progress(jobs.size());
  ProgressMeter meter(result.bytes_decoded, options.progress);
  std::atomic<bool> cancel{false};
  absl::Status st = ParallelFor(
      order.size(), threads,
      [&](size_t i, int worker) -> absl::Status {
        const Job& job = jobs[order[i]];
        MemorySource src(job.bytes);
        MemorySink sink(job.bytes);
        FoldSpec spec{*job.name,
                      job.bytes.size(),
                      job.change->frames,
                      job.change->expected,
                      UINT64_MAX,
                      &cancel,
                      &meter};
        return FoldFrames(workspaces[static_cast<size_t>(worker)], spec, src, sink,
                          &progress[order[i]]);
      },
      &cancel);
  if (st.ok()) {
    meter.Finish();
    version_ = result.version;
    return result;
  }

  const absl::Status undo = UndoFolds(jobs, progress, workspaces, threads);
  if (!undo.ok()) {
    // Cannot happen unless memory runs out or files change underneath: the
    // same bytes decoded fine a moment ago. The contents are unknown now.
    tensors_.clear();
    version_.reset();
    return absl::InternalError(absl::StrCat(st.message(), "; restoring the image then failed (",
                                            undo.message(), "), so it was cleared: reload it"));
  }
  return st;
}

}  // namespace stitch
