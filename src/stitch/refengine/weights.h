// The reference engine's weights: an immutable float32 image of one
// checkpoint, built from Hugging Face-named tensors (a checkpoint directory,
// or any in-memory list of tensors such as a staged CPU image).
//
// A ModelWeights is shared as std::shared_ptr<const ModelWeights> between
// the thread that prepares a new version and the thread that generates:
// committing a version is swapping that pointer between two steps, and a
// step keeps the snapshot it started with alive for as long as it runs.
// The one exception is ApplyPatch, which changes weights in place: the
// scheduler calls it between two steps on serving weights nobody else
// holds. Thread-safe otherwise: every other method is const.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/delta/weight_patch.h"
#include "stitch/format/checksum.h"
#include "stitch/format/safetensors.h"
#include "stitch/refengine/config.h"

namespace stitch {

// bfloat16 <-> float32. The conversion to bfloat16 rounds to nearest, ties to
// even, and keeps NaNs NaN; the conversion to float32 is exact.
uint16_t Bf16FromFloat(float f);
float FloatFromBf16(uint16_t bits);

// A tensor that owns its bytes (little-endian, as in safetensors).
struct HostTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  TensorView view() const { return TensorView{name, dtype, shape, data}; }

  // `values` stored as `dtype` (kF32, or kBF16 rounded by Bf16FromFloat).
  // REQUIRES: dtype is kF32 or kBF16 and values.size() is the shape's product.
  static HostTensor FromFloats(std::string name, std::vector<int64_t> shape,
                               std::span<const float> values, DType dtype);
};

// OK when `tensors` are exactly a checkpoint of `config`: every tensor of
// ExpectedTensors(config) present once, with its shape, config.weight_dtype
// and as many bytes as its shape needs, and no other tensor. Otherwise one
// InvalidArgument naming the first tensor at fault (in ExpectedTensors order,
// then unexpected tensors in the given order).
[[nodiscard]] absl::Status ValidateTensors(const ModelConfig& config,
                                           std::span<const TensorView> tensors);

class ModelWeights {
 public:
  // One decoder layer. Projections are row-major [out_features, in_features]
  // (Hugging Face's layout); q/k/v are stacked into one matrix and gate/up
  // into another so that each is a single matrix product per step.
  struct Layer {
    std::vector<float> input_norm;  // [hidden]
    std::vector<float> qkv;         // [hidden + 2 * kv_dim, hidden]: q rows, k rows, v rows
    std::vector<float> o;           // [hidden, hidden]
    std::vector<float> post_norm;   // [hidden]
    std::vector<float> gate_up;     // [2 * intermediate, hidden]: gate rows, up rows
    std::vector<float> down;        // [hidden, intermediate]
  };

  const ModelConfig& config() const { return config_; }
  const std::vector<Layer>& layers() const { return layers_; }
  std::span<const float> embedding() const { return embedding_; }    // [vocab, hidden]
  std::span<const float> final_norm() const { return final_norm_; }  // [hidden]
  // [vocab, hidden]; the embedding matrix itself when tie_word_embeddings.
  std::span<const float> lm_head() const {
    return config_.tie_word_embeddings ? std::span<const float>(embedding_)
                                       : std::span<const float>(lm_head_);
  }
  // Rotary inverse frequencies rope_theta^(-2i / head_dim), i < head_dim / 2.
  std::span<const double> rope_inv_freq() const { return rope_inv_freq_; }
  // WeightsFingerprint (format/checksum.h) of the tensors these weights were
  // built from, as their bytes were given (before widening to float32): the
  // same value a store's recorded per-tensor checksums give for them.
  const Checksum128& fingerprint() const { return fingerprint_; }

  // The xxh3-128 of each checkpoint tensor the weights hold, as the
  // fingerprint combines them.
  const std::map<std::string, Checksum128, std::less<>>& tensor_checksums() const {
    return checksums_;
  }

  // Brings these weights from `patch.from` to `patch.to` in place
  // (delta/weight_patch.h): checks that every patched element holds the old
  // version's value, writes the new one, then hashes every patched tensor
  // (narrowed back to the checkpoint's dtype) against the checksum the patch
  // records, and updates the fingerprint. `fail_after_tensors` >= 0 fails on
  // purpose after that many tensors (fault injection). Any failure writes
  // the old values back and checks them the same way: Aborted ("undone",
  // the weights are the old version's, bit for bit), or DataLoss when even
  // the old values could not be restored (the weights are then unknown).
  // REQUIRES: nothing reads these weights meanwhile; patch tensors of the
  // checkpoint's dtype.
  [[nodiscard]] absl::Status ApplyPatch(const WeightPatch& patch, int64_t fail_after_tensors = -1);

  // Builds weights from `tensors` for `config` (a valid configuration) after
  // ValidateTensors, whose error it returns. bfloat16 values are widened to
  // float32 exactly. Hashes every tensor once for the fingerprint.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const ModelWeights>> FromTensors(
      const ModelConfig& config, std::span<const TensorView> tensors);

 private:
  ModelWeights() = default;

  ModelConfig config_;
  std::vector<float> embedding_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> lm_head_;  // empty when tied
  std::vector<double> rope_inv_freq_;
  std::map<std::string, Checksum128, std::less<>> checksums_;
  Checksum128 fingerprint_;

  // The float32 values of checkpoint tensor `name` (a slice of a fused
  // matrix for q/k/v and gate/up); empty when the model has no such tensor.
  std::span<float> Storage(std::string_view name);
  // Writes the patch's new elements of `t` into `storage` (or, undoing, its
  // old ones) after checking that every position holds the other version's
  // element; writes nothing when one does not.
  absl::Status Rewrite(const TensorPatch& t, std::span<float> storage, bool undo) const;
  // xxh3-128 of the tensor's values in the checkpoint's dtype.
  Checksum128 HashStorage(std::span<const float> storage) const;
};

// Loads a checkpoint directory: `config.json`, the Hugging Face index (or a
// lone `model.safetensors`) and the safetensors files it names. Errors name
// the directory and the file or tensor at fault.
[[nodiscard]] absl::StatusOr<std::shared_ptr<const ModelWeights>> LoadCheckpoint(
    const std::filesystem::path& dir);

}  // namespace stitch
