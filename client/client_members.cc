// A Client of several daemons: placement by rendezvous hashing
// (placement/rendezvous.h), one member Client of one daemon each; a Step
// splits its groups by member and runs the members' steps in parallel;
// Rebalance moves groups between members (docs/scale-out.md).
#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/client_impl.h"
#include "client/placement/dns_members.h"
#include "client/placement/rendezvous.h"
#include "client/step/finite_check.h"

namespace optstate {

namespace {

using client_internal::OwnerOf;
using client_internal::PlacementMember;

std::vector<MemberTarget> WithIdentities(std::vector<MemberTarget> members) {
  for (MemberTarget& m : members) {
    if (m.identity.empty()) m.identity = m.target;
  }
  return members;
}

std::vector<PlacementMember> PlacementOf(const std::vector<MemberTarget>& members) {
  std::vector<PlacementMember> out;
  out.reserve(members.size());
  for (const MemberTarget& m : members) out.push_back({m.identity, m.weight});
  return out;
}

absl::Status CheckMemberTargets(const std::vector<MemberTarget>& members) {
  for (const MemberTarget& m : members) {
    if (m.target.empty()) {
      return absl::InvalidArgumentError("a member's target is empty: give host:port");
    }
  }
  return client_internal::CheckMembers(PlacementOf(members));
}

using client_internal::ClientMember;
using client_internal::MemberList;

// Connects each of `members`, reusing the member clients of `reuse` whose
// identity and target are the same.
absl::StatusOr<MemberList> ConnectAll(const std::vector<MemberTarget>& members,
                                      const ClientOptions& options, const MemberList& reuse) {
  MemberList out;
  for (const MemberTarget& m : members) {
    auto same = std::find_if(reuse.begin(), reuse.end(), [&](const auto& r) {
      return r->target.identity == m.identity && r->target.target == m.target;
    });
    if (same != reuse.end()) {
      // Shared: the reused Member keeps its client; its weight may change.
      auto member = std::make_shared<ClientMember>();
      member->target = m;
      member->shared = (*same)->shared;
      out.push_back(std::move(member));
      continue;
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(m.target, options);
    if (!client.ok()) {
      return absl::Status(
          client.status().code(),
          absl::StrCat("member '", m.identity, "' (", m.target, "): ", client.status().message()));
    }
    auto member = std::make_shared<ClientMember>();
    member->target = m;
    member->shared = std::shared_ptr<Client>(std::move(*client));
    out.push_back(std::move(member));
  }
  return out;
}

std::vector<MemberTarget> TargetsOf(const MemberList& members) {
  std::vector<MemberTarget> out;
  for (const auto& m : members) out.push_back(m->target);
  return out;
}

const ClientMember& OwnerIn(const MemberList& members, const std::string& group) {
  return *members[OwnerOf(PlacementOf(TargetsOf(members)), "", group)];
}

// The interruption of the call a member's thread works for
// (ForEachInParallel), or null on any other thread. Member clients ask it
// in place of the caller's ClientOptions::interrupted, which may answer only
// on the caller's thread (the Python Client's looks for signals on Python's
// main thread alone).
thread_local const std::atomic<bool>* member_call_interrupted = nullptr;

// ClientOptions::interrupted for the member clients of a Client whose own
// is `interrupted`: on a thread of ForEachInParallel, whether the caller's
// thread has seen it say so; on any other thread, `interrupted` itself.
std::function<bool()> MemberInterruption(std::function<bool()> interrupted) {
  if (!interrupted) return interrupted;
  return [interrupted = std::move(interrupted)] {
    if (member_call_interrupted != nullptr) {
      return member_call_interrupted->load(std::memory_order_relaxed);
    }
    return interrupted();
  };
}

// Runs fn(i) for i in [0, n) on threads of their own, and waits. While it
// waits, the calling thread asks `interrupted` (when set) every 100 ms;
// once it says so, the members' waits between attempts end with CANCELLED
// (MemberInterruption), and this returns when every fn has.
template <typename Fn>
void ForEachInParallel(const std::function<bool()>& interrupted, size_t n, Fn fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  size_t done = 0;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      member_call_interrupted = &stop;
      fn(i);
      member_call_interrupted = nullptr;
      absl::MutexLock lock(&mu);
      ++done;
    });
  }
  if (interrupted) {
    auto all_done = [&] { return done == n; };
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Milliseconds(100))) break;
      }
      // Asked without the lock: it may take the GIL.
      if (!stop.load(std::memory_order_relaxed) && interrupted()) {
        stop.store(true, std::memory_order_relaxed);
      }
    }
  }
  for (std::thread& t : threads) t.join();
}

absl::Status InMember(const MemberTarget& m, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("daemon '", m.identity, "' (", m.target,
                                                  "): ", status.message()));
}

}  // namespace

std::vector<absl::StatusOr<std::string>> Client::Impl::InstanceIdsOf(const MemberList& members,
                                                                     absl::Time deadline) {
  std::vector<absl::StatusOr<std::string>> ids(members.size());
  // Not interruptible: each member answers within `deadline` or is passed over.
  ForEachInParallel({}, members.size(), [&](size_t i) {
    absl::StatusOr<Stats> facts = members[i]->shared->DaemonFacts(deadline);
    ids[i] = facts.ok() ? absl::StatusOr<std::string>(facts->instance_id) : facts.status();
  });
  return ids;
}

absl::Status Client::Impl::CheckOneDaemonEach(const MemberList& members,
                                              const std::vector<absl::StatusOr<std::string>>& ids,
                                              bool unreachable_refuses) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!ids[i].ok()) {
      if (unreachable_refuses) return InMember(members[i]->target, ids[i].status());
      continue;
    }
    if (ids[i]->empty()) continue;  // A daemon that predates instance ids.
    const auto [it, fresh] = seen.emplace(*ids[i], i);
    if (fresh) continue;
    const MemberTarget& a = members[it->second]->target;
    const MemberTarget& b = members[i]->target;
    return absl::InvalidArgumentError(absl::StrCat(
        "members '", a.identity, "' (", a.target, ") and '", b.identity, "' (", b.target,
        ") are one daemon (instance ", *ids[i],
        "): list each daemon once, by one target and identity; placed as two, a group's "
        "copy on it would count as another daemon's"));
  }
  return absl::OkStatus();
}

MemberList Client::Impl::MembersNow() const {
  absl::MutexLock lock(&members_mu);
  return members;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::vector<std::string>& targets,
                                                        const ClientOptions& options) {
  std::vector<MemberTarget> members;
  for (const std::string& t : targets) members.push_back({t, "", 1.0});
  return Connect(members, options);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::vector<MemberTarget>& given,
                                                        const ClientOptions& options) {
  std::vector<MemberTarget> members = WithIdentities(given);
  if (options.members_from_dns) {
    if (members.size() != 1) {
      return absl::InvalidArgumentError(
          "ClientOptions.members_from_dns takes exactly one target (the DNS name)");
    }
    absl::StatusOr<std::vector<client_internal::ResolvedMember>> resolved =
        client_internal::ResolveMembers(members[0].target);
    if (!resolved.ok()) return resolved.status();
    members.clear();
    for (const auto& r : *resolved) members.push_back({r.target, r.identity, 1.0});
  }
  if (absl::Status s = CheckMemberTargets(members); !s.ok()) return s;
  ClientOptions each = options;
  each.members_from_dns = false;
  each.interrupted = MemberInterruption(options.interrupted);
  absl::StatusOr<MemberList> connected = ConnectAll(members, each, {});
  if (!connected.ok()) return connected.status();
  auto impl = std::make_unique<Impl>();
  impl->options = each;
  impl->several = true;
  impl->members = std::move(*connected);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

std::vector<MemberTarget> Client::Members() const {
  if (!impl_->several) return {MemberTarget{impl_->target, impl_->target, 1.0}};
  return TargetsOf(impl_->MembersNow());
}

std::string Client::MemberOf(const std::string& group) const {
  if (!impl_->several) return impl_->target;
  return OwnerIn(impl_->MembersNow(), group).target.identity;
}

absl::Status Client::InOwner(const std::string& group, const absl::Status& status) const {
  if (status.ok() || !impl_->several) return status;
  return InMember(OwnerIn(impl_->MembersNow(), group).target, status);
}

Client* Client::OwnerClient(const std::string& group) const {
  if (!impl_->several) return nullptr;
  return OwnerIn(impl_->MembersNow(), group).shared.get();
}

absl::Status Client::StepMembers(absl::Span<const GroupStep> groups, uint64_t step,
                                 const StepOptions& options, StepReport* report) {
  // Refused whole before any daemon is sent anything, as with one daemon:
  // a gradient that is not finite (the members check again as they send).
  for (const GroupStep& g : groups) {
    if (g.gradient.data() == nullptr) continue;
    if (absl::Status s = client_internal::CheckGivenFinite(g, options, 0, g.gradient.size());
        !s.ok()) {
      return s;
    }
  }
  const MemberList members = impl_->MembersNow();
  const std::vector<PlacementMember> placement = PlacementOf(TargetsOf(members));
  std::vector<std::vector<GroupStep>> parts(members.size());
  for (const GroupStep& g : groups) parts[OwnerOf(placement, "", g.group)].push_back(g);
  std::vector<size_t> busy;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].empty()) busy.push_back(i);
  }
  std::vector<absl::Status> statuses(busy.size());
  ForEachInParallel(impl_->options.interrupted, busy.size(), [&](size_t k) {
    statuses[k] = members[busy[k]]->shared->Step(parts[busy[k]], step, options);
    // A daemon that stopped answering mid-step (its link is down) runs out
    // the attempts' deadlines: to the caller it is unavailable, as one that
    // refuses connections.
    if (statuses[k].code() == absl::StatusCode::kDeadlineExceeded) {
      statuses[k] =
          absl::UnavailableError(absl::StrCat("did not answer in time: ", statuses[k].message()));
    }
  });
  StepReport local;
  StepReport& out = report != nullptr ? *report : local;
  out = StepReport();
  std::vector<std::string> faults, not_stepped;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (size_t k = 0; k < busy.size(); ++k) {
    const MemberTarget& m = members[busy[k]]->target;
    std::vector<std::string> names;
    for (const GroupStep& g : parts[busy[k]]) names.push_back(g.group);
    if (statuses[k].ok()) {
      out.stepped.insert(out.stepped.end(), names.begin(), names.end());
      continue;
    }
    for (const std::string& n : names) out.failed.push_back({n, m.identity, statuses[k]});
    not_stepped.insert(not_stepped.end(), names.begin(), names.end());
    if (code == absl::StatusCode::kOk || statuses[k].code() == absl::StatusCode::kUnavailable) {
      code = statuses[k].code();
    }
    // The first few names; StepReport and the payload hold them all.
    constexpr size_t kNamed = 8;
    std::string named =
        absl::StrJoin(names.begin(), names.begin() + std::min(names.size(), kNamed), ", ");
    if (names.size() > kNamed) absl::StrAppend(&named, " and ", names.size() - kNamed, " more");
    faults.push_back(absl::StrCat("daemon '", m.identity, "' (", m.target,
                                  "): ", statuses[k].message(), "; its ", names.size(),
                                  " groups did not step: ", named));
  }
  if (faults.empty()) return absl::OkStatus();
  absl::Status status(code, absl::StrCat("step ", step, ": ", absl::StrJoin(faults, "; "), ". ",
                                         out.stepped.size(), " of ", groups.size(),
                                         " groups stepped on the other daemons; retry the step "
                                         "with the groups that did not"));
  status.SetPayload(kNotSteppedPayload, absl::Cord(absl::StrJoin(not_stepped, "\n")));
  return status;
}

absl::StatusOr<std::vector<GroupInfo>> Client::ListMembers() {
  const MemberList members = impl_->MembersNow();
  std::vector<absl::StatusOr<std::vector<GroupInfo>>> lists(members.size());
  ForEachInParallel(impl_->options.interrupted, members.size(),
                    [&](size_t i) { lists[i] = members[i]->shared->ListGroups(); });
  std::vector<GroupInfo> out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!lists[i].ok()) return InMember(members[i]->target, lists[i].status());
    for (GroupInfo& g : *lists[i]) {
      g.member = members[i]->target.identity;
      out.push_back(std::move(g));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const GroupInfo& a, const GroupInfo& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<Stats> Client::StatsOfMembers() {
  const MemberList members = impl_->MembersNow();
  std::vector<absl::StatusOr<Stats>> each(members.size());
  ForEachInParallel(impl_->options.interrupted, members.size(),
                    [&](size_t i) { each[i] = members[i]->shared->GetStats(); });
  Stats out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!each[i].ok()) return InMember(members[i]->target, each[i].status());
    Stats& s = *each[i];
    if (i == 0) {
      out = s;
      out.groups.clear();
      out.num_groups = out.total_elements = out.host_bytes = out.max_host_bytes = 0;
      out.chunks_applied = out.chunks_replayed = out.bytes_received = out.bytes_sent = 0;
    }
    out.num_groups += s.num_groups;
    out.total_elements += s.total_elements;
    out.host_bytes += s.host_bytes;
    out.max_host_bytes += s.max_host_bytes;
    out.chunks_applied += s.chunks_applied;
    out.chunks_replayed += s.chunks_replayed;
    out.bytes_received += s.bytes_received;
    out.bytes_sent += s.bytes_sent;
    const MemberTarget& m = members[i]->target;
    out.members.push_back({m.identity, m.target, m.weight, s.num_groups, s.total_elements,
                           s.host_bytes, s.max_host_bytes, s.started_unix_micros, s.has_state_dir,
                           s.instance_id});
    for (GroupStats& g : s.groups) {
      g.info.member = m.identity;
      out.groups.push_back(std::move(g));
    }
  }
  return out;
}

absl::StatusOr<Client::CheckpointResult> Client::CheckpointMembers(
    const CheckpointRequestOptions& options) {
  const MemberList members = impl_->MembersNow();
  const std::vector<PlacementMember> placement = PlacementOf(TargetsOf(members));
  // Each member checkpoints its own part of `groups` (all of its groups when
  // none are named); with wait_for_step, each waits for its own.
  std::vector<CheckpointRequestOptions> parts(members.size());
  for (CheckpointRequestOptions& p : parts) p.wait_for_step = options.wait_for_step;
  for (const std::string& g : options.groups) parts[OwnerOf(placement, "", g)].groups.push_back(g);
  auto asked = [&](size_t i) { return options.groups.empty() || !parts[i].groups.empty(); };
  // Every member asked is reachable and keeps checkpoints before any writes
  // one: a checkpoint written on some alone would push older ones, which a
  // rewind of the job on every member may need, out of their
  // --checkpoints_to_keep.
  std::vector<absl::StatusOr<Stats>> facts(members.size());
  ForEachInParallel(impl_->options.interrupted, members.size(), [&](size_t i) {
    if (asked(i)) facts[i] = members[i]->shared->DaemonFacts();
  });
  for (size_t i = 0; i < members.size(); ++i) {
    if (!asked(i)) continue;
    absl::Status s = facts[i].status();
    // (started_unix_micros 0: a daemon older than has_state_dir, which may have one.)
    if (s.ok() && !facts[i]->has_state_dir && facts[i]->started_unix_micros != 0) {
      s = absl::FailedPreconditionError(
          "it runs without --state_dir, so it writes no checkpoints; start it with one");
    }
    if (!s.ok()) {
      return InMember(members[i]->target,
                      absl::Status(s.code(), absl::StrCat(s.message(),
                                                          " (no checkpoint was written on any "
                                                          "daemon)")));
    }
  }
  std::vector<absl::StatusOr<CheckpointResult>> each(members.size());
  ForEachInParallel(impl_->options.interrupted, members.size(), [&](size_t i) {
    if (!asked(i)) {
      each[i] = CheckpointResult{};
      return;
    }
    each[i] = members[i]->shared->Checkpoint(parts[i]);
  });
  CheckpointResult out;
  std::vector<std::string> ids;
  bool first = true;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!each[i].ok()) {
      std::vector<std::string> written;
      for (size_t j = 0; j < members.size(); ++j) {
        if (each[j].ok() && !each[j]->id.empty()) {
          written.push_back(absl::StrCat(members[j]->target.identity, "=", each[j]->id));
        }
      }
      return InMember(
          members[i]->target,
          absl::Status(each[i].status().code(),
                       absl::StrCat(each[i].status().message(), " (written on the others: ",
                                    written.empty() ? "none" : absl::StrJoin(written, ", "),
                                    ")")));
    }
    if (each[i]->id.empty()) continue;
    ids.push_back(absl::StrCat(members[i]->target.identity, "=", each[i]->id));
    out.step = first ? each[i]->step : std::min(out.step, each[i]->step);
    out.bytes += each[i]->bytes;
    first = false;
  }
  out.id = absl::StrJoin(ids, ",");
  return out;
}

absl::StatusOr<Client::RewindResult> Client::RewindMembers(const std::string& prefix,
                                                           std::optional<uint64_t> step,
                                                           bool validate_only) {
  const MemberList members = impl_->MembersNow();
  std::vector<absl::StatusOr<RewindResult>> each(members.size());
  // Members with nothing to rewind: none of the job's groups there was ever
  // stepped (frozen ones only, or none), and no checkpoint of theirs holds
  // the job (a checkpoint of the trained groups skips them).
  std::vector<bool> idle(members.size(), false);
  // `validate` on every member not idle at once; the first refusal, named.
  auto on_all = [&](std::optional<uint64_t> at, bool validate) -> absl::Status {
    ForEachInParallel(impl_->options.interrupted, members.size(), [&](size_t i) {
      if (!idle[i]) each[i] = members[i]->shared->RewindJob(prefix, at, validate);
    });
    for (size_t i = 0; i < members.size(); ++i) {
      if (!idle[i] && !each[i].ok()) return InMember(members[i]->target, each[i].status());
    }
    return absl::OkStatus();
  };
  // Whether member i answered NOT_FOUND while it holds no stepped group of the job.
  auto untrained = [&](size_t i) {
    if (each[i].ok() || each[i].status().code() != absl::StatusCode::kNotFound) return false;
    absl::StatusOr<std::vector<GroupInfo>> groups = members[i]->shared->ListGroups();
    return groups.ok() && std::none_of(groups->begin(), groups->end(), [&](const GroupInfo& g) {
             return absl::StartsWith(g.name, prefix) && g.max_step > 0;
           });
  };
  // 1. Every member validates before any rewinds: a member refusing after
  //    others rewound would leave the job at two steps.
  absl::Status validated = on_all(step, true);
  if (!validated.ok()) {
    size_t refusing = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      idle[i] = untrained(i);
      refusing += !each[i].ok() && !idle[i];
    }
    if (refusing == 0 &&
        static_cast<size_t>(std::count(idle.begin(), idle.end(), true)) < members.size()) {
      validated = absl::OkStatus();
    }
  }
  if (!validated.ok()) {
    return absl::Status(validated.code(),
                        absl::StrCat(validated.message(), " (nothing was rewound on any daemon)"));
  }
  // A member answering step 0 holds frozen groups of the job only, which
  // take any step: the others decide it.
  uint64_t low = UINT64_MAX, high = 0;
  std::vector<std::string> newest;
  for (size_t i = 0; i < members.size(); ++i) {
    if (idle[i] || each[i]->step == 0) continue;
    low = std::min(low, each[i]->step);
    high = std::max(high, each[i]->step);
    newest.push_back(absl::StrCat(members[i]->target.identity, ": ", each[i]->checkpoint_id,
                                  " at step ", each[i]->step));
  }
  if (newest.empty()) low = high = step.value_or(0);
  if (low != high) {
    // Newest checkpoints at different steps (one daemon wrote another since):
    // the oldest of those steps, if every member holds it.
    if (absl::Status s = on_all(low, true); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemons' newest checkpoints hold job '", prefix, "' at different steps (",
          absl::StrJoin(newest, "; "), "), and not every daemon holds step ", low, ": ",
          s.message(), ". Nothing was rewound; give a step every daemon holds"));
    }
  }
  // 2. The rewind, at the one step every member validated.
  if (!validate_only) {
    if (absl::Status s = on_all(low, false); !s.ok()) {
      std::vector<std::string> rewound;
      for (size_t i = 0; i < members.size(); ++i) {
        if (!idle[i] && each[i].ok()) rewound.push_back(members[i]->target.identity);
      }
      return absl::Status(
          s.code(),
          absl::StrCat(s.message(), ". Every daemon had validated this rewind to step ", low,
                       ", and it was done on ",
                       rewound.empty() ? "none" : absl::StrJoin(rewound, ", "),
                       ": the job is at two steps until a rewind succeeds on all; rewind again"));
    }
  }
  RewindResult out;
  out.step = low;
  std::vector<std::string> ids;
  for (size_t i = 0; i < members.size(); ++i) {
    if (idle[i]) continue;
    ids.push_back(absl::StrCat(members[i]->target.identity, "=", each[i]->checkpoint_id));
    out.groups.insert(out.groups.end(), each[i]->groups.begin(), each[i]->groups.end());
    for (const std::string& p : each[i]->passed_over) {
      out.passed_over.push_back(absl::StrCat(members[i]->target.identity, ": ", p));
    }
  }
  out.checkpoint_id = absl::StrJoin(ids, ",");
  std::vector<std::string> written, not_written;
  for (size_t i = 0; i < members.size(); ++i) {
    if (idle[i]) continue;
    if (!each[i]->written_checkpoint_id.empty()) {
      written.push_back(
          absl::StrCat(members[i]->target.identity, "=", each[i]->written_checkpoint_id));
    }
    if (!each[i]->not_written.empty()) {
      not_written.push_back(absl::StrCat(members[i]->target.identity, ": ", each[i]->not_written));
    }
  }
  out.written_checkpoint_id = absl::StrJoin(written, ",");
  out.not_written = absl::StrJoin(not_written, "; ");
  return out;
}

absl::StatusOr<RebalanceResult> Client::Rebalance(const std::vector<MemberTarget>& given,
                                                  const RebalanceOptions& options) {
  if (!impl_->several) {
    return absl::FailedPreconditionError(
        "Rebalance needs a client of several daemons: connect with a list of targets "
        "(Client::Connect(std::vector<...>), one target is enough to start from)");
  }
  const std::vector<MemberTarget> next = WithIdentities(given);
  if (absl::Status s = CheckMemberTargets(next); !s.ok()) return s;
  const MemberList old_members = impl_->MembersNow();
  absl::StatusOr<MemberList> new_members = ConnectAll(next, impl_->options, old_members);
  if (!new_members.ok()) return new_members.status();
  // One daemon listed twice (two addresses of it, or one address under two
  // identities) would hold "another daemon's" copy of each group it owns,
  // which the deletes below would remove: refused, nothing moved.
  const std::vector<absl::StatusOr<std::string>> new_ids = Impl::InstanceIdsOf(*new_members);
  if (absl::Status s = Impl::CheckOneDaemonEach(*new_members, new_ids, true); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; nothing moved"));
  }
  // Every daemon that may hold a copy: the new members, and the old ones
  // that leave. An old member that is a new one's daemon under another
  // identity or address (names given to the daemons, say) does not leave:
  // its groups are listed through the new member.
  MemberList all = *new_members;
  std::vector<absl::StatusOr<std::string>> old_ids = Impl::InstanceIdsOf(old_members);
  for (size_t j = 0; j < old_members.size(); ++j) {
    const auto& m = old_members[j];
    const bool kept = std::any_of(all.begin(), all.end(), [&](const auto& n) {
      return n->target.identity == m->target.identity;
    });
    if (kept) continue;
    if (!old_ids[j].ok()) {
      // It may be a new member's daemon under its old identity: taken for
      // another daemon, its copies would be deleted.
      return InMember(m->target, absl::Status(old_ids[j].status().code(),
                                              absl::StrCat("cannot tell which daemon it is, so "
                                                           "nothing moved: ",
                                                           old_ids[j].status().message())));
    }
    const bool renamed = !old_ids[j]->empty() &&
                         std::any_of(new_ids.begin(), new_ids.end(),
                                     [&](const auto& id) { return id.ok() && *id == *old_ids[j]; });
    if (!renamed) all.push_back(m);
  }
  std::vector<absl::StatusOr<std::vector<GroupInfo>>> lists(all.size());
  ForEachInParallel(impl_->options.interrupted, all.size(),
                    [&](size_t i) { lists[i] = all[i]->shared->ListGroups(); });
  std::map<std::string, std::vector<std::pair<size_t, GroupInfo>>> copies;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!lists[i].ok()) {
      return InMember(all[i]->target,
                      absl::Status(lists[i].status().code(),
                                   absl::StrCat("cannot list its groups, so nothing moved: ",
                                                lists[i].status().message())));
    }
    for (GroupInfo& g : *lists[i]) copies[g.name].emplace_back(i, std::move(g));
  }
  const std::vector<PlacementMember> placement = PlacementOf(TargetsOf(*new_members));
  RebalanceResult result;
  auto act = [&](std::string what) {
    if (options.before_each) options.before_each(what);
    result.log.push_back(std::move(what));
  };
  // The current copy of each group: the highest (max_step, min_step); on a
  // tie one not sealed for a move (the import a killed Rebalance made), then
  // the owner's.
  auto current_of = [&](const std::string& name,
                        const std::vector<std::pair<size_t, GroupInfo>>& held) {
    const size_t owner = OwnerOf(placement, "", name);  // An index into `all` too.
    auto rank = [&](const std::pair<size_t, GroupInfo>& c) {
      return std::make_tuple(c.second.max_step, c.second.min_step, c.second.moved_to.empty(),
                             c.first == owner);
    };
    return std::max_element(held.begin(), held.end(),
                            [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  };
  // Groups another job leases cannot be sealed or deleted by this one. Found
  // before anything moves: one on a daemon that leaves refuses the whole
  // Rebalance (its job must stop first, or move it); one on a daemon that
  // stays is left there, for its job's own Rebalance. A refusal part-way
  // would leave this client on the old member list with some of its groups
  // moved, its steps refused.
  std::set<std::string> leased_by_others;
  for (const auto& [name, held] : copies) {
    const size_t owner = OwnerOf(placement, "", name);
    const auto current = current_of(name, held);
    if (current->first == owner && held.size() == 1 && current->second.moved_to.empty()) {
      continue;  // Nothing to do to it.
    }
    const GroupInfo& info = current->second;
    if (!info.lease.has_value() || info.lease->holder == impl_->options.lease_holder) continue;
    const std::string job = info.lease->job.empty() ? info.lease->holder : info.lease->job;
    if (current->first >= new_members->size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", name, "' is on daemon '", all[current->first]->target.identity,
          "', which leaves the member list, and job '", job,
          "' leases it; nothing moved. Stop that job (or let it run this Rebalance), then "
          "call it again"));
    }
    leased_by_others.insert(name);
  }
  // The other copies of each group are deleted only once its owner's copy
  // is durable: after the moves, each owner that will keep the only copy of
  // a group writes a checkpoint (owners without --state_dir keep nothing
  // durable to wait for). Deleted at once, a copy imported into a daemon
  // that crashed before its next checkpoint would be gone from every
  // member.
  std::vector<std::pair<std::string, size_t>> deletes;  // (group, index into `all`)
  std::set<size_t> keeping;                             // Owners of those groups.
  auto flush = [&]() -> absl::Status {
    // The owners' checkpoints at once: each takes its own disk's time.
    const std::vector<size_t> owners(keeping.begin(), keeping.end());
    std::vector<absl::StatusOr<Stats>> facts(owners.size());
    ForEachInParallel(impl_->options.interrupted, owners.size(),
                      [&](size_t i) { facts[i] = all[owners[i]]->shared->DaemonFacts(); });
    std::vector<size_t> durable;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (!facts[i].ok()) return InMember(all[owners[i]]->target, facts[i].status());
      // (started_unix_micros 0: a daemon older than has_state_dir, which may have one.)
      if (!facts[i]->has_state_dir && facts[i]->started_unix_micros != 0) continue;
      act(absl::StrCat("checkpoint ", all[owners[i]]->target.identity));
      durable.push_back(i);
    }
    std::vector<absl::StatusOr<CheckpointResult>> written(owners.size());
    ForEachInParallel(impl_->options.interrupted, durable.size(), [&](size_t j) {
      written[durable[j]] = all[owners[durable[j]]]->shared->Checkpoint();
    });
    for (size_t i : durable) {
      if (written[i].ok()) continue;
      // A daemon older than has_state_dir refusing for want of one keeps
      // nothing durable to wait for.
      if (facts[i]->started_unix_micros == 0 && absl::IsFailedPrecondition(written[i].status()) &&
          absl::StrContains(written[i].status().message(), "this daemon keeps no checkpoints")) {
        continue;
      }
      return InMember(
          all[owners[i]]->target,
          absl::Status(
              written[i].status().code(),
              absl::StrCat("the checkpoint that makes its moved groups durable before "
                           "their old copies are deleted failed, so no copy was "
                           "deleted: ",
                           written[i].status().message(), ". Fix it and call Rebalance again")));
    }
    keeping.clear();
    for (const auto& [name, where] : deletes) {
      act(absl::StrCat("delete ", name, " from ", all[where]->target.identity));
      absl::Status s = all[where]->shared->DeleteGroup(name);
      if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
        return InMember(all[where]->target, s);
      }
    }
    deletes.clear();
    return absl::OkStatus();
  };
  for (auto& [name, held] : copies) {
    const size_t owner = OwnerOf(placement, "", name);  // An index into `all` too.
    const auto current = current_of(name, held);
    const size_t from = current->first;
    if (leased_by_others.count(name) != 0) {
      const Lease& lease = *current->second.lease;
      result.left.push_back(name);
      result.log.push_back(absl::StrCat("leave ", name, " on ", all[from]->target.identity,
                                        ": job '", lease.job.empty() ? lease.holder : lease.job,
                                        "' leases it (its own Rebalance moves it)"));
      continue;
    }
    const std::string& owner_id = all[owner]->target.identity;
    // A current copy on its owner but sealed (a killed Rebalance towards
    // another daemon, now undone) is exported and imported in place: the
    // import unseals it.
    if (from != owner || !current->second.moved_to.empty()) {
      act(absl::StrCat("export ", name, " from ", all[from]->target.identity, " to ", owner_id));
      absl::StatusOr<GroupState> state = all[from]->shared->ExportStateForMove(name, owner_id);
      if (!state.ok()) return InMember(all[from]->target, state.status());
      // One page step when every page is at one step (daemons of different
      // --page_elements then agree); the daemon's pages otherwise.
      if (std::all_of(state->page_steps.begin(), state->page_steps.end(),
                      [&](uint64_t s) { return s == state->page_steps.front(); })) {
        state->page_steps.resize(1);
      }
      // Whatever a step left there moves, a diverged run's inf and NaN too.
      state->accept_non_finite = true;
      // A group no copy of which this client leases (a restart ended its
      // job's lease; leases are not checkpointed) moves unleased: it may be
      // another job's, which takes it at its next step.
      const bool leased = std::any_of(held.begin(), held.end(), [&](const auto& c) {
        return c.second.lease.has_value() && c.second.lease->holder == impl_->options.lease_holder;
      });
      act(absl::StrCat("import ", name, " into ", owner_id));
      absl::Status imported = all[owner]->shared->ImportStateForMove(*state, leased);
      if (imported.code() == absl::StatusCode::kResourceExhausted && !deletes.empty()) {
        // The owner may be full of copies this call has yet to delete: the
        // moves so far made durable and their old copies deleted, once more.
        if (absl::Status s = flush(); !s.ok()) return s;
        act(absl::StrCat("import ", name, " into ", owner_id));
        imported = all[owner]->shared->ImportStateForMove(*state, leased);
      }
      if (!imported.ok()) return InMember(all[owner]->target, imported);
      ++result.moved;
    } else if (held.size() == 1) {
      ++result.untouched;
    }
    for (const auto& [where, info] : held) {
      if (where == owner) continue;
      deletes.emplace_back(name, where);
      keeping.insert(owner);
      if (where != from) ++result.copies_deleted;
    }
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  {
    absl::MutexLock lock(&impl_->members_mu);
    impl_->members = *std::move(new_members);
  }
  return result;
}

}  // namespace optstate
