#include "stitch/pool/dns_pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

constexpr std::string_view kForm = "use dns:NAME:PORT (for example dns:replicas.local:8000)";

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<DnsPool>> DnsPool::Parse(std::string_view spec,
                                                        const WakeOptions& options) {
  absl::string_view rest = AbslView(spec);
  absl::ConsumePrefix(&rest, "dns:");
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("pool spec \"", absl::CEscape(AbslView(spec)),
                                                   "\" ", why, "; ", AbslView(kForm)));
  };
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return bad("has no port");
  absl::string_view name = rest.substr(0, colon);
  const absl::string_view port_text = rest.substr(colon + 1);
  if (absl::ConsumePrefix(&name, "[") && !absl::ConsumeSuffix(&name, "]")) {
    return bad("has an unclosed [");
  }
  if (name.empty()) return bad("has no name");
  if (name.find(':') != absl::string_view::npos && !absl::StartsWith(rest, "[")) {
    return bad("has an IPv6 address outside brackets");
  }
  unsigned port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return bad(absl::StrCat("has a bad port \"", absl::CEscape(port_text), "\""));
  }
  return std::make_unique<DnsPool>(std::string(name), static_cast<uint16_t>(port), options);
}

DnsPool::DnsPool(std::string name, uint16_t port, const WakeOptions& options)
    : name_(std::move(name)), port_(port), options_(options) {}

std::string DnsPool::spec() const {
  const bool v6 = name_.find(':') != std::string::npos;
  return absl::StrCat("dns:", v6 ? "[" : "", name_, v6 ? "]" : "", ":", port_);
}

absl::StatusOr<std::vector<std::string>> DnsPool::Discover() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* raw = nullptr;
  const int rc = getaddrinfo(name_.c_str(), nullptr, &hints, &raw);
  std::unique_ptr<addrinfo, AddrInfoDeleter> list(raw);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("pool ", spec(), ": cannot resolve \"", name_, "\": ", gai_strerror(rc)));
  }
  std::vector<std::string> urls;
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    std::string url;
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
      url = absl::StrCat("http://", text, ":", port_);
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)) == nullptr) continue;
      url = absl::StrCat("http://[", text, "]:", port_);
    } else {
      continue;
    }
    urls.push_back(std::move(url));
  }
  std::sort(urls.begin(), urls.end());
  urls.erase(std::unique(urls.begin(), urls.end()), urls.end());
  return urls;
}

int DnsPool::Wake() { return WakeDiscovered(*this, options_); }

}  // namespace stitch
