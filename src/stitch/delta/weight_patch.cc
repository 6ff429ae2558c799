#include "stitch/delta/weight_patch.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_chain.h"
#include "stitch/delta/delta_kernel.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/aligned_buffer.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace {

namespace json = boost::json;

// The unsigned integer dtype as wide as one element of `d`: patches carry
// bits, never numbers.
absl::StatusOr<DType> BitsDType(DType d, std::string_view tensor) {
  switch (DTypeSize(d)) {
    case 1:
      return DType::kU8;
    case 2:
      return DType::kI16;
    case 4:
      return DType::kI32;
    case 8:
      return DType::kI64;
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", AbslView(tensor), "\" has dtype ",
                                                 AbslView(DTypeName(d)),
                                                 ", whose elements a patch cannot address"));
}

json::array ShapeJson(const std::vector<int64_t>& shape) {
  json::array a;
  for (int64_t d : shape) a.emplace_back(d);
  return a;
}

// Folds the tensor's frames into its XOR stream, checks the target bytes
// against the recorded checksum and collects the elements that differ.
absl::Status BuildTensorPatch(CodecWorkspace& ws, const PatchTargetTensor& t,
                              std::string_view where, const TensorChange& change,
                              TensorPatch& patch) {
  auto diff_buffer = AlignedBuffer::Allocate(t.nbytes);
  if (!diff_buffer.ok()) return diff_buffer.status();
  std::byte* diff = diff_buffer->data();
  std::span<std::byte> diff_bytes(diff, t.nbytes);
  FoldSpec spec;
  spec.tensor = t.name;
  spec.nbytes = t.nbytes;
  spec.frames = change.frames;
  MemorySource zeros(diff_bytes);
  MemorySink sink(diff_bytes);
  if (absl::Status s = FoldFrames(ws, spec, zeros, sink); !s.ok()) return s;

  auto now_buffer = AlignedBuffer::Allocate(t.nbytes, BufferInit::kUninitialized);
  if (!now_buffer.ok()) return now_buffer.status();
  const std::byte* now = now_buffer->data();
  std::span<std::byte> now_bytes(now_buffer->data(), t.nbytes);
  if (absl::Status s = t.read(now_bytes); !s.ok()) return s;
  if (Xxh3Checksum(now_bytes) != change.expected) {
    return WithKind(
        absl::DataLossError(absl::StrCat("tensor \"", t.name, "\" in ", AbslView(where),
                                         " is not the deltas' target (its xxh3-128 is ",
                                         Xxh3Checksum(now_bytes).ToHex(), ", the delta records ",
                                         change.expected.ToHex(), ")")),
        ErrorKind::kChecksumMismatch);
  }
  const size_t width = DTypeSize(t.dtype);
  static constexpr std::byte kZero[8] = {};
  for (uint64_t off = 0; off < t.nbytes; off += width) {
    if (std::memcmp(diff + off, kZero, width) == 0) continue;
    patch.idx.push_back(static_cast<int64_t>(off / width));
    patch.xor_bits.insert(patch.xor_bits.end(), diff + off, diff + off + width);
    patch.new_bits.insert(patch.new_bits.end(), now + off, now + off + width);
  }
  patch.checksum = change.expected;
  return absl::OkStatus();
}

std::string Describe(const WeightPatchOptions& options) {
  return absl::StrCat("patching ", options.from.ToString(), " to ", options.to.ToString());
}

}  // namespace

absl::StatusOr<WeightPatch> BuildWeightPatch(std::span<const std::filesystem::path> delta_dirs,
                                             std::span<const PatchTargetTensor> target,
                                             std::string_view where,
                                             const WeightPatchOptions& options) {
  const std::string what = Describe(options);
  auto chain = OpenDeltaChain(delta_dirs, options.to.run_id);
  if (!chain.ok()) return Annotate(chain.status(), what);
  if (chain->empty() || chain->base_version() != options.from.version ||
      chain->target_version() != options.to.version) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the deltas given run from ",
        chain->empty() ? std::string("nowhere") : absl::StrCat(chain->base_version()), " to ",
        chain->empty() ? std::string("nowhere") : absl::StrCat(chain->target_version())));
  }
  std::map<std::string_view, const PatchTargetTensor*, std::less<>> by_name;
  for (const PatchTargetTensor& t : target) by_name.emplace(t.name, &t);
  auto find = [&by_name](std::string_view name) -> const PatchTargetTensor* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  if (absl::Status s = CheckChainAgainst(*chain,
                                         [&](std::string_view name) -> std::optional<uint64_t> {
                                           const PatchTargetTensor* t = find(name);
                                           if (t == nullptr) return std::nullopt;
                                           return t->nbytes;
                                         });
      !s.ok()) {
    return Annotate(s, what);
  }

  WeightPatch patch;
  patch.from = options.from;
  patch.to = options.to;
  WeightPatchStats& stats = patch.stats;
  for (const PatchTargetTensor& t : target) stats.values_total += t.nbytes / DTypeSize(t.dtype);
  const auto changes = PlanChanges(*chain, 0);
  std::vector<const PatchTargetTensor*> tensors;
  for (const auto& [name, change] : changes) {
    const PatchTargetTensor* t = find(name);
    if (absl::StatusOr<DType> bits = BitsDType(t->dtype, name); !bits.ok()) {
      return Annotate(bits.status(), what);
    }
    TensorPatch p;
    p.name = name;
    p.dtype = t->dtype;
    p.shape = t->shape;
    patch.tensors.push_back(std::move(p));
    tensors.push_back(t);
  }
  std::vector<CodecWorkspace> workspaces(static_cast<size_t>(DefaultThreads()));
  absl::Status built =
      ParallelFor(patch.tensors.size(), DefaultThreads(), [&](size_t i, int worker) {
        return BuildTensorPatch(workspaces[static_cast<size_t>(worker)], *tensors[i], where,
                                changes.find(patch.tensors[i].name)->second, patch.tensors[i]);
      });
  if (!built.ok()) return Annotate(built, what);
  for (const TensorPatch& p : patch.tensors) stats.values_changed += p.idx.size();
  stats.tensors = patch.tensors.size();
  if (stats.density() > options.max_density) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", stats.values_changed, " of ", stats.values_total, " values change, over the ",
        options.max_density * 100, "% a patch is worth; reload the whole checkpoint instead"));
  }
  return patch;
}

absl::StatusOr<WeightPatchStats> WriteWeightPatch(std::span<const std::filesystem::path> delta_dirs,
                                                  const std::filesystem::path& target_dir,
                                                  const std::filesystem::path& out,
                                                  const WeightPatchOptions& options) {
  const std::string what = Describe(options);
  auto reader = CheckpointReader::Open(target_dir);
  if (!reader.ok()) return Annotate(reader.status(), what);
  std::vector<PatchTargetTensor> target;
  for (const CheckpointTensor& t : reader->tensors()) {
    const CheckpointFile* f = &reader->files()[t.file];
    const uint64_t offset = t.offset;
    target.push_back({t.name, t.dtype, t.shape, t.nbytes, [f, offset](std::span<std::byte> out) {
                        return ReadFully(f->fd.get(), offset, out, f->path);
                      }});
  }
  absl::StatusOr<WeightPatch> patch =
      BuildWeightPatch(delta_dirs, target, target_dir.string(), options);
  if (!patch.ok()) return patch.status();
  WeightPatchStats stats = patch->stats;

  json::object tensors_meta;
  std::vector<TensorView> views;
  for (const TensorPatch& p : patch->tensors) {
    const int64_t k = static_cast<int64_t>(p.idx.size());
    const DType bits = *BitsDType(p.dtype, p.name);
    views.push_back({absl::StrCat(p.name, "::idx"),
                     DType::kI64,
                     {k},
                     std::as_bytes(std::span<const int64_t>(p.idx))});
    views.push_back({absl::StrCat(p.name, "::xor"), bits, {k}, p.xor_bits});
    views.push_back({absl::StrCat(p.name, "::new"), bits, {k}, p.new_bits});
    json::object m;
    m["dtype"] = DTypeName(p.dtype);
    m["shape"] = ShapeJson(p.shape);
    m["checksum"] = p.checksum.ToHex();
    tensors_meta[p.name] = std::move(m);
  }
  json::object shapes;
  for (const PatchTargetTensor& t : target) shapes[t.name] = ShapeJson(t.shape);
  json::object meta;
  meta["format"] = kWeightPatchFormat;
  meta["from"] = options.from.ToString();
  meta["to"] = options.to.ToString();
  meta["values_changed"] = stats.values_changed;
  meta["values_total"] = stats.values_total;
  meta["tensors"] = std::move(tensors_meta);
  meta["shapes"] = std::move(shapes);

  // A patch being written when its writer crashed is never used; remove it.
  RemoveStaleTempSiblings(out);
  const std::filesystem::path tmp = TempSiblingPath(out);
  absl::Status written =
      WriteSafetensors(tmp, views, {{std::string(kWeightPatchMetadataKey), json::serialize(meta)}});
  if (written.ok()) {
    std::error_code gone;
    std::filesystem::remove(out, gone);
    written = RenameDurably(tmp, out);
  }
  if (!written.ok()) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return Annotate(written, what);
  }
  std::error_code ec;
  stats.file_bytes = std::filesystem::file_size(out, ec);
  return stats;
}

}  // namespace stitch
