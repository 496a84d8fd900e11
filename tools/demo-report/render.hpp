// What the demo shows of its runs: the table on stdout and the timeline picture.
#pragma once

#include <string>
#include <vector>

#include "runs.hpp"

namespace thaw::demo {

// Per run: fetch, the engine's phases, total, speed-up against the first run, and whether
// its tokens equal the first run's. Columns aligned; no trailing newline.
std::string table(const std::vector<Run>& runs);

// An SVG: one lane per run, one colour per phase (HydraServe's Fig. 6), the fetch drawn as a
// thin bar above the engine's phases so that overlap shows; a shared seconds axis, a legend
// and the notes under it.
std::string svg(const std::vector<Run>& runs, const std::string& title,
                const std::vector<std::string>& notes);

}  // namespace thaw::demo
