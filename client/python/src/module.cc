// optstate._optstate: nanobind bindings of optstate::Client (connect,
// register, describe, list, delete; step and stats in api_binding.cc).
// Every network call runs without the GIL; errors become optstate.Error.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "buffers.h"
#include "errors.h"
#include "hyperparameters.h"
#include "lease_objects.h"
#include "prepared_step.h"
#include "py_client.h"
#include "type_hints.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace optstate::python {
namespace {

// Client options refused before any daemon is asked: optstate.InvalidArgument
// (a ValueError), as the C++ client's own checks of its options raise.
absl::Duration Seconds(double seconds, const char* what) {
  if (!(seconds > 0)) {
    RaiseStatus(absl::InvalidArgumentError(
                    absl::StrCat(what, " must be a positive number of seconds, got ", seconds)),
                "");
  }
  if (std::isinf(seconds)) return absl::InfiniteDuration();
  return absl::Seconds(seconds);
}

// ClientOptions' data planes by their Python names (the C++ enum has none).
constexpr std::pair<DataPlane, const char*> kDataPlanes[] = {
    {DataPlane::kAuto, "auto"},
    {DataPlane::kWire, "wire"},
    {DataPlane::kSharedMemory, "shared_memory"},
};

const char* DataPlaneName(DataPlane plane) {
  for (const auto& [p, name] : kDataPlanes) {
    if (p == plane) return name;
  }
  return "?";
}

DataPlane ParseDataPlane(const std::string& name) {
  std::vector<std::string> quoted;
  for (const auto& [plane, plane_name] : kDataPlanes) {
    if (name == plane_name) return plane;
    quoted.push_back(absl::StrCat("'", plane_name, "'"));
  }
  const std::string last = quoted.back();
  quoted.pop_back();
  RaiseStatus(
      absl::InvalidArgumentError(absl::StrCat("data_plane must be ", absl::StrJoin(quoted, ", "),
                                              " or ", last, ", got '", name, "'")),
      "");
}

// `options` as Client()'s keyword arguments (durations in seconds, the data
// plane by name). Of a default ClientOptions, it is the keywords' defaults.
// Client(target): "host:port", or a list of them or of dicts {target,
// identity, weight} (several daemons).
using TargetArg = nb::object;

std::vector<MemberTarget> MemberTargetsOf(const TargetArg& arg) {
  if (nb::isinstance<nb::str>(arg)) return {MemberTarget{nb::cast<std::string>(arg), "", 1.0}};
  if (!nb::isinstance<nb::list>(arg) && !nb::isinstance<nb::tuple>(arg)) {
    throw nb::type_error(
        "target must be 'host:port', or a list of them (or of dicts with 'target', and "
        "optionally 'identity' and 'weight') for several daemons");
  }
  std::vector<MemberTarget> members;
  for (nb::handle item : arg) {
    if (nb::isinstance<nb::str>(item)) {
      members.push_back({nb::cast<std::string>(item), "", 1.0});
    } else if (nb::isinstance<nb::dict>(item)) {
      nb::dict d = nb::borrow<nb::dict>(item);
      if (!d.contains("target")) throw nb::type_error("a member dict needs 'target'");
      for (auto [key, value] : d) {
        const bool known = nb::isinstance<nb::str>(key) &&
                           (nb::cast<std::string>(key) == "target" ||
                            nb::cast<std::string>(key) == "identity" ||
                            nb::cast<std::string>(key) == "weight");
        if (!known) {
          throw nb::value_error(
              nb::str("a member dict takes 'target', 'identity' and 'weight'; not {!r}")
                  .format(key)
                  .c_str());
        }
      }
      auto text = [&](const char* field) {
        nb::handle value = d[field];
        if (!nb::isinstance<nb::str>(value)) {
          throw nb::type_error(nb::str("a member dict's '{}' must be a str, not {!r}")
                                   .format(field, value)
                                   .c_str());
        }
        return nb::cast<std::string>(value);
      };
      MemberTarget m{text("target"), "", 1.0};
      if (d.contains("identity")) m.identity = text("identity");
      if (d.contains("weight")) {
        nb::handle value = d["weight"];
        // A number (numpy's too: anything with __float__), but not a bool or a string.
        if (nb::isinstance<nb::bool_>(value) || nb::isinstance<nb::str>(value) ||
            !nb::hasattr(value, "__float__")) {
          throw nb::type_error(
              nb::str("a member dict's 'weight' must be a number, not {!r}").format(value).c_str());
        }
        m.weight = nb::cast<double>(nb::float_(value));
      }
      members.push_back(std::move(m));
    } else {
      throw nb::type_error("each member is 'host:port' or a dict with 'target'");
    }
  }
  return members;
}

// What errors name: the target, or the members' targets joined by ','.
std::string TargetName(const std::vector<MemberTarget>& members) {
  std::vector<std::string> targets;
  for (const MemberTarget& m : members) targets.push_back(m.target);
  return absl::StrJoin(targets, ",");
}

nb::list MembersList(const std::vector<MemberTarget>& members) {
  nb::list out;
  for (const MemberTarget& m : members) {
    nb::dict d;
    d["target"] = m.target;
    d["identity"] = m.identity;
    d["weight"] = m.weight;
    out.append(d);
  }
  return out;
}

nb::dict ClientKeywords(const ClientOptions& options) {
  nb::dict d;
  d["max_attempts"] = options.max_attempts;
  d["initial_backoff"] = absl::ToDoubleSeconds(options.initial_backoff);
  d["max_backoff"] = absl::ToDoubleSeconds(options.max_backoff);
  d["attempt_timeout"] = absl::ToDoubleSeconds(options.attempt_timeout);
  d["connect_timeout"] = absl::ToDoubleSeconds(options.connect_timeout);
  d["max_message_bytes"] = options.max_message_bytes;
  d["chunk_bytes"] = options.chunk_bytes;
  d["max_chunks_in_flight"] = options.max_chunks_in_flight;
  d["data_plane"] = DataPlaneName(options.data_plane);
  d["token"] = options.token;
  d["tls"] = options.tls;
  d["tls_root_ca"] = options.tls_root_ca_file;
  d["tls_cert"] = options.tls_cert_file;
  d["tls_key"] = options.tls_key_file;
  d["tls_server_name"] = options.tls_server_name;
  d["lease_holder"] = options.lease_holder;
  d["lease_job"] = options.lease_job;
  d["lease_takeover"] = options.lease_takeover;
  d["reconnect_timeout"] = absl::ToDoubleSeconds(options.reconnect_timeout);
  d["members_from_dns"] = options.members_from_dns;
  return d;
}

std::string Repr(const GroupInfo& g) {
  const Hyperparameters& h = g.hyperparameters;
  return absl::StrCat("GroupInfo(name='", g.name, "', num_elements=", g.num_elements, ", lr=", h.lr,
                      ", betas=(", h.beta1, ", ", h.beta2, "), eps=", h.eps,
                      ", weight_decay=", h.weight_decay, ", page_elements=", g.page_elements,
                      ", min_step=", g.min_step, ", max_step=", g.max_step,
                      ", created=", g.created ? "True" : "False", ")");
}

}  // namespace
}  // namespace optstate::python

NB_MODULE(_optstate, m) {
  using namespace optstate;
  using namespace optstate::python;
  m.doc() = "Bindings of the optstate C++ client; use the optstate package, not this module.";
  RememberMainThread();  // Ctrl-C is seen on Python's main thread only (SignalArrived).

  nb::enum_<WireType> wire_type(m, "WireType",
                                "An element type as it travels (optstate/dtype.h): a buffer's "
                                "dtype, and Client.step's wire_dtype.");
  for (WireType type : kWireTypes) wire_type.value(std::string(WireTypeName(type)).c_str(), type);

  nb::class_<GroupInfo> group_info(m, "GroupInfo",
                                   "A group as the daemon describes it: size, hyperparameters, "
                                   "page size and the steps its pages have reached.");
  group_info.def_ro("name", &GroupInfo::name).def_ro("num_elements", &GroupInfo::num_elements);
  DefHyperparameterProperties(group_info);
  group_info
      .def_ro("page_elements", &GroupInfo::page_elements, "Chunks start on multiples of this.")
      .def_ro("min_step", &GroupInfo::min_step, "Every page has reached at least this step.")
      .def_ro("max_step", &GroupInfo::max_step, "The highest step any page has reached.")
      .def_ro("created", &GroupInfo::created,
              "From register(): False when an equal group already existed.")
      .def_prop_ro("lease", &LeaseObject,
                   "The job holding the group (docs/jobs.md): a dict of holder, job, host, pid,\n"
                   "last_call_unix_micros, expires_unix_micros and expired; None: no lease.")
      .def_prop_ro("last_step", &LastStepObject,
                   "What the last applied step used: a dict of step, lr, betas, eps,\n"
                   "weight_decay and maximize; None: not stepped since the daemon registered,\n"
                   "imported or restored the group.")
      .def_ro("member", &GroupInfo::member,
              "With several daemons: the identity of the one that holds the group; '' with one.")
      .def_ro("moved_to", &GroupInfo::moved_to,
              "Set while the group is sealed for a move to that daemon (a rebalance under way).")
      .def_ro("tenant", &GroupInfo::tenant,
              "The owning tenant, in answers to an admin tenant (docs/security.md); ''\n"
              "otherwise (and for a group of no tenant).")
      .def("__repr__", &Repr);

  // Client()'s keyword defaults are a default ClientOptions' (client.h).
  const nb::dict default_keywords = ClientKeywords(ClientOptions{});
  auto option = [&](const char* name) -> nb::object { return default_keywords[name]; };
  m.def(
      "_default_client_options", [] { return ClientKeywords(ClientOptions{}); },
      "Client()'s keyword defaults: a default optstate::ClientOptions' (client.h).");

  nb::class_<PyClient> client(
      m, "Client",
      "A connection to one optstated daemon. Thread-safe; every call releases the GIL while it\n"
      "waits for the network. Errors raise optstate.Error subclasses (optstate.NotFound, ...)\n"
      "carrying the gRPC code, the daemon's message and the target.");
  client
      .def(
          "__init__",
          [](PyClient* self, const TargetArg& target_arg, int max_attempts, double initial_backoff,
             double max_backoff, double attempt_timeout, double connect_timeout,
             int max_message_bytes, uint64_t chunk_bytes, int max_chunks_in_flight,
             const std::string& data_plane, const std::string& token, bool tls,
             const std::string& tls_root_ca, const std::string& tls_cert,
             const std::string& tls_key, const std::string& tls_server_name,
             const std::string& lease_holder, const std::string& lease_job,
             const std::string& lease_takeover, double reconnect_timeout, bool members_from_dns) {
            ClientOptions options;
            options.members_from_dns = members_from_dns;
            options.data_plane = ParseDataPlane(data_plane);
            options.max_attempts = max_attempts;
            options.initial_backoff = Seconds(initial_backoff, "initial_backoff");
            options.max_backoff = Seconds(max_backoff, "max_backoff");
            options.attempt_timeout = Seconds(attempt_timeout, "attempt_timeout");
            options.connect_timeout = Seconds(connect_timeout, "connect_timeout");
            options.max_message_bytes = max_message_bytes;
            options.chunk_bytes = chunk_bytes;
            options.max_chunks_in_flight = max_chunks_in_flight;
            options.token = token;
            options.tls = tls;
            options.tls_root_ca_file = tls_root_ca;
            options.tls_cert_file = tls_cert;
            options.tls_key_file = tls_key;
            options.tls_server_name = tls_server_name;
            options.lease_holder = lease_holder;
            options.lease_job = lease_job;
            options.lease_takeover = lease_takeover;
            options.reconnect_timeout = reconnect_timeout == 0
                                            ? absl::ZeroDuration()
                                            : Seconds(reconnect_timeout, "reconnect_timeout");
            options.interrupted = SignalArrived;
            std::vector<MemberTarget> members = MemberTargetsOf(target_arg);
            const std::string target = TargetName(members);
            absl::StatusOr<std::unique_ptr<Client>> connected =
                nb::isinstance<nb::str>(target_arg) && !members_from_dns
                    ? Client::Connect(members[0].target, options)
                    : Client::Connect(members, options);
            ThrowIfError(connected.status(), target);
            new (self) PyClient{target, std::shared_ptr<Client>(*std::move(connected))};
          },
          "target"_a, nb::kw_only(), "max_attempts"_a = option("max_attempts"),
          "initial_backoff"_a = option("initial_backoff"), "max_backoff"_a = option("max_backoff"),
          "attempt_timeout"_a = option("attempt_timeout"),
          "connect_timeout"_a = option("connect_timeout"),
          "max_message_bytes"_a = option("max_message_bytes"),
          "chunk_bytes"_a = option("chunk_bytes"),
          "max_chunks_in_flight"_a = option("max_chunks_in_flight"),
          "data_plane"_a = option("data_plane"), "token"_a = option("token"),
          "tls"_a = option("tls"), "tls_root_ca"_a = option("tls_root_ca"),
          "tls_cert"_a = option("tls_cert"), "tls_key"_a = option("tls_key"),
          "tls_server_name"_a = option("tls_server_name"),
          "lease_holder"_a = option("lease_holder"), "lease_job"_a = option("lease_job"),
          "lease_takeover"_a = option("lease_takeover"),
          "reconnect_timeout"_a = option("reconnect_timeout"),
          "members_from_dns"_a = option("members_from_dns"),
          "Creates a channel to `target` (\"host:port\"); does not wait for the daemon.\n"
          "Several daemons (docs/scale-out.md): `target` a list of \"host:port\" strings, or\n"
          "of dicts {target, identity, weight}; each group lives on the daemon rendezvous\n"
          "hashing ranks first. `members_from_dns`: one DNS name whose addresses are the\n"
          "daemons (a Kubernetes headless Service).\n\n"
          "Transient failures (UNAVAILABLE, broken streams, deadlines) are retried up to\n"
          "`max_attempts` times with backoff doubling from `initial_backoff` to `max_backoff`\n"
          "seconds; `attempt_timeout` (seconds, float('inf') for none) bounds one attempt,\n"
          "`connect_timeout` (seconds) one connection attempt (a listener that never answers\n"
          "fails after it, naming the target).\n"
          "`chunk_bytes` is the gradient bytes per Step message, `max_chunks_in_flight` the\n"
          "messages sent ahead of their replies. `data_plane`: 'auto' (the default: shared memory\n"
          "with a daemon on this host that offers it, else the wire), 'wire', or\n"
          "'shared_memory' (FailedPrecondition when it cannot be had). InvalidArgument for\n"
          "bad options.\n\n"
          "Security (docs/security.md): `token` is sent with every call as 'authorization:\n"
          "Bearer TOKEN' (empty: the OPTSTATE_TOKEN environment variable's). The channel is TLS\n"
          "when `tls` is True or a file is given: `tls_root_ca` (PEM roots of the daemon's\n"
          "certificate; empty: the system's), `tls_cert` and `tls_key` (this client's, for\n"
          "mTLS), `tls_server_name` (the name the daemon's certificate must carry).\n\n"
          "Jobs (docs/jobs.md): with `lease_holder` (an id the ranks of one job share), steps,\n"
          "imports and deletes take and renew the lease on their groups, and another holder's\n"
          "are refused (optstate.FailedPrecondition naming it); `lease_job` names the job.\n"
          "`lease_takeover` breaks another's lease: 'expired=ID' once it expired, 'dead=ID' at\n"
          "once (several, space-separated, break several). `reconnect_timeout` (seconds): how long "
          "a call waits for a daemon that went\n"
          "away (restarting) before it fails Unavailable; 0: max_attempts alone.")
      .def_prop_ro(
          "target", [](const PyClient& c) { return c.target; },
          "The daemon's address (several daemons: their targets joined by ',').")
      .def_prop_ro(
          "members", [](const PyClient& c) { return MembersList(c.live()->Members()); },
          "The daemons: a list of dicts {target, identity, weight} (one for one daemon).")
      .def(
          "member_of",
          [](const PyClient& c, const std::string& group) { return c.live()->MemberOf(group); },
          "group"_a, "The identity of the daemon that holds (or would hold) `group`.")
      .def(
          "rebalance",
          [](PyClient& self, const TargetArg& targets, nb::object before_each) {
            std::vector<MemberTarget> members = MemberTargetsOf(targets);
            RebalanceOptions options;
            if (!before_each.is_none()) {
              options.before_each = [before_each](const std::string& what) {
                nb::gil_scoped_acquire acquire;
                before_each(what);
              };
            }
            std::shared_ptr<Client> live = self.live();
            absl::StatusOr<RebalanceResult> result;
            {
              nb::gil_scoped_release release;
              result = live->Rebalance(members, options);
            }
            ThrowIfError(result.status(), self.target);
            self.target = TargetName(members);
            nb::dict d;
            d["moved"] = result->moved;
            d["copies_deleted"] = result->copies_deleted;
            d["untouched"] = result->untouched;
            nb::list left;
            for (const std::string& name : result->left) left.append(name);
            d["left"] = left;
            nb::list log;
            for (const std::string& line : result->log) log.append(line);
            d["log"] = log;
            return d;
          },
          "targets"_a, nb::kw_only(), "before_each"_a = nb::none(),
          "Moves every group whose daemon changes with the new member list `targets` (as for\n"
          "Client(target=[...])): export from its current copy (sealed there) and import into\n"
          "its new daemon, group by group; then a checkpoint of each new daemon that keeps\n"
          "them (--state_dir); then delete the old copies. Call it between steps. After\n"
          "a crash, call it again: it finishes the moves (docs/scale-out.md). `before_each(what)`\n"
          "is called before each action. Groups another job leases are left where they are\n"
          "(for its own rebalance), or, on a daemon that leaves, refuse it before anything\n"
          "moves. Returns {moved, copies_deleted, untouched, left, log}.")
      .def(
          "register",
          [](PyClient& self, const std::string& name, BufferOrCountArg initial_values, double lr,
             std::tuple<double, double> betas, double eps, double weight_decay, bool maximize,
             bool amsgrad) {
            const Hyperparameters h =
                MakeHyperparameters(lr, betas, eps, weight_decay, maximize, amsgrad);
            absl::StatusOr<GroupInfo> info;
            if (PyLong_Check(initial_values.ptr())) {
              uint64_t n = 0;
              if (!nb::try_cast<uint64_t>(initial_values, n)) {  // Negative, or past 2^64.
                throw nb::value_error(
                    absl::StrCat("initial_values: an element count must be a whole number from "
                                 "1 to 2^64 - 1, got ",
                                 nb::cast<std::string>(nb::str(initial_values)))
                        .c_str());
              }
              const std::shared_ptr<Client> live = self.live();
              nb::gil_scoped_release release;
              info = live->RegisterGroup(name, n, h);
            } else {
              HostBuffer values = ViewHostBuffer(initial_values, "initial_values", false);
              if (values.type != WireType::kFloat32) {
                throw nb::type_error(
                    absl::StrCat("initial_values: dtype ", WireTypeName(values.type),
                                 " is not supported; the daemon's master weights are float32, "
                                 "pass the float32 widening")
                        .c_str());
              }
              const std::shared_ptr<Client> live = self.live();
              nb::gil_scoped_release release;
              info = live->RegisterGroup(name, values.floats(), h);
            }
            ThrowIfError(info.status(), self.target);
            return *std::move(info);
          },
          "name"_a, "initial_values"_a, nb::kw_only(), "lr"_a = kDefaultHyperparameters.lr,
          "betas"_a = Betas(kDefaultHyperparameters), "eps"_a = kDefaultHyperparameters.eps,
          "weight_decay"_a = kDefaultHyperparameters.weight_decay,
          "maximize"_a = kDefaultHyperparameters.maximize,
          "amsgrad"_a = kDefaultHyperparameters.amsgrad,
          "Registers group `name` with torch.optim.AdamW's hyperparameters.\n\n"
          "`initial_values` is a float32 array (any shape; its elements in order) or an\n"
          "element count (params start at zero). Idempotent: an equal existing group is\n"
          "returned with created=False and its trained pages are never rewound.\n"
          "AlreadyExists when a group of that name differs in size or hyperparameters.")
      .def(
          "describe",
          [](PyClient& self, const std::string& name, std::optional<std::string> tenant) {
            absl::StatusOr<GroupInfo> info;
            {
              const std::shared_ptr<Client> live = self.live();
              nb::gil_scoped_release release;
              info = live->DescribeGroup(name, tenant);
            }
            ThrowIfError(info.status(), self.target);
            return *std::move(info);
          },
          "name"_a, nb::kw_only(), "tenant"_a = nb::none(),
          "The group's GroupInfo; NotFound when there is none. `tenant`, for an admin\n"
          "tenant's client (docs/security.md): the group's owner ('' for a group of no\n"
          "tenant); None, the caller's own. Another caller naming a tenant not its own gets\n"
          "NotFound.")
      .def(
          "list_groups",
          [](PyClient& self) {
            absl::StatusOr<std::vector<GroupInfo>> groups;
            {
              const std::shared_ptr<Client> live = self.live();
              nb::gil_scoped_release release;
              groups = live->ListGroups();
            }
            ThrowIfError(groups.status(), self.target);
            return *std::move(groups);
          },
          "Every group of this tenant, as GroupInfo.")
      .def(
          "delete",
          [](PyClient& self, const std::string& name, std::optional<std::string> tenant) {
            absl::Status status;
            {
              const std::shared_ptr<Client> live = self.live();
              nb::gil_scoped_release release;
              status = live->DeleteGroup(name, tenant);
            }
            ThrowIfError(status, self.target);
          },
          "name"_a, nb::kw_only(), "tenant"_a = nb::none(),
          "Deletes the group and frees its memory. Made once, never retried (after a lost\n"
          "reply a retry could not tell 'deleted now' from NotFound); NotFound when absent.\n"
          "A daemon that is restarting is first waited for, up to reconnect_timeout.\n"
          "`tenant` as describe()'s: an admin deletes another tenant's group by naming it.")
      .def(
          "wait_until_reachable",
          [](PyClient& self, double timeout) {
            const absl::Duration limit = Seconds(timeout, "timeout");
            absl::Status status;
            {
              const std::shared_ptr<Client> live = self.live();
              nb::gil_scoped_release release;
              status = live->WaitUntilReachable(limit);
            }
            ThrowIfError(status, self.target);
          },
          "timeout"_a,
          "Waits until the daemon answers the connection, up to `timeout` seconds;\n"
          "optstate.Unavailable, naming the target, when it did not. With several daemons,\n"
          "optstate.InvalidArgument when two members are one daemon.")
      .def(
          "close", [](PyClient& self) { self.client.reset(); },
          "Closes the connection (idempotent). Calls still running finish first; later calls\n"
          "raise ValueError. The daemon's groups stay (delete() removes one).")
      .def_prop_ro(
          "closed", [](const PyClient& c) { return c.client == nullptr; },
          "True once close() was called.")
      .def(
          "__enter__", [](nb::object self) { return self; },
          "The client itself: `with optstate.Client(target) as c:` closes it at the end.")
      .def(
          "__exit__",
          [](PyClient& self, nb::args) {
            self.client.reset();
            return false;
          },
          "Closes the client; never swallows the exception.")
      .def("__repr__", [](const PyClient& c) {
        return absl::StrCat("optstate.Client('", c.target, "'", c.client ? "" : ", closed", ")");
      });

  BindStepAndStats(client);
  BindSharedBuffer(client);
  BindState(m, client);
  BindPreparedStep(m);
}
