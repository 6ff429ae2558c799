#include "stitch/format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/format/strict_json.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace fs = std::filesystem;
namespace json = boost::json;
namespace {

constexpr std::string_view kMetadataKey = "__metadata__";

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},
    {DType::kI16, "I16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},
    {DType::kF32, "F32", 4},
    {DType::kU64, "U64", 8},
    {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
}};

// kDTypes is indexed by the enumerator.
constexpr bool TableMatchesEnum() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(TableMatchesEnum());

const DTypeEntry& Entry(DType d) { return kDTypes.at(static_cast<size_t>(d)); }

// numel * element size, or nullopt when it overflows uint64. A zero
// dimension anywhere makes the product 0, whatever the other dimensions are.
std::optional<uint64_t> ByteSize(const std::vector<int64_t>& shape, size_t element_size) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t bytes = element_size;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return std::nullopt;
    }
  }
  return bytes;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Invalid(std::string_view tensor, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", QuoteForMessage(tensor), ": ", what));
}

// A non-negative JSON integer.
std::optional<uint64_t> AsUint(const json::value& v) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return static_cast<uint64_t>(v.get_int64());
  return std::nullopt;
}

absl::StatusOr<TensorInfo> ParseTensorEntry(std::string_view name, const json::value& v) {
  if (!v.is_object()) {
    return Invalid(name, absl::StrCat("entry is a ", JsonKindName(v),
                                      ", expected an object with dtype, shape and data_offsets"));
  }
  TensorInfo t;
  t.name = std::string(name);
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, value] : v.get_object()) {
    if (key == "dtype") {
      if (!value.is_string()) {
        return Invalid(name,
                       absl::StrCat("dtype is a ", JsonKindName(value), ", expected a string"));
      }
      auto d = ParseDType(value.get_string());
      if (!d.ok()) return Invalid(name, d.status().message());
      t.dtype = *d;
      has_dtype = true;
    } else if (key == "shape") {
      if (!value.is_array()) {
        return Invalid(name, absl::StrCat("shape is a ", JsonKindName(value),
                                          ", expected an array of non-negative integers"));
      }
      t.shape.reserve(value.get_array().size());
      for (const json::value& d : value.get_array()) {
        if (d.is_int64() && d.get_int64() < 0) {
          return Invalid(name, absl::StrCat("shape has a negative dimension ", d.get_int64()));
        }
        std::optional<uint64_t> n = AsUint(d);
        if (!n) {
          return Invalid(name, absl::StrCat("shape has a ", JsonKindName(d),
                                            " where a non-negative integer dimension belongs"));
        }
        if (*n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Invalid(name, absl::StrCat("shape dimension ", *n, " is too large"));
        }
        t.shape.push_back(static_cast<int64_t>(*n));
      }
      has_shape = true;
    } else if (key == "data_offsets") {
      const json::array* a = value.if_array();
      std::optional<uint64_t> b, e;
      if (a != nullptr && a->size() == 2) {
        b = AsUint((*a)[0]);
        e = AsUint((*a)[1]);
      }
      if (!b || !e) {
        return Invalid(name, absl::StrCat("data_offsets is ", json::serialize(value).substr(0, 100),
                                          ", expected [begin, end] (non-negative integers)"));
      }
      if (*e < *b)
        return Invalid(name,
                       absl::StrCat("data_offsets [", *b, ", ", *e, "] end before they begin"));
      t.begin = *b;
      t.end = *e;
      has_offsets = true;
    } else {
      return Invalid(name, absl::StrCat("unknown field ", QuoteForMessage(key),
                                        " (expected dtype, shape, data_offsets)"));
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) {
    absl::string_view missing = !has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets";
    return Invalid(name, absl::StrCat("entry lacks ", missing));
  }
  const size_t element_size = DTypeSize(t.dtype);
  std::optional<uint64_t> bytes = ByteSize(t.shape, element_size);
  if (!bytes || *bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Invalid(name, absl::StrCat("shape ", ShapeString(t.shape), " has too many elements"));
  }
  if (*bytes != t.nbytes()) {
    return Invalid(
        name, absl::StrCat("shape ", ShapeString(t.shape), " of ", AbslView(DTypeName(t.dtype)),
                           " needs ", *bytes, " bytes but data_offsets [", t.begin, ", ", t.end,
                           "] hold ", t.nbytes()));
  }
  return t;
}

absl::Status ParseMetadata(const json::value& v, std::map<std::string, std::string>& out) {
  const json::object* o = v.if_object();
  if (o == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("__metadata__ is a ", JsonKindName(v), ", expected an object of strings"));
  }
  for (const auto& [key, value] : *o) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("__metadata__ must be an object of strings, but ", QuoteForMessage(key),
                       " is a ", JsonKindName(value)));
    }
    out.emplace(std::string(key), std::string(value.get_string()));
  }
  return absl::OkStatus();
}

uint64_t LoadLittleEndian64(std::span<const std::byte> b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<uint64_t>(b[static_cast<size_t>(i)]);
  return n;
}

std::string FileContext(const fs::path& path) {
  return absl::StrCat("safetensors file ", path.string());
}

}  // namespace

std::string_view DTypeName(DType d) { return Entry(d).name; }

size_t DTypeSize(DType d) { return Entry(d).size; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  const std::string names = absl::StrJoin(
      kDTypes, ", ", [](std::string* out, const DTypeEntry& e) { out->append(e.name); });
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype ", QuoteForMessage(name), " (supported: ", names, ")"));
}

int64_t TensorInfo::numel() const {
  std::optional<uint64_t> n = ByteSize(shape, 1);
  if (!n || *n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return -1;
  return static_cast<int64_t>(*n);
}

// Long on purpose: the header's checks in the order the format defines
// them (length, JSON, each entry's dtype, shape and offsets, the coverage of
// the data section), so that a reader sees every rule in one place.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> prefix,
                                                         uint64_t file_size) {
  if (prefix.size() > file_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("given ", prefix.size(), " bytes of a file said to be only ", file_size));
  }
  if (file_size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("file is ", file_size,
                     " bytes, shorter than the 8-byte header length: not a safetensors file"));
  }
  if (prefix.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "only ", prefix.size(), " bytes of the file given, need the 8-byte header length"));
  }
  const uint64_t header_len = LoadLittleEndian64(prefix.first(8));
  // The length field is not quoted when it is implausible: those 8 bytes
  // may be the start of any file (a text file's first characters), and an
  // error must not echo a file's contents.
  if (header_len > kMaxSafetensorsHeader) {
    return absl::InvalidArgumentError(absl::StrCat("bad header length (above the limit of ",
                                                   kMaxSafetensorsHeader,
                                                   " bytes): corrupt or not a safetensors file"));
  }
  if (header_len > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad header length (beyond the end of the file, ", file_size,
                     " bytes): truncated or not a safetensors file"));
  }
  if (prefix.size() - 8 < header_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "only ", prefix.size(), " bytes of the file given, the header needs ", 8 + header_len));
  }
  std::string_view text(reinterpret_cast<const char*>(prefix.data()) + 8, header_len);

  // One arena for the whole DOM: a header of thousands of tensors becomes a
  // handful of allocations, all freed at once on return.
  json::monotonic_resource arena(std::max<size_t>(4096, header_len * 2));
  absl::StatusOr<json::value> doc = ParseJsonStrict(text, &arena);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is not valid JSON: ", doc.status().message()));
  }
  const json::object* root = doc->if_object();
  if (root == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is a JSON ", JsonKindName(*doc), ", not a JSON object"));
  }

  SafetensorsHeader h;
  h.data_start = 8 + header_len;
  const uint64_t data_size = file_size - h.data_start;
  h.tensors.reserve(root->size());
  for (const auto& [key, value] : *root) {
    if (key == kMetadataKey) {
      if (absl::Status s = ParseMetadata(value, h.metadata); !s.ok()) return s;
      continue;
    }
    absl::StatusOr<TensorInfo> t = ParseTensorEntry(key, value);
    if (!t.ok()) return t.status();
    if (t->end > data_size) {
      return Invalid(key, absl::StrCat("data_offsets [", t->begin, ", ", t->end,
                                       "] reach beyond the data section (", data_size, " bytes)"));
    }
    h.tensors.push_back(*std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // The ranges must tile the data section exactly: [0, e1), [e1, e2), ...
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin > cursor) {
      return absl::InvalidArgumentError(absl::StrCat("data bytes [", cursor, ", ", t.begin,
                                                     ") belong to no tensor (a hole before tensor ",
                                                     QuoteForMessage(t.name), ")"));
    }
    if (t.begin < cursor) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", QuoteForMessage(t.name), " data_offsets [", t.begin, ", ", t.end,
                       "] overlap tensor ", QuoteForMessage(prev->name), " [", prev->begin, ", ",
                       prev->end, "]"));
    }
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tensors end at data byte ", cursor, " but the data section has ", data_size,
        " bytes: ", data_size - cursor, " trailing bytes (file size mismatch)"));
  }
  return h;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(FileContext(path), ": not a regular file"));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  auto read_prefix = [&](uint64_t n) -> absl::StatusOr<std::vector<std::byte>> {
    std::vector<std::byte> buf(n);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd.get(), buf.data() + done, n - done, static_cast<off_t>(done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return ErrnoStatus(errno, "read", path);
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    buf.resize(done);
    return buf;
  };
  absl::StatusOr<std::vector<std::byte>> prefix = read_prefix(std::min<uint64_t>(8, file_size));
  if (!prefix.ok()) return prefix.status();
  if (prefix->size() == 8) {
    // Read the header only if its length is plausible; otherwise the parser
    // explains what is wrong from the length field alone.
    const uint64_t header_len = LoadLittleEndian64(*prefix);
    if (header_len <= kMaxSafetensorsHeader && header_len <= file_size - 8) {
      prefix = read_prefix(8 + header_len);
      if (!prefix.ok()) return prefix.status();
    }
  }
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(*prefix, file_size);
  if (!h.ok()) return Annotate(h.status(), FileContext(path));
  return h;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(FileContext(path), ": not a regular file"));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return Annotate(ParseSafetensorsHeader({}, size).status(), FileContext(path));
  }
  // The whole file is mapped once; tensor bytes are then read in place, never
  // copied. MAP_SHARED so that pages come straight from the page cache.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return ErrnoStatus(errno, "mmap", path);
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = static_cast<const std::byte*>(map);
  f.map_size_ = size;
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader({f.map_, f.map_size_}, size);
  if (!h.ok()) return Annotate(h.status(), FileContext(path));
  f.header_ = *std::move(h);
  if (f.header_.tensors.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(FileContext(path), ": too many tensors"));
  }
  f.by_name_.resize(f.header_.tensors.size());
  for (uint32_t i = 0; i < f.by_name_.size(); ++i) f.by_name_[i] = i;
  std::sort(f.by_name_.begin(), f.by_name_.end(), [&](uint32_t a, uint32_t b) {
    return f.header_.tensors[a].name < f.header_.tensors[b].name;
  });
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      header_(std::move(o.header_)),
      by_name_(std::move(o.by_name_)),
      map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
    path_ = std::move(o.path_);
    header_ = std::move(o.header_);
    by_name_ = std::move(o.by_name_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it =
      std::lower_bound(by_name_.begin(), by_name_.end(), name,
                       [&](uint32_t i, std::string_view n) { return header_.tensors[i].name < n; });
  if (it == by_name_.end() || header_.tensors[*it].name != name) return nullptr;
  return &header_.tensors[*it];
}

std::span<const std::byte> SafetensorsFile::Data(const TensorInfo& t) const {
  return {map_ + header_.data_start + t.begin, t.nbytes()};
}

// --- writer ---

absl::Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                                    uint64_t nbytes) {
  if (!IsValidUtf8(name)) return Invalid(name, "the name is not valid UTF-8");
  if (name == kMetadataKey) return Invalid(name, "the name is reserved for file metadata");
  if (names_.contains(name)) return Invalid(name, "declared twice");
  for (int64_t d : shape) {
    if (d < 0)
      return Invalid(name, absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
  }
  std::optional<uint64_t> expected = ByteSize(shape, DTypeSize(dtype));
  if (!expected || *expected != nbytes) {
    return Invalid(name,
                   absl::StrCat("shape ", ShapeString(shape), " of ", AbslView(DTypeName(dtype)),
                                " does not hold ", nbytes, " bytes"));
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(data_size_, nbytes, &end)) {
    return Invalid(name, "the data section would exceed 2^64 bytes");
  }
  names_.insert(name);
  tensors_.push_back(TensorInfo{std::move(name), dtype, std::move(shape), data_size_, end});
  data_size_ = end;
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_.insert_or_assign(std::move(key), std::move(value));
}

std::string SafetensorsWriter::SerializeHeader() const {
  json::monotonic_resource arena;
  json::object root(&arena);
  root.reserve(tensors_.size() + 1);
  if (!metadata_.empty()) {
    json::object m(&arena);
    for (const auto& [k, v] : metadata_) m.emplace(k, v);
    root.emplace(kMetadataKey, std::move(m));
  }
  for (const TensorInfo& t : tensors_) {
    json::object e(&arena);
    e.emplace("dtype", DTypeName(t.dtype));
    json::array shape(&arena);
    for (int64_t d : t.shape) shape.emplace_back(d);
    e.emplace("shape", std::move(shape));
    e.emplace("data_offsets", json::array({t.begin, t.end}, &arena));
    root.emplace(t.name, std::move(e));
  }
  std::string text = json::serialize(root);
  // Pad with spaces so the data section starts 8-byte aligned, as the
  // reference implementation does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text;
  return out;
}

namespace {

class FileOutput final : public SafetensorsWriter::Output {
 public:
  FileOutput(UniqueFd fd, fs::path path, uint64_t expected, const std::string& header)
      : fd_(std::move(fd)), path_(std::move(path)), expected_(expected) {
    buf_.reserve(kBufferSize);
    const auto* p = reinterpret_cast<const std::byte*>(header.data());
    buf_.assign(p, p + header.size());
  }

  absl::Status Append(std::span<const std::byte> bytes) override {
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (bytes.size() > expected_ - written_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "write ", path_.string(), ": appending ", bytes.size(), " bytes would exceed the ",
          expected_, " declared data bytes (", written_, " already written)"));
    }
    written_ += bytes.size();
    if (buf_.size() + bytes.size() <= kBufferSize) {
      buf_.insert(buf_.end(), bytes.begin(), bytes.end());
      return absl::OkStatus();
    }
    if (absl::Status s = Flush(); !s.ok()) return s;
    if (bytes.size() >= kBufferSize) return Record(WriteAll(fd_.get(), bytes, path_));
    buf_.assign(bytes.begin(), bytes.end());
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (written_ != expected_) {
      return absl::InvalidArgumentError(absl::StrCat("write ", path_.string(), ": only ", written_,
                                                     " of the ", expected_,
                                                     " declared data bytes were appended"));
    }
    if (absl::Status s = Flush(); !s.ok()) return s;
    if (::fsync(fd_.get()) != 0) return Record(ErrnoStatus(errno, "fsync", path_));
    if (::close(fd_.release()) != 0) return Record(ErrnoStatus(errno, "close", path_));
    finished_ = true;
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBufferSize = 1 << 20;

  absl::Status Usable() const {
    if (finished_) {
      return absl::InvalidArgumentError(
          absl::StrCat("write ", path_.string(), ": already finished"));
    }
    return error_;
  }
  absl::Status Record(absl::Status s) {
    if (!s.ok()) error_ = s;
    return s;
  }
  absl::Status Flush() {
    absl::Status s = WriteAll(fd_.get(), buf_, path_);
    buf_.clear();
    return Record(std::move(s));
  }

  UniqueFd fd_;
  fs::path path_;
  uint64_t expected_;
  uint64_t written_ = 0;
  std::vector<std::byte> buf_;
  bool finished_ = false;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsWriter::Output>> SafetensorsWriter::Begin(
    const fs::path& path) const {
  // Set silently by SetMetadata; a header with invalid UTF-8 would be
  // unreadable (here and by the reference implementation).
  for (const auto& [k, v] : metadata_) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return absl::InvalidArgumentError(absl::StrCat("write ", path.string(), ": metadata entry ",
                                                     QuoteForMessage(k), " is not valid UTF-8"));
    }
  }
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return ErrnoStatus(errno, "create", path);
  return std::make_unique<FileOutput>(std::move(fd), path, data_size_, SerializeHeader());
}

absl::Status WriteSafetensors(const fs::path& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w;
  for (const TensorView& t : tensors) {
    if (absl::Status s = w.Add(t.name, t.dtype, t.shape, t.data.size()); !s.ok()) {
      return Annotate(s, absl::StrCat("write ", path.string()));
    }
  }
  for (const auto& [k, v] : metadata) w.SetMetadata(k, v);
  absl::StatusOr<std::unique_ptr<SafetensorsWriter::Output>> out = w.Begin(path);
  if (!out.ok()) return out.status();
  for (const TensorView& t : tensors) {
    if (absl::Status s = (*out)->Append(t.data); !s.ok()) return s;
  }
  return (*out)->Finish();
}

}  // namespace stitch
