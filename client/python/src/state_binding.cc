// Client.export_state / import_state: a group's whole state (params, exp_avg,
// exp_avg_sq, max_exp_avg_sq with amsgrad, page steps) out of and into the daemon, as numpy arrays;
// and Client.checkpoint, the daemon's own durable copy of it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "buffers.h"
#include "errors.h"
#include "hyperparameters.h"
#include "py_client.h"
#include "type_hints.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace optstate::python {
namespace {

using GroupState = Client::GroupState;

template <typename T>
using Array = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A numpy array that owns `values` (moved into a capsule's vector): it, and a
// torch tensor made from it, keep no Python object of this module alive, so
// one still held when the interpreter exits is freed with it rather than
// reported by nanobind as a leaked instance.
template <typename T>
Array<T> Owning(std::vector<T>&& values) {
  auto* held = new std::vector<T>(std::move(values));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Array<T>(held->data(), {held->size()}, owner);
}

// Client::GroupState for Python: the same fields, each vector a numpy array
// that owns its memory (Owning).
struct ExportedState {
  explicit ExportedState(GroupState&& state)
      : name(std::move(state.name)),
        hyperparameters(state.hyperparameters),
        page_elements(state.page_elements),
        params(Owning(std::move(state.params))),
        exp_avg(Owning(std::move(state.exp_avg))),
        exp_avg_sq(Owning(std::move(state.exp_avg_sq))),
        max_exp_avg_sq(Owning(std::move(state.max_exp_avg_sq))),
        page_steps(Owning(std::move(state.page_steps))) {}
  std::string name;
  Hyperparameters hyperparameters;
  uint64_t page_elements;
  Array<float> params, exp_avg, exp_avg_sq, max_exp_avg_sq;
  Array<uint64_t> page_steps;
};

std::vector<float> CopyFloats(nb::handle array, const char* what) {
  HostBuffer view = ViewHostBuffer(array, what, false);
  if (view.type != WireType::kFloat32) {
    throw nb::type_error(absl::StrCat(what, ": dtype ", WireTypeName(view.type),
                                      " is not supported; the daemon's state is float32")
                             .c_str());
  }
  return std::vector<float>(view.floats().begin(), view.floats().end());
}

}  // namespace

void BindState(nb::module_& m, nb::class_<PyClient>& cls) {
  nb::class_<ExportedState> group_state(
      m, "GroupState",
      "A group's whole optimizer state as the daemon holds it (float32\n"
      "numpy arrays, flat; page_steps one per page of page_elements).");
  group_state.def_ro("name", &ExportedState::name);
  DefHyperparameterProperties(group_state);
  // Each array returned as itself, owned by its capsule (not by this object: a
  // getter's default policy, reference_internal, would tie it to this object).
  constexpr auto kOwned = nb::rv_policy::automatic;
  group_state.def_ro("page_elements", &ExportedState::page_elements)
      .def_prop_ro(
          "params", [](const ExportedState& self) { return self.params; }, kOwned,
          "The fp32 master weights.")
      .def_prop_ro(
          "exp_avg", [](const ExportedState& self) { return self.exp_avg; }, kOwned)
      .def_prop_ro(
          "exp_avg_sq", [](const ExportedState& self) { return self.exp_avg_sq; }, kOwned)
      .def_prop_ro(
          "max_exp_avg_sq",
          [](const ExportedState& self) -> std::optional<Array<float>> {
            if (!self.hyperparameters.amsgrad) return std::nullopt;
            return self.max_exp_avg_sq;
          },
          kOwned, "torch's state['max_exp_avg_sq'] of an amsgrad group; None without amsgrad.")
      .def_prop_ro(
          "page_steps", [](const ExportedState& self) { return self.page_steps; }, kOwned,
          "The step each page has reached (all equal unless a step is under way).");

  cls.def(
      "export_state",
      [](PyClient& self, const std::string& name) {
        absl::StatusOr<GroupState> state;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          state = live->ExportState(name);
        }
        ThrowIfError(state.status(), self.target);
        return ExportedState(*std::move(state));
      },
      "name"_a,
      "Reads group `name`'s whole state (GroupState). Each page is read under its lock with\n"
      "its step; pages stepped meanwhile may be at different steps. NotFound when absent.");

  cls.def(
      "import_state",
      [](PyClient& self, const std::string& name, BufferArg params, BufferArg exp_avg,
         BufferArg exp_avg_sq, std::vector<uint64_t> page_steps, double lr,
         std::tuple<double, double> betas, double eps, double weight_decay, bool maximize,
         bool amsgrad, BufferArg max_exp_avg_sq, bool accept_non_finite) {
        GroupState state;
        state.accept_non_finite = accept_non_finite;
        state.name = name;
        state.hyperparameters =
            MakeHyperparameters(lr, betas, eps, weight_decay, maximize, amsgrad);
        state.params = CopyFloats(params, "params");
        state.exp_avg = CopyFloats(exp_avg, "exp_avg");
        state.exp_avg_sq = CopyFloats(exp_avg_sq, "exp_avg_sq");
        if (!max_exp_avg_sq.is_none()) {
          state.max_exp_avg_sq = CopyFloats(max_exp_avg_sq, "max_exp_avg_sq");
        }
        state.page_steps = std::move(page_steps);
        absl::Status status;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          status = live->ImportState(state);
        }
        ThrowIfError(status, self.target);
      },
      "name"_a, "params"_a, "exp_avg"_a, "exp_avg_sq"_a, "page_steps"_a, nb::kw_only(),
      "lr"_a = kDefaultHyperparameters.lr, "betas"_a = Betas(kDefaultHyperparameters),
      "eps"_a = kDefaultHyperparameters.eps,
      "weight_decay"_a = kDefaultHyperparameters.weight_decay,
      "maximize"_a = kDefaultHyperparameters.maximize,
      "amsgrad"_a = kDefaultHyperparameters.amsgrad, "max_exp_avg_sq"_a = nb::none(),
      "accept_non_finite"_a = false,
      "Creates group `name` with this state, or replaces the whole state of an existing\n"
      "group of the same size and hyperparameters (AlreadyExists when it differs).\n"
      "`params`, `exp_avg`, `exp_avg_sq` are float32 arrays of one length, and\n"
      "`max_exp_avg_sq` too with amsgrad=True (None without); `page_steps`\n"
      "one step per daemon page, or exactly one for every page (torch's 'step'); steps are\n"
      "0 (never stepped) to 2^64-2. Nothing is visible to Step until all of it arrived and\n"
      "passed the daemon's checks (InvalidArgument for an exp_avg_sq or max_exp_avg_sq below\n"
      "0, and for nan or inf in params or exp_avg and nan in the squares, which may be +inf).\n"
      "accept_non_finite=True takes a diverged run's state as it is (nan or inf in params\n"
      "and exp_avg, nan in the squares), as torch's load_state_dict does; a square below 0\n"
      "is refused still.");

  cls.def(
      "checkpoint",
      [](PyClient& self, std::optional<std::vector<std::string>> groups,
         std::optional<uint64_t> wait_for_step) {
        Client::CheckpointRequestOptions options;
        if (groups.has_value()) options.groups = *std::move(groups);
        options.wait_for_step = wait_for_step;
        absl::StatusOr<Client::CheckpointResult> result;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          result = live->Checkpoint(options);
        }
        ThrowIfError(result.status(), self.target);
        nb::dict d;
        d["id"] = result->id;
        d["step"] = result->step;
        d["bytes"] = result->bytes;
        return StrDict(std::move(d));
      },
      "groups"_a = nb::none(), nb::kw_only(), "wait_for_step"_a = nb::none(),
      "Asks the daemon (started with --state_dir) for a durable checkpoint of every group\n"
      "and returns {'id', 'step', 'bytes'} once it is on disk (docs/durability.md). With\n"
      "`wait_for_step` s it first waits until every page of `groups` (names; None: all) is\n"
      "at s: FailedPrecondition, naming the step held, when a page is past s (nothing\n"
      "written); DeadlineExceeded when s is not reached within the client's\n"
      "attempt_timeout; NotFound for an unknown group; FailedPrecondition without\n"
      "--state_dir. Made once, never retried.");

  cls.def(
      "rewind_job",
      [](PyClient& self, const std::string& prefix, std::optional<uint64_t> step,
         bool validate_only) {
        absl::StatusOr<Client::RewindResult> result;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          result = live->RewindJob(prefix, step, validate_only);
        }
        ThrowIfError(result.status(), self.target);
        nb::dict d;
        d["checkpoint_id"] = result->checkpoint_id;
        d["step"] = result->step;
        nb::list groups, passed_over;
        for (const std::string& g : result->groups) groups.append(g);
        for (const std::string& p : result->passed_over) passed_over.append(p);
        d["groups"] = groups;
        d["passed_over"] = passed_over;
        d["written_checkpoint_id"] = result->written_checkpoint_id;
        d["not_written"] = result->not_written;
        return StrDict(std::move(d));
      },
      "prefix"_a, nb::kw_only(), "step"_a = nb::none(), "validate_only"_a = false,
      "Rewinds one job, this tenant's groups named `prefix` + ..., to the newest checkpoint\n"
      "of the daemon's --state_dir holding them at one step (`step` when given), while the\n"
      "daemon goes on stepping the other jobs (docs/jobs.md); returns {'checkpoint_id',\n"
      "'step', 'groups', 'passed_over', 'written_checkpoint_id', 'not_written'}: the\n"
      "daemon writes a checkpoint after the rewind, so that a restart restores the\n"
      "rewound job ('not_written' says why it could not). The groups are leased to this client's\n"
      "lease_holder. FailedPrecondition without --state_dir, for a live group of the job\n"
      "the checkpoint lacks, or another holder's lease; NotFound when no checkpoint holds\n"
      "the job so. Made once, never retried. validate_only=True: every check, and the\n"
      "result the rewind would have, changing nothing. A client of several daemons\n"
      "validates on all before it rewinds any, at one step (without `step`, the oldest of\n"
      "their newest checkpoints' steps where they differ).");
}

}  // namespace optstate::python
