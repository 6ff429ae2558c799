// nanobind bindings: the C++ core as the private module stitch._stitch. The
// Pythonic surface (names, dict/array handling, exceptions) is in
// src/stitch/*.py; this file only converts types and releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "stitch/core/constraint.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_kernel.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/fetch/open_store.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"
#include "stitch/pool/pool.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/multihost.h"
#include "stitch/publish/publish.h"
#include "stitch/publish/request.h"
#include "stitch/publish/trainer_comms.h"
#include "stitch/store/retention.h"
#include "stitch/store/store.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stitch {
namespace {

// Raises the Python exception of stitch.errors that matches the status's
// kind (else its code); `fallback` names the class for everything else.
[[noreturn]] void Raise(const absl::Status& status, const char* fallback) {
  nb::gil_scoped_acquire gil;
  nb::module_ errors = nb::module_::import_("stitch.errors");
  const char* name = fallback;
  nb::dict extra;
  switch (GetErrorKind(status)) {
    case ErrorKind::kPointerRewind:
      name = "PointerRewind";
      break;
    case ErrorKind::kPointerConflict: {
      name = "PointerConflict";
      if (auto d = GetConflictDetails(status)) {
        extra["expected"] = d->expected;
        extra["actual"] = d->actual;
        extra["proposed"] = d->proposed;
      }
      break;
    }
    case ErrorKind::kChecksumMismatch:
      name = "ChecksumMismatch";
      break;
    case ErrorKind::kVersionNotReady:
      name = "VersionNotReady";
      break;
    case ErrorKind::kOther:
      switch (status.code()) {
        case absl::StatusCode::kDataLoss:
          name = "ChecksumMismatch";
          break;
        case absl::StatusCode::kInvalidArgument:
          name = "InvalidArgument";
          break;
        case absl::StatusCode::kNotFound:
          name = "NotFound";
          break;
        default:
          break;
      }
  }
  // The core says when a failed encode had started to overwrite the
  // caller's snapshot (EncodeDeltaAdvancingBase).
  if (BaseWasAdvanced(status)) extra["base_advanced"] = true;
  nb::object cls = errors.attr(name);
  nb::object exc = cls(std::string(status.message()),
                       "code"_a = absl::StatusCodeToString(status.code()), **extra);
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw nb::python_error();
}

template <typename T>
T Check(absl::StatusOr<T> r, const char* fallback) {
  if (!r.ok()) Raise(r.status(), fallback);
  return *std::move(r);
}

void Check(const absl::Status& s, const char* fallback) {
  if (!s.ok()) Raise(s, fallback);
}

// Runs `f` (returning a Status or StatusOr) with the GIL released, then
// checks its result as Check does.
template <typename F>
auto CheckReleased(const char* fallback, F&& f) {
  std::invoke_result_t<F&> r;
  {
    nb::gil_scoped_release release;
    r = f();
  }
  return Check(std::move(r), fallback);
}

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using MutableBytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// (name, safetensors dtype, shape, the tensor's bytes as a flat uint8 array)
using TensorArg = std::tuple<std::string, std::string, std::vector<int64_t>, Bytes>;
// The same over writable bytes (a snapshot the core may advance in place).
using MutableTensorArg = std::tuple<std::string, std::string, std::vector<int64_t>, MutableBytes>;

template <class Arg>
std::vector<TensorView> Views(const std::vector<Arg>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& [name, dtype, shape, bytes] : tensors) {
    DType d = Check(ParseDType(dtype), "InvalidArgument");
    views.push_back(
        TensorView{name, d, shape,
                   std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()),
                                              bytes.size())});
  }
  return views;
}

// The safetensors dtype name of a DLPack dtype, or "" when it has none.
std::string DTypeOfDLPack(nb::dlpack::dtype d) {
  if (d.lanes != 1) return "";
  using Code = nb::dlpack::dtype_code;
  switch (static_cast<Code>(d.code)) {
    case Code::Int:
      return d.bits == 8    ? "I8"
             : d.bits == 16 ? "I16"
             : d.bits == 32 ? "I32"
             : d.bits == 64 ? "I64"
                            : "";
    case Code::UInt:
      return d.bits == 8    ? "U8"
             : d.bits == 16 ? "U16"
             : d.bits == 32 ? "U32"
             : d.bits == 64 ? "U64"
                            : "";
    case Code::Float:
      return d.bits == 16 ? "F16" : d.bits == 32 ? "F32" : d.bits == 64 ? "F64" : "";
    case Code::Bfloat:
      return d.bits == 16 ? "BF16" : "";
    case Code::Bool:
      return d.bits == 8 ? "BOOL" : "";
    case Code::Float8_E4M3FN:
      return d.bits == 8 ? "F8_E4M3" : "";
    case Code::Float8_E5M2:
      return d.bits == 8 ? "F8_E5M2" : "";
    default:
      return "";
  }
}

[[noreturn]] void RaiseInvalid(const std::string& message) {
  Raise(absl::InvalidArgumentError(message), "InvalidArgument");
}

// A zero-copy view of a CPU array imported through DLPack (or the buffer
// protocol): its safetensors dtype, shape, and its bytes as a flat uint8
// NumPy array that keeps the import (and so the producer's memory) alive.
nb::tuple DLPackView(const std::string& name, nb::ndarray<nb::ro> a) {
  if (a.device_type() != nb::device::cpu::value) {
    RaiseInvalid(absl::StrCat("stitch: tensor \"", name,
                              "\" is not in CPU memory; copy it to the CPU first"));
  }
  const nb::dlpack::dtype d = a.dtype();
  std::string dtype = DTypeOfDLPack(d);
  if (dtype.empty()) {
    RaiseInvalid(absl::StrCat("stitch: tensor \"", name, "\" has a dtype (DLPack code ",
                              static_cast<int>(d.code), ", ", static_cast<int>(d.bits), " bits, ",
                              static_cast<int>(d.lanes),
                              " lanes) with no safetensors equivalent; pass (uint8 view, "
                              "\"DTYPE\") instead"));
  }
  std::vector<int64_t> shape(a.ndim());
  int64_t expected = 1;
  bool contiguous = true;
  for (size_t i = a.ndim(); i-- > 0;) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    if (shape[i] != 1 && a.stride(i) != expected) contiguous = false;
    expected *= shape[i];
  }
  if (!contiguous && a.size() > 0) {
    RaiseInvalid(absl::StrCat("stitch: tensor \"", name,
                              "\" is not C-contiguous; call .contiguous() (torch) or "
                              "np.ascontiguousarray first"));
  }
  // The view owns a reference to the import, so the producer's DLPack
  // deleter runs only when the last view of its memory is gone.
  nb::capsule owner(new nb::ndarray<nb::ro>(a),
                    [](void* p) noexcept { delete static_cast<nb::ndarray<nb::ro>*>(p); });
  const size_t n = a.nbytes();
  nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>> bytes(n == 0 ? nullptr : a.data(), {n}, owner);
  return nb::make_tuple(dtype, shape, bytes);
}

// Copies each source into its destination (same sizes), the bytes split
// evenly over `threads` workers (0: every core).
void CopyBytes(const std::vector<std::pair<Bytes, MutableBytes>>& pairs, int threads) {
  size_t total = 0;
  for (const auto& [src, dst] : pairs) {
    if (src.size() != dst.size()) RaiseInvalid("stitch: copy between arrays of different sizes");
    total += src.size();
  }
  // Below a few MiB a thread costs more than it saves.
  constexpr size_t kMinBytesPerWorker = size_t{4} << 20;
  const size_t workers = std::clamp<size_t>(
      total / kMinBytesPerWorker, 1, static_cast<size_t>(threads > 0 ? threads : DefaultThreads()));
  const size_t per = (total + workers - 1) / workers;
  nb::gil_scoped_release release;
  auto copy_range = [&](size_t begin, size_t end) {
    size_t at = 0;
    for (const auto& [src, dst] : pairs) {
      const size_t lo = std::max(begin, at), hi = std::min(end, at + src.size());
      if (lo < hi) std::memcpy(dst.data() + (lo - at), src.data() + (lo - at), hi - lo);
      at += src.size();
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers && w * per < total; ++w) {
    pool.emplace_back(copy_range, w * per, std::min(total, (w + 1) * per));
  }
  copy_range(0, std::min(total, per));
  for (std::thread& t : pool) t.join();
}

// The pool a spec names (pool.h, MakePool), or none.
std::unique_ptr<Pool> MaybePool(const std::optional<std::string>& spec) {
  if (!spec || spec->empty()) return nullptr;
  return Check(MakePool(*spec), "InvalidArgument");
}

// A TrainerComms implemented in Python (stitch.TrainerComms subclasses).
// nanobind's trampoline takes the GIL for each call; a Python exception in
// all_gather becomes an Unavailable status so every rank sees a failure.
class PyTrainerComms : public TrainerComms {
 public:
  NB_TRAMPOLINE(TrainerComms, 4);
  int rank() const override { NB_OVERRIDE_PURE(rank); }
  int world_size() const override { NB_OVERRIDE_PURE(world_size); }
  bool IsHostLeader() const override { NB_OVERRIDE_PURE_NAME("is_host_leader", IsHostLeader); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view value) override {
    nb::detail::ticket nb_ticket(nb_trampoline, "all_gather", nb::detail::str_hash("all_gather"),
                                 true);
    try {
      nb::object result =
          nb_trampoline.base().attr(nb_ticket.key)(nb::bytes(value.data(), value.size()));
      std::vector<std::string> values;
      for (nb::handle item : result) {
        nb::bytes b = nb::cast<nb::bytes>(item);
        values.emplace_back(b.c_str(), b.size());
      }
      return values;
    } catch (nb::python_error& e) {
      return absl::UnavailableError(
          absl::StrCat("stitch: TrainerComms.all_gather failed: ", e.what()));
    } catch (std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("stitch: TrainerComms.all_gather returned a bad value: ", e.what()));
    }
  }
};

// (version, "full" | "delta", payload files, base_version) of a manifest,
// the shape stitch.types.VersionManifest is built from.
nb::tuple ManifestTuple(const VersionManifest& m) {
  return nb::make_tuple(m.version, m.kind == VersionKind::kDelta ? "delta" : "full", m.files,
                        m.base_version);
}

// The integer a request payload's constraint field holds (None: absent),
// converted as Python's int() does.
std::optional<int64_t> PayloadInt(const nb::dict& raw, const char* key) {
  if (!raw.contains(key)) return std::nullopt;
  nb::object value = raw[key];
  if (value.is_none()) return std::nullopt;
  return nb::cast<int64_t>(nb::module_::import_("builtins").attr("int")(value));
}

nb::dict EncodeResultDict(const EncodeResult& r) {
  nb::dict d;
  d["version"] = r.version;
  d["base_version"] = r.base_version;
  d["tensors"] = r.tensors;
  d["changed_tensors"] = r.changed_tensors;
  d["checkpoint_bytes"] = r.checkpoint_bytes;
  d["payload_bytes"] = r.payload_bytes;
  d["files"] = r.files;
  return d;
}

EncodeOptions DeltaOptions(int64_t version, const std::string& run_id, int level, int threads) {
  EncodeOptions options;
  options.version = version;
  options.base_version = version - 1;
  options.run_id = run_id;
  options.level = level;
  options.threads = threads;
  return options;
}

// Runs one of the in-memory EncodeDelta entry points without the GIL.
template <class Encode>
nb::dict EncodeDeltaDict(const std::vector<TensorView>& base, const std::vector<TensorView>& target,
                         const std::string& out_dir, const EncodeOptions& options, Encode encode) {
  return EncodeResultDict(CheckReleased("StitchError", [&] {
    return encode(std::span<const TensorView>(base), std::span<const TensorView>(target), out_dir,
                  options);
  }));
}

}  // namespace
}  // namespace stitch

NB_MODULE(_stitch, m) {
  using namespace stitch;

  nb::class_<VersionRef>(m, "VersionRef")
      .def(nb::init<>())
      .def(
          "__init__",
          [](VersionRef* self, std::optional<std::string> run_id, int64_t version) {
            new (self) VersionRef{run_id.value_or(""), version};
          },
          "run_id"_a.none(), "version"_a)
      .def_static(
          "parse",
          [](const std::string& text) { return Check(VersionRef::Parse(text), "InvalidArgument"); },
          "text"_a)
      .def_prop_rw(
          "run_id",
          [](const VersionRef& v) -> std::optional<std::string> {
            if (v.run_id.empty()) return std::nullopt;
            return v.run_id;
          },
          [](VersionRef& v, std::optional<std::string> run_id) { v.run_id = run_id.value_or(""); },
          nb::arg("run_id").none(), "The run, or None for a bare identity.")
      .def_rw("version", &VersionRef::version)
      .def_prop_ro("identity", &VersionRef::ToString,
                   "The identity text, \"run/weight_vNNNNNN\" (bare: \"weight_vNNNNNN\").")
      .def_prop_ro("dir_name", &VersionRef::DirName)
      .def("__str__", &VersionRef::ToString)
      .def("__repr__", [](const VersionRef& v) { return "VersionRef('" + v.ToString() + "')"; })
      .def(
          "__eq__", [](const VersionRef& a, const VersionRef& b) { return a == b; },
          nb::is_operator())
      .def("__hash__", [](const VersionRef& v) { return nb::hash(nb::str(v.ToString().c_str())); });

  nb::class_<VersionConstraint>(m, "VersionConstraint")
      .def(nb::init<>())
      .def(
          "__init__",
          [](VersionConstraint* self, std::optional<int64_t> min_version,
             std::optional<int64_t> exact_version, std::optional<int64_t> max_staleness) {
            new (self) VersionConstraint{min_version, exact_version, max_staleness};
          },
          "min_version"_a = nb::none(), "exact_version"_a = nb::none(),
          "max_staleness"_a = nb::none())
      .def_static("exact", &VersionConstraint::Exact, "version"_a)
      .def_static("at_least", &VersionConstraint::AtLeast, "version"_a)
      .def_static(
          "from_json",
          [](const std::string& json) {
            return Check(VersionConstraint::FromJson(json), "InvalidArgument");
          },
          "json"_a)
      .def_static(
          "for_request",
          [](std::optional<int64_t> latest, int64_t lag, std::optional<int64_t> exact,
             std::optional<int64_t> max_staleness) {
            return Check(MakeRequestConstraint(latest, lag, exact, max_staleness),
                         "InvalidArgument");
          },
          "latest"_a = nb::none(), "lag"_a = 0, "exact"_a = nb::none(),
          "max_staleness"_a = nb::none())
      .def_rw("min_version", &VersionConstraint::min_version)
      .def_rw("exact_version", &VersionConstraint::exact_version)
      .def_rw("max_staleness", &VersionConstraint::max_staleness)
      .def_prop_ro("empty", &VersionConstraint::empty)
      .def_prop_ro("is_exact", &VersionConstraint::is_exact)
      .def_prop_ro("target", &VersionConstraint::target)
      .def(
          "satisfied_by",
          [](const VersionConstraint& c, std::optional<int64_t> applied,
             std::optional<int64_t> pointer) { return c.SatisfiedBy(applied, pointer); },
          "applied"_a.none(), "pointer"_a.none() = nb::none())
      .def_static(
          "from_payload",
          [](nb::handle payload) {
            VersionConstraint c;
            if (!nb::isinstance<nb::dict>(payload)) return c;
            nb::dict body = nb::borrow<nb::dict>(payload);
            if (!body.contains("weight_version")) return c;
            nb::object raw = body["weight_version"];
            if (!nb::isinstance<nb::dict>(raw)) return c;
            nb::dict fields = nb::borrow<nb::dict>(raw);
            c.min_version = PayloadInt(fields, "min_version");
            c.exact_version = PayloadInt(fields, "exact_version");
            c.max_staleness = PayloadInt(fields, "max_staleness");
            return c;
          },
          "payload"_a.none(),
          "The constraint a request payload's weight_version field carries (none when absent "
          "or not an object).")
      .def(
          "to_payload",
          [](const VersionConstraint& c) {
            nb::dict d;
            d["min_version"] = c.min_version;
            d["exact_version"] = c.exact_version;
            return d;
          },
          "{\"min_version\": N | None, \"exact_version\": N | None}")
      .def("to_json", &VersionConstraint::ToJson)
      .def("__str__", &VersionConstraint::ToString)
      .def("__repr__",
           [](const VersionConstraint& c) { return "VersionConstraint(" + c.ToJson() + ")"; })
      .def(
          "__eq__", [](const VersionConstraint& a, const VersionConstraint& b) { return a == b; },
          nb::is_operator());

  nb::class_<Store>(m, "Store")
      .def_prop_ro("uri", &Store::uri)
      .def_prop_ro("run_id", &Store::run_id)
      .def(
          "read_pointer",
          [](Store& s) { return CheckReleased("StoreError", [&] { return s.ReadPointer(); }); },
          "The version the pointer names, or None when it was never set.")
      .def(
          "advance_pointer",
          [](Store& s, std::optional<VersionRef> expected, const VersionRef& proposed) {
            CheckReleased("StoreError", [&] { return s.AdvancePointer(expected, proposed); });
          },
          "expected"_a.none(), "proposed"_a,
          "Compare-and-swap of the pointer; PointerConflict or PointerRewind on refusal.")
      .def("refresh", [](Store& s) { CheckReleased("StoreError", [&] { return s.Refresh(); }); })
      .def(
          "materialize",
          [](Store& s, int64_t version) {
            return CheckReleased("StoreError", [&] { return s.Materialize(version); }).string();
          },
          "version"_a)
      .def(
          "read_manifest",
          [](Store& s, int64_t version) {
            return ManifestTuple(
                CheckReleased("StoreError", [&] { return s.ReadManifest(version); }));
          },
          "version"_a, "(version, \"full\" | \"delta\", payload files, base_version)")
      .def(
          "publish_files",
          [](Store& s, int64_t version, const std::string& dir) {
            CheckReleased("StoreError", [&] { return s.PublishFiles(version, dir); });
          },
          "version"_a, "version_dir"_a,
          "Makes the directory's files durable as `version` without moving the pointer.");

  m.def(
      "read_index_manifest",
      [](const std::string& dir) {
        auto manifest = [&]() -> absl::StatusOr<VersionManifest> {
          auto index = ReadIndex(dir);
          if (!index.ok()) return index.status();
          return index->ToManifest();
        };
        return ManifestTuple(CheckReleased("InvalidArgument", manifest));
      },
      "version_dir"_a, "The manifest a version directory's index describes.");

  m.def(
      "check_pointer_move",
      [](std::optional<VersionRef> current, const VersionRef& proposed) {
        PointerMove move = Check(CheckPointerMove("stitch", current, proposed), "StoreError");
        return move == PointerMove::kForward   ? "forward"
               : move == PointerMove::kInitial ? "initial"
                                               : "run_reset";
      },
      "current"_a.none(), "proposed"_a,
      "\"initial\", \"forward\" or \"run_reset\"; PointerRewind for a lower or equal version "
      "of the same run.");

  nb::class_<Pool>(m, "Pool")
      .def_prop_ro("spec", &Pool::spec)
      .def("discover",
           [](Pool& p) { return CheckReleased("StitchError", [&] { return p.Discover(); }); })
      .def(
          "wake",
          [](Pool& p) {
            nb::gil_scoped_release release;
            return p.Wake();
          },
          "POSTs /wake to every replica (best effort); how many answered.");

  m.def(
      "make_pool", [](const std::string& spec) { return Check(MakePool(spec), "InvalidArgument"); },
      "spec"_a);

  m.def(
      "wake_replicas",
      [](const std::vector<std::string>& urls) {
        nb::gil_scoped_release release;
        return WakeReplicas(urls, WakeOptions{});
      },
      "urls"_a, "POSTs /wake to each URL (best effort); how many answered.");

  m.def(
      "open_store",
      [](const std::string& uri, const std::string& run_id, std::optional<std::string> cache_dir) {
        StoreOptions options{
            run_id, cache_dir ? std::filesystem::path(*cache_dir) : std::filesystem::path()};
        return CheckReleased("StoreError", [&] { return OpenStore(uri, options); });
      },
      "uri"_a, "run_id"_a, "cache_dir"_a = nb::none());

  m.def(
      "claim_run",
      [](Store& store, int64_t boot_version, std::optional<std::string> pool_spec) {
        std::unique_ptr<Pool> pool = MaybePool(pool_spec);
        ClaimOutcome o =
            CheckReleased("StoreError", [&] { return ClaimRun(store, boot_version, pool.get()); });
        return std::make_tuple(o.pointer, o.previous, o.moved);
      },
      "store"_a, "boot_version"_a, "pool"_a = nb::none());

  m.def(
      "publish_version",
      [](Store& store, const std::string& dir, std::optional<std::string> pool_spec,
         std::optional<std::string> base_dir) {
        std::unique_ptr<Pool> pool = MaybePool(pool_spec);
        PublishOptions options;
        if (base_dir) options.base_checkpoint = *base_dir;
        PublishOutcome o = CheckReleased(
            "StoreError", [&] { return PublishVersion(store, dir, pool.get(), options); });
        return std::make_pair(o.version, o.already_published);
      },
      "store"_a, "version_dir"_a, "pool"_a = nb::none(), "base_dir"_a = nb::none(),
      "(published identity, already_published)");

  m.def(
      "apply_retention",
      [](Store& store, int64_t keep_last, int64_t keep_every) {
        RetentionRule rule;
        rule.keep_last = keep_last;
        rule.keep_every = keep_every;
        RetentionReport report =
            CheckReleased("StoreError", [&] { return ApplyRetention(store, rule, absl::Now()); });
        return std::make_pair(report.deleted, DescribeRetention(report, /*dry_run=*/false));
      },
      "store"_a, "keep_last"_a, "keep_every"_a = 0,
      "Deletes the versions nothing needs (store/retention.h); (deleted versions, report text)");

  nb::class_<TrainerComms, PyTrainerComms>(m, "TrainerComms")
      .def(nb::init<>())
      .def("rank", &TrainerComms::rank)
      .def("world_size", &TrainerComms::world_size)
      .def("is_host_leader", &TrainerComms::IsHostLeader);

  m.def(
      "publish_from_hosts",
      [](Store& store, TrainerComms& comms, const std::string& dir, std::vector<std::string> files,
         std::optional<std::string> pool_spec) {
        std::unique_ptr<Pool> pool = MaybePool(pool_spec);
        MultiHostPublishOptions options;
        options.files = std::move(files);
        options.pool = pool.get();
        PublishOutcome o = CheckReleased(
            "StoreError", [&] { return PublishFromHosts(store, comms, dir, options); });
        return std::make_pair(o.version, o.already_published);
      },
      "store"_a, "comms"_a, "version_dir"_a, "files"_a = std::vector<std::string>(),
      "pool"_a = nb::none());

  m.def(
      "constrain_request_body",
      [](const std::string& body, std::optional<int64_t> latest, int64_t lag,
         std::optional<int64_t> exact, std::optional<int64_t> max_staleness) {
        return Check(ConstrainRequestBodyToLatest(body, latest, lag, exact, max_staleness),
                     "InvalidArgument");
      },
      "body"_a, "latest"_a.none(), "lag"_a, "exact"_a.none(), "max_staleness"_a.none());

  m.def(
      "apply_chain",
      [](const std::string& anchor_dir, const std::vector<std::string>& delta_dirs,
         const std::string& out_dir, const std::string& run_id,
         std::optional<int64_t> anchor_version, int threads) {
        std::vector<std::filesystem::path> deltas(delta_dirs.begin(), delta_dirs.end());
        ApplyOptions options;
        options.run_id = run_id;
        options.anchor_version = anchor_version;
        options.threads = threads;
        MaterializeResult res = CheckReleased("StitchError", [&] {
          return MaterializeCheckpoint(anchor_dir, deltas, out_dir, options);
        });
        nb::dict d;
        d["version"] = res.version;
        d["applied_on"] = res.applied_on;
        d["reseeded"] = res.reseeded;
        d["deltas_applied"] = res.deltas_applied;
        d["tensors_changed"] = res.tensors_changed;
        return d;
      },
      "anchor_dir"_a, "delta_dirs"_a, "out_dir"_a, "run_id"_a = "", "anchor_version"_a = nb::none(),
      "threads"_a = 0);

  m.def(
      "verify",
      [](const std::string& dir, std::optional<std::string> base_dir, int threads) {
        std::optional<std::filesystem::path> base;
        if (base_dir) base = *base_dir;
        VerifyOptions options;
        options.threads = threads;
        VerifyReport rep =
            CheckReleased("StitchError", [&] { return VerifyVersion(dir, base, options); });
        nb::dict d;
        d["kind"] = rep.kind == VersionKind::kFull ? "FULL" : "DELTA";
        d["version"] = rep.version;
        d["base_version"] = rep.base_version;
        d["files"] = rep.files;
        d["tensors"] = rep.tensors;
        d["bytes"] = rep.bytes;
        d["payload_bytes"] = rep.payload_bytes;
        d["checksums_verified"] = rep.checksums_verified;
        return d;
      },
      "version_dir"_a, "base_dir"_a = nb::none(), "threads"_a = 0);

  m.def(
      "encode_delta",
      [](const std::vector<TensorArg>& base, const std::vector<TensorArg>& target,
         const std::string& out_dir, int64_t version, const std::string& run_id, int level,
         int threads) {
        return EncodeDeltaDict(Views(base), Views(target), out_dir,
                               DeltaOptions(version, run_id, level, threads),
                               [](const auto&... a) { return EncodeDelta(a...); });
      },
      "base"_a, "target"_a, "out_dir"_a, "version"_a, "run_id"_a, "level"_a, "threads"_a);

  m.def(
      "encode_delta_advancing",
      [](const std::vector<MutableTensorArg>& base, const std::vector<TensorArg>& target,
         const std::string& out_dir, int64_t version, const std::string& run_id, int level,
         int threads) {
        return EncodeDeltaDict(Views(base), Views(target), out_dir,
                               DeltaOptions(version, run_id, level, threads),
                               EncodeDeltaAdvancingBase);
      },
      "base"_a, "target"_a, "out_dir"_a, "version"_a, "run_id"_a, "level"_a, "threads"_a,
      "encode_delta, and each base array is overwritten with its target in the same pass "
      "(partly, when it fails).");

  m.def("dlpack_view", &DLPackView, "name"_a, "array"_a.noconvert(),
        "(dtype, shape, flat uint8 view) of a CPU array, without copying it.");

  m.def("copy_bytes", &CopyBytes, "pairs"_a, "threads"_a = 0,
        "Copies each (source, destination) pair of flat uint8 arrays on `threads` workers.");

  m.def(
      "write_full",
      [](const std::vector<TensorArg>& tensors, const std::string& out_dir, int64_t version,
         const std::string& run_id) {
        std::vector<TensorView> t = Views(tensors);
        FullVersionOptions options;
        options.version = version;
        options.run_id = run_id;
        FullVersionResult res = CheckReleased("StitchError", [&] {
          return WriteFullVersion(std::span<const TensorView>(t), out_dir, options);
        });
        nb::dict d;
        d["version"] = res.version;
        d["tensors"] = res.tensors;
        d["checkpoint_bytes"] = res.checkpoint_bytes;
        d["files"] = res.files;
        return d;
      },
      "tensors"_a, "out_dir"_a, "version"_a, "run_id"_a);
}
