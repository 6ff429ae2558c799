#include "stitch/demo/engine_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

// The default low end of Linux's ephemeral port range.
constexpr int kEphemeralLow = 32768;
// How many ports below it the fleet picks from.
constexpr int kPortSpan = 10000;
constexpr int kTries = 200;

bool Plain(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::strchr("-_./:=@%+,", c) != nullptr;
}

// The value of placeholder `key`, or nullopt for an unknown one.
std::optional<std::string> Value(std::string_view key, const EngineCommandValues& v) {
  if (key == "model") return v.model;
  if (key == "host") return v.host;
  if (key == "port") return absl::StrCat(v.port);
  if (key == "served_model_name") return v.served_model_name;
  if (key == "name") return v.name;
  if (key == "dir") return v.dir;
  return std::nullopt;
}

absl::Status Refused(std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("demo: --engine-cmd: ", AbslView(why)));
}

int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (in >> low && low > 1024) return low;
  return kEphemeralLow;
}

// Whether a listener could bind 127.0.0.1:`port` now.
bool Free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return free;
}

}  // namespace

std::string ShellQuote(std::string_view text) {
  if (!text.empty() && std::all_of(text.begin(), text.end(), Plain)) return std::string(text);
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

absl::StatusOr<std::string> ExpandEngineCommand(std::string_view command,
                                                const EngineCommandValues& values) {
  std::string out;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if ((c == '{' || c == '}') && i + 1 < command.size() && command[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') return Refused("a lone \"}\" (write \"}}\" for a brace)");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = command.find('}', i);
    if (close == std::string_view::npos) return Refused("a \"{\" without its \"}\"");
    const std::string_view key = command.substr(i + 1, close - i - 1);
    std::optional<std::string> value = Value(key, values);
    if (!value.has_value()) {
      return Refused(absl::StrCat("unknown placeholder {", AbslView(key),
                                  "} (known: {model}, {host}, {port}, {served_model_name}, "
                                  "{name}, {dir})"));
    }
    out += ShellQuote(*value);
    i = close;
  }
  return out;
}

absl::Status CheckEngineCommand(std::string_view command) {
  // A placeholder is named when changing its value changes the expansion.
  EngineCommandValues values;
  values.model = "model";
  values.port = 1;
  absl::StatusOr<std::string> expanded = ExpandEngineCommand(command, values);
  if (!expanded.ok()) return expanded.status();
  EngineCommandValues other_model = values;
  other_model.model = "other";
  if (ExpandEngineCommand(command, other_model) == expanded) {
    return Refused("the command must name {model}, the checkpoint the replicas serve");
  }
  EngineCommandValues other_port = values;
  other_port.port = 2;
  if (ExpandEngineCommand(command, other_port) == expanded) {
    return Refused("the command must name {port}, the port the fleet picked for the engine");
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PickEnginePort(const std::set<int>& taken) {
  const int high = EphemeralLow();
  const int low = std::max(1024, high - kPortSpan);
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(low, high - 1);
  for (int i = 0; i < kTries; ++i) {
    const int port = pick(random);
    if (!taken.contains(port) && Free(port)) return port;
  }
  return absl::UnavailableError(absl::StrCat("demo: no free port for an engine in ", low, "..",
                                             high - 1, " after ", kTries, " tries"));
}

}  // namespace stitch
