#include "coordinator/policy/warmserve_placement.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace thaw::coordinator::policy {

namespace {

enum class Relation { disjoint, nested, partial };

// `a` and `b` ascending.
Relation relation(std::span<const std::uint32_t> a, std::span<const std::uint32_t> b) {
  std::size_t common = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] == b[j]) {
      ++common, ++i, ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  if (common == 0) return Relation::disjoint;
  return common == a.size() || common == b.size() ? Relation::nested : Relation::partial;
}

bool intersects(std::span<const std::uint32_t> a, std::span<const std::uint32_t> b) {
  return relation(a, b) != Relation::disjoint;
}

// Calls `visit` with every `k`-subset of `items` (ascending, lexicographic order).
template <typename Visit>
void for_each_subset(const std::vector<std::uint32_t>& items, std::size_t k, Visit&& visit) {
  if (k == 0 || k > items.size()) return;
  std::vector<std::size_t> at(k);
  for (std::size_t i = 0; i < k; ++i) at[i] = i;
  std::vector<std::uint32_t> subset(k);
  for (;;) {
    for (std::size_t i = 0; i < k; ++i) subset[i] = items[at[i]];
    visit(subset);
    std::size_t i = k;
    while (i > 0 && at[i - 1] == items.size() - k + (i - 1)) --i;
    if (i == 0) return;
    ++at[i - 1];
    for (std::size_t j = i; j < k; ++j) at[j] = at[j - 1] + 1;
  }
}

}  // namespace

bool disjoint_or_nested(std::span<const PrewarmReplica> replicas) {
  for (std::size_t a = 0; a < replicas.size(); ++a) {
    for (std::size_t b = a + 1; b < replicas.size(); ++b) {
      if (relation(replicas[a].gpus, replicas[b].gpus) == Relation::partial) return false;
    }
  }
  return true;
}

std::vector<PlacedReplica> place_prewarm_replicas(std::span<const ModelDemand> models,
                                                  std::span<const ClusterGpu> gpus,
                                                  std::span<const PrewarmReplica> existing) {
  // Stage 1: every model's replicas (Eq. 5–8), ranked together: basic before burst, then by
  // score, then model and rank (deterministic).
  struct Wanted {
    const ModelDemand* model;
    ReplicaScore r;
  };
  std::vector<Wanted> wanted;
  for (const ModelDemand& m : models) {
    for (const ReplicaScore& r : prewarm_replicas(m.demand)) wanted.push_back({&m, r});
  }
  std::ranges::stable_sort(wanted, [](const Wanted& a, const Wanted& b) {
    return std::tuple(a.r.burst, -a.r.score, a.model->model, a.r.rank) <
           std::tuple(b.r.burst, -b.r.score, b.model->model, b.r.rank);
  });

  // Stage 2: greedy placement, keeping the book of memory and replicas as it goes.
  std::vector<double> free(gpus.size());
  for (std::size_t j = 0; j < gpus.size(); ++j) free[j] = gpus[j].free_bytes;
  std::vector<PrewarmReplica> replicas(existing.begin(), existing.end());
  std::map<std::uint32_t, std::vector<std::uint32_t>> by_server;  // candidate GPUs, ascending
  for (std::uint32_t j = 0; j < gpus.size(); ++j) {
    if (gpus[j].prewarm_candidate) by_server[gpus[j].server].push_back(j);
  }
  // A replica lies on one server, so only that server's replicas can overlap a group there.
  std::map<std::uint32_t, std::vector<std::size_t>> replicas_on;
  const auto server_of = [&](const PrewarmReplica& r) {
    return r.gpus.empty() || r.gpus.front() >= gpus.size() ? ~0u : gpus[r.gpus.front()].server;
  };
  for (std::size_t i = 0; i < replicas.size(); ++i)
    replicas_on[server_of(replicas[i])].push_back(i);
  // Replicas already prewarmed stand for their model's highest-ranked wanted ones: a round
  // places only what is missing (the coordinator runs one every window).
  std::map<std::uint32_t, std::size_t> already;
  for (const PrewarmReplica& r : existing) ++already[r.model];
  std::vector<PlacedReplica> placed;
  for (const Wanted& w : wanted) {
    const ModelDemand& m = *w.model;
    if (m.parallelism == 0) continue;
    if (auto it = already.find(m.model); it != already.end() && it->second > 0) {
      --it->second;
      continue;
    }
    const double need = m.size_bytes / m.parallelism;
    std::optional<std::vector<std::uint32_t>> best;
    bool best_beats_all = false;  // H_g < score
    double best_sum = 0;
    for (const auto& [server, all] : by_server) {
      std::vector<std::uint32_t> fit;
      for (std::uint32_t j : all) {
        if (free[j] >= need) fit.push_back(j);
      }
      const std::vector<std::size_t>& here = replicas_on[server];
      for_each_subset(fit, m.parallelism, [&](const std::vector<std::uint32_t>& g) {
        double highest = 0, sum = 0;
        for (std::size_t i : here) {
          const PrewarmReplica& r = replicas[i];
          const Relation rel = relation(g, r.gpus);
          if (rel == Relation::disjoint) continue;
          if (rel == Relation::partial || r.model == m.model) return;  // not a valid group
          highest = std::max(highest, r.score);
          sum += r.score;
        }
        const bool beats_all = highest < w.r.score;
        // Groups where this replica outranks every replica it nests with come first; among
        // them (or, if there are none, among all) the least sum of scores it would sit on.
        if (!best || (beats_all && !best_beats_all) ||
            (beats_all == best_beats_all && sum < best_sum)) {
          best = g;
          best_beats_all = beats_all;
          best_sum = sum;
        }
      });
    }
    if (!best) continue;  // no valid group: the next replica
    for (std::uint32_t j : *best) free[j] -= need;
    PrewarmReplica r{m.model, *best, w.r.score};
    replicas_on[gpus[best->front()].server].push_back(replicas.size());
    replicas.push_back(r);
    placed.push_back({std::move(r), w.r.burst, w.r.rank});
  }
  return placed;
}

std::optional<Claim> choose_claim(std::uint32_t model, std::span<const PrewarmReplica> replicas,
                                  std::span<const ClusterGpu> gpus) {
  std::optional<Claim> best;
  double best_own = 0;
  for (std::size_t c = 0; c < replicas.size(); ++c) {
    const PrewarmReplica& mine = replicas[c];
    if (mine.model != model || mine.gpus.empty()) continue;
    if (!std::ranges::all_of(
            mine.gpus, [&](std::uint32_t j) { return j < gpus.size() && gpus[j].claimable; })) {
      continue;
    }
    Claim claim{c, {}, 0};
    for (std::size_t r = 0; r < replicas.size(); ++r) {
      if (r == c || !intersects(mine.gpus, replicas[r].gpus)) continue;
      claim.evicted.push_back(r);
      claim.evicted_score += replicas[r].score;
    }
    if (!best || claim.evicted_score < best->evicted_score ||
        (claim.evicted_score == best->evicted_score && mine.score < best_own)) {
      best_own = mine.score;
      best = std::move(claim);
    }
  }
  return best;
}

}  // namespace thaw::coordinator::policy
