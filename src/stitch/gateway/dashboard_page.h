// The gateway's dashboard: one self-contained HTML page (inline CSS and
// script, SVG drawn by hand, nothing fetched but the gateway's own
// /ui/state), served at GET /ui. It polls /ui/state every second and draws
// the fleet from it (docs/gateway.md, "Dashboard").
#pragma once

#include <string_view>

namespace stitch {

// The page, embedded in the binary.
std::string_view DashboardPage();

}  // namespace stitch
