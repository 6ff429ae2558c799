// The command that starts a replica's engine when it is not `stitch engine`
// (`stitch demo --engine-cmd`): a template that the local fleet (fleet.h)
// expands once per replica and runs with /bin/sh -c, in a process group of
// its own (what the demo's kill and its final stop signal: every process the
// command starts goes with it). The fleet picks the port; the sidecar in
// front of the engine waits for it to answer (`--engine-start-timeout`).
//
// Placeholders, each replaced by its value quoted for the shell:
//   {model}              the base checkpoint's directory
//   {host}               the address to listen on (127.0.0.1)
//   {port}               the port to listen on, picked free by the fleet
//   {served_model_name}  the model name to serve ("policy")
//   {name}               the replica's name (r0, r1, ...)
//   {dir}                a directory of the replica's own, for scratch files
// "{{" and "}}" stand for "{" and "}". A template must name {model} and
// {port}: otherwise the engine would serve something else, somewhere else.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stitch {

struct EngineCommandValues {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string served_model_name = "policy";
  std::string name;
  std::string dir;
};

// `text` as one shell word: as is when it holds only characters the shell
// takes literally, else in single quotes.
std::string ShellQuote(std::string_view text);

// The template with its placeholders replaced. InvalidArgument naming an
// unknown placeholder or a lone brace.
[[nodiscard]] absl::StatusOr<std::string> ExpandEngineCommand(std::string_view command,
                                                              const EngineCommandValues& values);

// OK when the template expands and names {model} and {port}; else
// InvalidArgument saying why.
[[nodiscard]] absl::Status CheckEngineCommand(std::string_view command);

// A port on 127.0.0.1 that nothing listens on now and that is not in
// `taken`: from below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), so that none of the processes
// that bind port 0 while a slow engine starts can be handed it first.
[[nodiscard]] absl::StatusOr<int> PickEnginePort(const std::set<int>& taken);

}  // namespace stitch
