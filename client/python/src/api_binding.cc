// Client.step and Client.stats: the Python arguments turned into the C++
// client's GroupStep (typed buffer views) / StepOptions, and its Stats into a
// dict. The only file that knows those C++ types' layout.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "buffers.h"
#include "errors.h"
#include "lease_objects.h"
#include "optstate/stats.h"
#include "prepared_step.h"
#include "py_client.h"
#include "step_entries.h"
#include "type_hints.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace optstate::python {
namespace {

const char* PlacementName(Placement p) {
  switch (p) {
    case Placement::kUnspecified:
      return "unspecified";
    case Placement::kHost:
      return "host";
    case Placement::kDeviceResident:
      return "device_resident";
    case Placement::kDevicePaged:
      return "device_paged";
  }
  return "unspecified";
}

nb::dict ToDict(const Hyperparameters& h) {
  nb::dict d;
  d["lr"] = h.lr;
  d["beta1"] = h.beta1;
  d["beta2"] = h.beta2;
  d["eps"] = h.eps;
  d["weight_decay"] = h.weight_decay;
  return d;
}

nb::dict ToDict(const GroupInfo& g) {
  nb::dict d;
  d["name"] = g.name;
  d["member"] = g.member;
  d["moved_to"] = g.moved_to;
  d["num_elements"] = g.num_elements;
  d["hyperparameters"] = ToDict(g.hyperparameters);
  d["page_elements"] = g.page_elements;
  d["num_pages"] = g.num_pages;
  d["min_step"] = g.min_step;
  d["max_step"] = g.max_step;
  d["host_bytes"] = g.host_bytes;
  d["placement"] = PlacementName(g.placement);
  d["pages_awaiting_values"] = g.pages_awaiting_values;
  d["lease"] = LeaseObject(g);
  d["last_step"] = LastStepObject(g);
  return d;
}

nb::dict ToDict(const LatencyPercentiles& l) {
  nb::dict d;
  d["p50_us"] = l.p50_us;
  d["p99_us"] = l.p99_us;
  d["samples"] = l.samples;
  return d;
}

nb::dict ToDict(const PagingCounters& p) {
  nb::dict d;
  d["page_ins"] = p.page_ins;
  d["page_outs"] = p.page_outs;
  d["bytes_host_to_device"] = p.bytes_host_to_device;
  d["bytes_device_to_host"] = p.bytes_device_to_host;
  d["copy_wait_us"] = p.copy_wait_us;
  return d;
}

nb::dict ToDict(const GroupStats& g) {
  nb::dict d;
  d["info"] = ToDict(g.info);
  d["steps_completed"] = g.steps_completed;
  d["chunks_applied"] = g.chunks_applied;
  d["chunks_replayed"] = g.chunks_replayed;
  d["bytes_received"] = g.bytes_received;
  d["bytes_sent"] = g.bytes_sent;
  d["step_latency"] = ToDict(g.step_latency);
  d["chunk_latency"] = ToDict(g.chunk_latency);
  d["paging"] = ToDict(g.paging);
  return d;
}

nb::dict ToDict(const DeviceStats& s) {
  nb::dict d;
  d["strategy"] = s.strategy;
  d["budget_total_bytes"] = s.budget_total_bytes;
  d["budget_reserved_bytes"] = s.budget_reserved_bytes;
  d["budget_target_utilization"] = s.budget_target_utilization;
  d["budget_available_bytes"] = s.budget_available_bytes;
  d["resident_bytes"] = s.resident_bytes;
  d["staging_pool_bytes"] = s.staging_pool_bytes;
  d["staging_slots"] = s.staging_slots;
  return d;
}

nb::dict ToDict(const CheckpointInfo& c) {
  nb::dict d;
  d["id"] = c.id;
  d["step"] = c.step;
  d["bytes"] = c.bytes;
  d["duration_seconds"] = c.duration_seconds;
  d["finished_unix_micros"] = c.finished_unix_micros;
  return d;
}

nb::dict ToDict(const RegionStats& r) {
  nb::dict d;
  d["sessions"] = r.sessions;
  d["regions"] = r.regions;
  d["registered_bytes"] = r.registered_bytes;
  d["mapped_bytes"] = r.mapped_bytes;
  d["registrations"] = r.registrations;
  d["step_plans"] = r.step_plans;
  d["step_plan_uses"] = r.step_plan_uses;
  return d;
}

nb::dict ToDict(const Stats& s) {
  nb::dict d;
  d["backend"] = s.backend;
  d["num_groups"] = s.num_groups;
  d["total_elements"] = s.total_elements;
  d["host_bytes"] = s.host_bytes;
  d["max_host_bytes"] = s.max_host_bytes;
  d["chunks_applied"] = s.chunks_applied;
  d["chunks_replayed"] = s.chunks_replayed;
  d["bytes_received"] = s.bytes_received;
  d["bytes_sent"] = s.bytes_sent;
  d["paging"] = ToDict(s.paging);
  d["device"] = ToDict(s.device);
  nb::list groups;
  for (const GroupStats& g : s.groups) groups.append(ToDict(g));
  d["groups"] = groups;
  d["threads"] = s.threads;
  d["cpu_kernel"] = s.cpu_kernel;
  if (s.last_checkpoint.has_value()) {
    d["last_checkpoint"] = ToDict(*s.last_checkpoint);
  } else {
    d["last_checkpoint"] = nb::none();
  }
  d["checkpoints_written"] = s.checkpoints_written;
  d["checkpoint_failures"] = s.checkpoint_failures;
  d["last_checkpoint_error"] = s.last_checkpoint_error;
  d["restored_checkpoint_id"] = s.restored_checkpoint_id;
  nb::list refusals;
  for (const std::string& r : s.restore_refusals) refusals.append(r);
  d["restore_refusals"] = refusals;
  d["regions"] = ToDict(s.regions);
  nb::dict heap;
  heap["in_use_bytes"] = s.heap.in_use_bytes;
  heap["free_bytes"] = s.heap.free_bytes;
  heap["resident_bytes"] = s.heap.resident_bytes;
  heap["trims"] = s.heap.trims;
  d["heap"] = heap;
  d["started_unix_micros"] = s.started_unix_micros;
  d["instance_id"] = s.instance_id;
  d["has_state_dir"] = s.has_state_dir;
  d["restored_groups"] = s.restored_groups;
  d["lease_seconds"] = s.lease_seconds;
  nb::list members;
  for (const MemberStats& m : s.members) {
    nb::dict e;
    e["identity"] = m.identity;
    e["target"] = m.target;
    e["weight"] = m.weight;
    e["num_groups"] = m.num_groups;
    e["total_elements"] = m.total_elements;
    e["host_bytes"] = m.host_bytes;
    e["max_host_bytes"] = m.max_host_bytes;
    e["started_unix_micros"] = m.started_unix_micros;
    e["instance_id"] = m.instance_id;
    e["has_state_dir"] = m.has_state_dir;
    members.append(e);
  }
  d["members"] = members;
  return d;
}

}  // namespace

void BindStepAndStats(nb::class_<PyClient>& cls) {
  cls.def(
      "step",
      [](PyClient& self, StepGroupsArg groups, uint64_t step, BufferArg gradient,
         BufferArg params_out, std::optional<double> lr, std::optional<float> grad_scale,
         WireDtypeArg wire_dtype, bool gradients_checked) {
        // 1. Every buffer viewed and checked, with the GIL, before anything is sent
        //    (a _PreparedStep's were when it was made).
        std::vector<StepEntry> given;
        const std::vector<StepEntry>* entries = &given;
        if (nb::isinstance<PreparedStep>(groups)) {
          if (!gradient.is_none() || !params_out.is_none()) {
            throw nb::type_error(
                "step: a _PreparedStep holds its groups' buffers; give no "
                "gradient=/params_out=");
          }
          entries = &nb::cast<const PreparedStep&>(groups).entries;
        } else if (nb::isinstance<nb::str>(groups)) {
          if (gradient.is_none()) throw nb::type_error("step: gradient is required with one group");
          const std::string name = nb::cast<std::string>(groups);
          given.push_back(MakeEntry(name, gradient, params_out,
                                    [&] { return absl::StrCat("group '", name, "' "); }));
        } else {
          if (!gradient.is_none() || !params_out.is_none()) {
            throw nb::type_error(
                "step: with a list of groups, give each group's buffers in its tuple "
                "(name, gradient[, params_out[, lr[, hyperparameters]]]), not as "
                "gradient=/params_out=");
          }
          size_t i = 0;
          for (nb::handle item : groups) {
            const size_t index = i++;
            nb::tuple t;
            if (!nb::try_cast<nb::tuple>(item, t) || t.size() < 2 || t.size() > 5) {
              throw nb::type_error(absl::StrCat("groups[", index,
                                                "]: expected a tuple (name, gradient[, "
                                                "params_out[, lr[, hyperparameters]]])")
                                       .c_str());
            }
            const std::string name = nb::cast<std::string>(t[0]);
            // "group 'NAME', groups[I].", made only for a refusal.
            auto where = [&] { return absl::StrCat("group '", name, "', groups[", index, "]."); };
            given.push_back(
                MakeEntry(name, t[1], t.size() >= 3 ? nb::handle(t[2]) : nb::none(), where));
            if (t.size() == 5 && !t[4].is_none()) ReadOverrides(t[4], where(), &given.back());
            if (t.size() >= 4 && !t[3].is_none()) {
              double group_lr;
              if (!nb::try_cast<double>(t[3], group_lr)) {
                throw nb::type_error(absl::StrCat(where(), "lr: expected a float or None").c_str());
              }
              given.back().lr = group_lr;
            }
          }
        }
        std::optional<WireType> wire;
        if (!wire_dtype.is_none()) wire = ParseWireType(wire_dtype, "wire_dtype");
        std::vector<const HostBuffer*> gradients, outs;
        for (const StepEntry& e : *entries) {
          gradients.push_back(&e.gradient);
          if (e.params_out) outs.push_back(&*e.params_out);
        }
        StepOptions options;
        options.gradient_dtype = ResolveWire(gradients, wire, "gradient");
        options.param_dtype = ResolveWire(outs, wire, "params_out");
        options.lr = lr;
        options.grad_scale = grad_scale;
        options.gradients_checked = gradients_checked;
        std::vector<GroupStep> steps;
        steps.reserve(entries->size());
        for (const StepEntry& e : *entries) steps.push_back(ToGroupStep(e));
        // 2. The whole step without the GIL; `entries` keeps the arrays alive (`groups`
        //    keeps a _PreparedStep's).
        absl::Status status;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          status = live->Step(steps, step, options);
        }
        ThrowIfError(status, self.target);
      },
      "groups"_a, "step"_a, "gradient"_a = nb::none(), "params_out"_a = nb::none(), nb::kw_only(),
      "lr"_a = nb::none(), "grad_scale"_a = nb::none(), "wire_dtype"_a = nb::none(),
      "gradients_checked"_a = false,
      "Applies step `step` (1, 2, ...) to one group or to many in one stream.\n\n"
      "`groups` is a group name (then give `gradient` and optionally `params_out`) or a list\n"
      "of tuples (name, gradient[, params_out[, lr[, hyperparameters]]]), `lr` that group's own\n"
      "for this step, `hyperparameters` a dict of its other ones for this step where they\n"
      "differ from the registered ones: any of betas (a pair), eps, weight_decay, maximize\n"
      "(RemoteAdamW passes a _PreparedStep instead: its parameters read in C++).\n"
      "Buffers are numpy arrays or torch CPU tensors, C-contiguous float32, bfloat16 or\n"
      "float16, read and written in place (a tensor that requires grad: pass .detach()).\n"
      "float32 buffers travel as `wire_dtype` (float32 unless set to 'bfloat16' or 'float16',\n"
      "or an optstate.WireType); 16-bit buffers travel as they are. One call carries one\n"
      "type: float32 beside 16-bit buffers is a ValueError unless wire_dtype names that type.\n"
      "`lr` overrides the groups' lr for this step (unless a tuple gives its own),\n"
      "`grad_scale` multiplies every gradient.\n"
      "`gradients_checked=True`: the caller has checked every gradient finite after grad_scale,\n"
      "as sent (a finite clip_grad_norm_ shows it); on shared memory the daemon then checks\n"
      "each chunk of up to 1 MiB of gradient as it applies it, in cache, instead of all before\n"
      "any (StepOptions::gradients_checked; a larger tensor goes in chunks of up to 1 MiB): a\n"
      "gradient that is not finite after all is still refused (InvalidArgument) and its chunk\n"
      "left as it was, but other chunks of the step may have been applied (repeating the step\n"
      "with it fixed replays them). No effect on\n"
      "the wire.\n\n"
      "Nothing is sent when a buffer is of the wrong kind or on another device than the CPU\n"
      "(TypeError/ValueError naming its group and buffer)\n"
      "or a gradient is not finite (unless gradients_checked, for buffers in a shared buffer)\n"
      "or has the wrong length (InvalidArgument). Transient\n"
      "failures resend what got no reply; the daemon applies every page exactly once, so\n"
      "repeating a step replays it (nothing applied twice, current params returned).");

  cls.def(
      "stats",
      [](PyClient& self) {
        absl::StatusOr<Stats> stats;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          stats = live->GetStats();
        }
        ThrowIfError(stats.status(), self.target);
        return StrDict(ToDict(*stats));
      },
      "The daemon's counters as a dict (optstate::Stats' fields), every key at its top level:\n"
      "backend, num_groups, total_elements, host_bytes, max_host_bytes, chunks_applied,\n"
      "chunks_replayed, bytes_received, bytes_sent, paging, device, threads, cpu_kernel (the\n"
      "CPU kernel's path: avx512, avx2 or scalar), groups (a list, one dict per group: info,\n"
      "steps_completed, chunks_applied, chunks_replayed, latencies, ...); for durability,\n"
      "last_checkpoint (a dict of id, step, bytes, duration_seconds, finished_unix_micros, or\n"
      "None), checkpoints_written, checkpoint_failures, last_checkpoint_error,\n"
      "restored_checkpoint_id, restore_refusals, restored_groups, has_state_dir; the\n"
      "daemon's started_unix_micros, instance_id and lease_seconds; regions (a dict of the\n"
      "daemon's shared-memory regions: sessions, regions, registered_bytes, mapped_bytes,\n"
      "registrations); heap (a dict of the daemon's malloc heap: in_use_bytes, free_bytes,\n"
      "resident_bytes, trims); and members (a list, one dict per daemon of a client of\n"
      "several; empty for one).");
}

}  // namespace optstate::python
