// The HTML report's inline SVG charts (RenderHtmlReport in report.h). Each
// returns one <svg> element with its own axes; the staleness and served
// charts return "" when there is nothing to draw. Pure functions, no I/O.
#pragma once

#include <string>

#include "stitch/demo/report.h"

namespace stitch {

// The batch's mean reward at every training step.
std::string RewardChart(const DemoRecord& record);

// One lane per replica: its applied version against the store's pointer
// over the run, with its start, readiness, lag and kill marked.
std::string FleetChart(const DemoRecord& record);

// How many versions behind the pointer the served rollouts were.
std::string StalenessChart(const DemoSummary& summary);

// How many rollouts each version served.
std::string ServedChart(const DemoSummary& summary);

}  // namespace stitch
