// The optstate client: register parameter groups on an optstated daemon and
// step them, with chunking, pipelining, deadlines and exactly-once retries.
#ifndef OPTSTATE_CLIENT_H_
#define OPTSTATE_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "optstate/buffer_view.h"
#include "optstate/dtype.h"
#include "optstate/group_info.h"
#include "optstate/shared_buffer.h"
#include "optstate/stats.h"

namespace optstate {

// How Step moves gradients and params (docs/architecture.md, "The
// same-host data plane").
enum class DataPlane {
  // Shared memory when the daemon offers a region socket that this process
  // can reach and that is the same daemon's (so: on its host), else the wire.
  kAuto,
  kWire,  // Every byte through gRPC.
  // Shared memory or nothing: Step fails with FAILED_PRECONDITION, saying
  // why, when the daemon offers no region socket or it cannot be used.
  kSharedMemory,
};

struct ClientOptions {
  // Attempts per call, the first included (DeleteGroup: one); only
  // transient failures (UNAVAILABLE, broken or cancelled streams,
  // deadlines) are retried.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);  // Doubles per retry...
  absl::Duration max_backoff = absl::Seconds(2);            // ...up to this.
  // Deadline of one attempt; positive. absl::InfiniteDuration() for none.
  absl::Duration attempt_timeout = absl::Minutes(5);
  // How long one connection attempt may take, TCP and HTTP/2 handshake
  // together (gRPC's min connect timeout, 20 s by default there); positive,
  // at least 100 ms. A listener that accepts but never answers fails each
  // attempt after this long (UNAVAILABLE, naming the target) instead of 20 s.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Largest request or reply; at least 1 MiB + 4 KiB (one float32 page of
  // the daemon's default size, and the other fields).
  int max_message_bytes = 64 << 20;
  // Target gradient bytes per chunk (rounded to whole pages, at least one).
  uint64_t chunk_bytes = 1 << 20;
  // Messages written but not yet answered, per Step call (a message carries
  // one chunk, or several small ones packed up to chunk_bytes).
  int max_chunks_in_flight = 8;
  // Chosen at the first Step and kept. With shared memory the client holds
  // one region (a sealed memfd shared with the daemon), lays each group's
  // gradient and params out in it once, when first stepped, and per step
  // copies the caller's gradient into it once (narrowed to the wire type)
  // and the params out of it once (widened into params_out), unless they
  // lie in a SharedBuffer (AllocateSharedBuffer): then nothing is copied.
  // Step's contract is the same on both planes, and the daemon's results
  // are bit-identical. Shared-memory steps of one Client run one at a time.
  // The region holds the groups the client stepped recently, gradient and
  // params at up to 4 bytes per element each; it is replaced by one of
  // max(1 MiB, 2 x that) when a new group does not fit
  // (docs/decisions.md, "How big a client's region gets").
  // kAuto by default: shared memory with a daemon on this host that offers
  // it, else the wire.
  DataPlane data_plane = DataPlane::kAuto;

  // Security (docs/security.md).
  // The bearer token, sent with every call as 'authorization: Bearer TOKEN'
  // and to the region socket; empty: the OPTSTATE_TOKEN environment
  // variable's at Connect, if set, else none.
  std::string token;
  // TLS: the channel is TLS when `tls` is true or any file below is given.
  // tls_root_ca_file: PEM roots that sign the daemon's certificate (empty:
  // the system's). tls_cert_file and tls_key_file: this client's PEM
  // certificate and key, for a daemon that requires them (mTLS).
  // tls_server_name: the name the daemon's certificate must carry (empty:
  // the target's host name).
  bool tls = false;
  std::string tls_root_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;

  // Jobs and leases (docs/jobs.md). With lease_holder set, every call says
  // who makes it ('optstate-lease' metadata): the Steps, ImportStates and
  // DeleteGroups of this client take and renew the lease on their groups,
  // and another holder's are refused (FAILED_PRECONDITION naming it). The
  // ranks of one job share one holder id. Empty: the calls hold no lease
  // (and are refused on a group another holds, until its lease expires).
  // lease_job names the job for others to read (its name prefix); the host
  // and pid are this process's.
  std::string lease_holder;
  std::string lease_job;
  // Break another holder's lease: "expired=ID" once ID's lease expired,
  // "dead=ID" at once (this caller knows ID's process is gone); up to 16
  // such, separated by spaces (a job whose groups two gone trainers hold).
  // Empty: none.
  std::string lease_takeover;
  // How long a call waits for a daemon that is not there (restarting)
  // before it fails UNAVAILABLE: its attempts go on, with backoff, until
  // this long after the first failed one, beyond max_attempts.
  // Zero: max_attempts alone bounds them.
  absl::Duration reconnect_timeout = absl::ZeroDuration();
  // Asked about every 100 ms while a call waits for a daemon: between its
  // attempts (backoff, the wait for a connection while reconnect_timeout
  // runs) and in WaitUntilReachable, on the thread that called. With several
  // daemons, the calling thread asks it while the members' calls run on
  // threads of their own, and their waits end once it has said so. True ends
  // the call at once with CANCELLED ("interrupted ..."). An attempt under
  // way is not asked: it ends by itself or at attempt_timeout. The Python
  // Client sets it to see Ctrl-C. Empty: never asked.
  std::function<bool()> interrupted;

  // Several daemons (docs/scale-out.md): with one target given, resolve it
  // (a DNS name of several addresses: a Kubernetes headless Service) at
  // Connect and make each address a member, named by its reverse-DNS name
  // (a StatefulSet pod's) where it has one, else by "IP:PORT".
  bool members_from_dns = false;
};

// One daemon of a client of several (docs/scale-out.md).
struct MemberTarget {
  std::string target;    // Where to connect ("host:port").
  std::string identity;  // What placement hashes; empty: the target.
  double weight = 1.0;   // Relative capacity, finite and > 0.
};

// What a Step of several daemons did: the groups that stepped, and those
// that did not, each with its daemon and why. Retry the step with the
// groups of `failed` alone (resending the others would be answered from the
// daemons' replay, never applied twice, but costs their bytes again).
struct StepReport {
  struct Failure {
    std::string group;
    std::string member;  // The daemon's identity (the target with one daemon).
    absl::Status status;
  };
  std::vector<std::string> stepped;
  std::vector<Failure> failed;
};

struct RebalanceOptions {
  // Called before each action, in order (a test stops the process at one).
  // `what` is "export NAME from ID to ID", "import NAME into ID",
  // "checkpoint ID" (an owner made durable before old copies go) or
  // "delete NAME from ID".
  std::function<void(const std::string& what)> before_each;
};

struct RebalanceResult {
  // Groups moved to their new owner, or exported and imported in place to
  // unseal a copy a killed Rebalance had sealed on the owner.
  uint64_t moved = 0;
  uint64_t copies_deleted = 0;  // Stale or finished-move copies removed.
  uint64_t untouched = 0;       // Groups already on their owner alone.
  // Groups another job leases, left where they are (on a daemon that stays)
  // for that job's own Rebalance.
  std::vector<std::string> left;
  std::vector<std::string> log;  // Every action, as passed to before_each.
};

// One group's part of a step: its whole gradient, and where the updated
// params go (same length; empty to discard them). Each buffer is float32 or
// a 16-bit type (ConstBufferView::Of16Bit, BufferView::Of16Bit):
// - a float32 gradient is narrowed to StepOptions::gradient_dtype on the wire;
//   a 16-bit one must be of that dtype and is sent as it is;
// - a float32 params_out gets the params widened from StepOptions::param_dtype;
//   a 16-bit one must be of that dtype and receives them as they arrive.
struct GroupStep {
  std::string group;
  ConstBufferView gradient;
  BufferView params_out;
  // This group's lr for this step, over StepOptions::lr and the group's own
  // (a trainer whose parameter groups follow their own schedules steps them
  // all in one call).
  std::optional<double> lr = std::nullopt;
  // This group's other hyperparameters for this step, where they differ
  // from its registered ones (torch reads them from param_groups at every
  // step: a schedule of betas or weight decay); unset: the group's. The
  // bias corrections use this step's betas. The daemon checks them as at
  // registration (INVALID_ARGUMENT naming the field).
  std::optional<double> beta1 = std::nullopt;
  std::optional<double> beta2 = std::nullopt;
  std::optional<double> eps = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  std::optional<bool> maximize = std::nullopt;
};

struct StepOptions {
  WireType gradient_dtype = WireType::kFloat32;  // Gradients are narrowed to it on the wire.
  WireType param_dtype = WireType::kFloat32;     // Params come back in it (GroupStep::params_out).
  std::optional<double> lr;  // Overrides the groups' lr for this step (unless GroupStep::lr).
  std::optional<float> grad_scale;  // Multiplied into every gradient.
  // The caller has checked every gradient finite after grad_scale, in
  // gradient_dtype (a finite clip_grad_norm_ or GradScaler's found_inf == 0
  // show it). On the shared-memory plane the client then does not read
  // gradients that lie in SharedBuffers only to check them, and the daemon
  // checks each chunk of at most 1 MiB of gradient (a group of up to 256 Ki
  // fp32 elements) as it applies it, while it is in cache, instead of all
  // before any (StepRequest.gradients_checked): a step of SharedBuffers then
  // reads those gradients once, not twice (a larger group goes in chunks of
  // whole pages of at most 1 MiB). A gradient that is not finite after all
  // is still refused (INVALID_ARGUMENT) and its chunk (its group, or that
  // part of a larger one) left as it was, but other chunks of the step may
  // have been applied by then (the refusal says so; repeating the step with
  // the gradient fixed replays them and applies the rest). On the wire it
  // changes nothing (the client checks every gradient as it narrows it into
  // the messages). False: a step with any non-finite gradient is refused
  // whole, nothing applied.
  bool gradients_checked = false;
};

// Thread-safe: one Client may serve many threads; each call is independent.
class Client {
 public:
  // Creates a channel to `target` ("host:port", or "unix:/path" for a daemon
  // listening on a Unix socket); does not wait for the server.
  // INVALID_ARGUMENT for bad options, an empty target or one with an http
  // scheme.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         const ClientOptions& options = {});
  // A client of several daemons (docs/scale-out.md): each group lives on the
  // member that rendezvous hashing of (group name, member identity) ranks
  // first; calls naming a group go to its member, ListGroups, GetStats,
  // Checkpoint and RewindJob to all, and Step runs one stream per member in
  // parallel. One target: the same as Connect(target). INVALID_ARGUMENT for
  // no targets, a repeated identity or a weight that is not finite and > 0.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::vector<std::string>& targets,
                                                         const ClientOptions& options = {});
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::vector<MemberTarget>& members,
                                                         const ClientOptions& options = {});
  // The members, in the order given (one entry, with the target as its
  // identity, for a client of one daemon).
  std::vector<MemberTarget> Members() const;
  // The identity of the member that holds (or would hold) `group`.
  std::string MemberOf(const std::string& group) const;

  // Moves every group whose owner changes to `members` (called between
  // steps, by one process of the job): for each, ExportState from the copy
  // that is current (the highest page steps; ExportStateRequest.moved_to
  // seals it there first, so it cannot step on), ImportState into the new
  // owner; then each owner with a --state_dir writes a checkpoint, and only
  // then are the old copies deleted (DeleteGroup). A crash of any daemon at
  // any point, the owners included once the Rebalance returned, leaves every
  // group whole on at least one member (restored from its checkpoint; an
  // owner without --state_dir keeps nothing over a crash), and the next
  // Rebalance finishes the move (or, given the old list back, undoes it):
  // it finds the copies by listing every old and new member, keeps the one
  // with the highest (max_step, min_step), preferring on a tie one not
  // sealed, then the owner's, and deletes the rest. Afterwards this
  // client uses `members`. A daemon that cannot be listed stops it before
  // anything moves (UNAVAILABLE naming it); a failed action stops it there
  // (call it again).
  absl::StatusOr<RebalanceResult> Rebalance(const std::vector<MemberTarget>& members,
                                            const RebalanceOptions& options = {});

  // Waits until the channel is connected, up to `timeout`: UNAVAILABLE
  // saying so when no daemon answered by then, with gRPC's reason from one
  // more call of up to 2 s (a connection refused, a TLS handshake that
  // failed, with what that means) (a trainer's first check that its target
  // is right, before it registers anything). With several
  // daemons, each within what is left of `timeout`, then asks each (within what is left of
  // `timeout`) which daemon it is: INVALID_ARGUMENT naming two members that are one daemon.
  absl::Status WaitUntilReachable(absl::Duration timeout);
  ~Client();

  // Registers `name` with these initial values (all of it, any size) and
  // hyperparameters. Idempotent: an equal existing group is returned with
  // created=false and its trained pages are never rewound. ALREADY_EXISTS
  // when a group of that name differs in size or hyperparameters;
  // INVALID_ARGUMENT for a name that is not 1 to 512 printable ASCII
  // characters without spaces, no values, a value that is not finite, or
  // hyperparameters no AdamW takes; RESOURCE_EXHAUSTED when the group would
  // pass the daemon's --max_host_bytes; UNAVAILABLE (after the retries) when
  // the daemon cannot be reached.
  absl::StatusOr<GroupInfo> RegisterGroup(const std::string& name,
                                          absl::Span<const float> initial_values,
                                          const Hyperparameters& hyperparameters = {});
  // The same with params starting at zero (INVALID_ARGUMENT for 0 elements).
  absl::StatusOr<GroupInfo> RegisterGroup(const std::string& name, uint64_t num_elements,
                                          const Hyperparameters& hyperparameters = {});

  // Applies step `step` (1, 2, ...) to every listed group in one stream and
  // fills their params_out. Refuses the whole step, applying nothing, with
  // INVALID_ARGUMENT when a gradient is not finite (after grad_scale and
  // narrowing) or has the wrong length, a params_out has the wrong length, a
  // group is listed twice, or a 16-bit buffer's dtype is not the wire type
  // StepOptions gives it (GroupStep); nothing is sent then, except for a step
  // wholly in SharedBuffers, which goes as one message that the daemon
  // checks whole, and refuses, before applying any of it (with
  // StepOptions::gradients_checked, gradients in SharedBuffers are not read
  // here and a non-finite one refuses only its chunk: see there). On a
  // transient failure it resends every chunk of the step (a daemon that
  // restarted from a checkpoint meanwhile lost what it answered); the server
  // applies each page exactly once, so a retried or repeated step never
  // applies an element twice. When the step fails, params_out may hold the new params
  // of the chunks applied so far (a params_out in a SharedBuffer is written
  // by the daemon as it applies).
  // The daemon's refusals: NOT_FOUND for a group it does not hold (deleted,
  // or never registered); FAILED_PRECONDITION for a page that is not at
  // step - 1 or step (a step that skips ahead, or a replay of a step older
  // than the page's), or a page still awaiting its initial values; the
  // message names the group, page and steps. UNAVAILABLE (after the
  // retries, saying how many) when the daemon cannot be reached.
  // While it runs, a wire step holds up to 64 MiB of its gradient narrowed
  // to the wire type (ready to send, and to resend), beyond the caller's
  // buffers.
  absl::Status Step(absl::Span<const GroupStep> groups, uint64_t step,
                    const StepOptions& options = {});
  // The same for one group.
  absl::Status Step(const std::string& group, uint64_t step, ConstBufferView gradient,
                    BufferView params_out, const StepOptions& options = {});
  // The same, saying which groups stepped (`report`). With several daemons a
  // daemon that fails fails its groups only: the others' groups are stepped
  // and their params returned; the status is that daemon's (UNAVAILABLE when
  // any daemon was unreachable), its message names each failed daemon and
  // its first groups, and it carries all of them as the payload
  // kNotSteppedPayload (the group names, one per line).
  absl::Status Step(absl::Span<const GroupStep> groups, uint64_t step, const StepOptions& options,
                    StepReport* report);
  static constexpr const char* kNotSteppedPayload = "type.optstate.dev/not_stepped";

  // `bytes` (> 0) of memory shared with the daemon, registered as a region
  // of this client's (SharedBuffer says how Step uses it). Allocate one
  // buffer for many tensors: the daemon limits regions per client
  // (--max_regions_per_client, 16 by default; the client's own region takes
  // up to two) and bytes mapped (RESOURCE_EXHAUSTED past either).
  // FAILED_PRECONDITION when the client's data plane is the wire (kWire, or
  // kAuto without a usable region socket); the daemon's status (UNAVAILABLE)
  // when it cannot be asked. The buffer may outlive the Client (it is then
  // plain memory).
  absl::StatusOr<std::unique_ptr<SharedBuffer>> AllocateSharedBuffer(uint64_t bytes);

  // Read-only calls, retried like the others.
  // NOT_FOUND for a group the daemon does not hold. `tenant`, for an admin
  // tenant's client (docs/security.md): the owner of the group ("" for a
  // group of no tenant); unset, the caller's own. Any other caller naming a
  // tenant not its own gets NOT_FOUND.
  absl::StatusOr<GroupInfo> DescribeGroup(const std::string& name,
                                          const std::optional<std::string>& tenant = {});
  // Every group, by name, read page by page (ListGroupsRequest.page_token).
  absl::StatusOr<std::vector<GroupInfo>> ListGroups();
  // The daemon's counters for the caller's groups (Stats).
  absl::StatusOr<Stats> GetStats();
  // NOT_FOUND for a group the daemon does not hold; OK (nothing freed) for a
  // name of which it holds only a note of its move to another daemon, which
  // it forgets (proto: ExportStateRequest.moved_to). Made once, never
  // retried: after a lost reply a retry could not tell "deleted now" from
  // NOT_FOUND. Call it again to be sure. A daemon that is restarting is
  // first waited for, up to reconnect_timeout. `tenant` as DescribeGroup's.
  absl::Status DeleteGroup(const std::string& name, const std::optional<std::string>& tenant = {});

  // ---- Durability (docs/durability.md) ----

  // A group's whole optimizer state; what torch.optim.AdamW's state_dict holds
  // for one parameter (exp_avg, exp_avg_sq, step), plus the params themselves.
  struct GroupState {
    std::string name;
    Hyperparameters hyperparameters;
    uint64_t page_elements = 0;  // Set by ExportState; ignored by ImportState.
    std::vector<float> params, exp_avg, exp_avg_sq;
    // torch's state['max_exp_avg_sq']: as long as params when
    // hyperparameters.amsgrad, else empty.
    std::vector<float> max_exp_avg_sq;
    std::vector<uint64_t> page_steps;  // One per page of page_elements (the daemon's page size).
    // ImportState: take a diverged run's inf and NaN (see ImportState).
    // ExportState leaves it false.
    bool accept_non_finite = false;
  };
  // Reads the group's whole state in page-aligned chunks (any size; the
  // message limit never bites). Each page is read with its step under its
  // lock; pages stepped while the export runs may be at different steps.
  // NOT_FOUND for an unknown group. Retried like the read-only calls.
  absl::StatusOr<GroupState> ExportState(const std::string& name);
  // Creates the group from `state`, or replaces the whole state of an
  // existing group of the same size and hyperparameters (ALREADY_EXISTS when
  // it differs). page_steps: one per daemon page, or exactly one (every page
  // at that step). The group becomes visible to Step only once every piece
  // arrived and passed the daemon's checks; INVALID_ARGUMENT (nothing
  // changed) for tensors of different lengths, an exp_avg_sq or
  // max_exp_avg_sq below 0, a step of 2^64-1, a page_steps count that fits
  // neither, or a value that is not finite: params and exp_avg must be, the
  // squares may be +inf (a finite gradient's square can overflow float32).
  // With state.accept_non_finite, whatever a diverged run leaves is taken
  // (inf or NaN in params and exp_avg, NaN in the squares; a Rebalance moves
  // groups so). Retried on transient failures (a repeat installs the same
  // state).
  absl::Status ImportState(const GroupState& state);

  struct CheckpointRequestOptions {
    std::vector<std::string> groups;  // Empty: all.
    std::optional<uint64_t> wait_for_step;
  };
  struct CheckpointResult {
    std::string id;
    uint64_t step = 0;
    uint64_t bytes = 0;
  };
  // Asks the daemon (started with --state_dir) for a durable checkpoint of
  // every group. With wait_for_step s it returns once every page of `groups`
  // is at s and the checkpoint holding s is on disk: FAILED_PRECONDITION
  // (naming the step held) when a page is past s, DEADLINE_EXCEEDED when s is
  // not reached within ClientOptions::attempt_timeout, NOT_FOUND for an
  // unknown group. Made once, never retried (a daemon that is restarting is
  // first waited for, up to reconnect_timeout).
  absl::StatusOr<CheckpointResult> Checkpoint(const CheckpointRequestOptions& options = {});

  struct RewindResult {
    std::string checkpoint_id;
    uint64_t step = 0;                     // The job's stepped groups are at this step now.
    std::vector<std::string> groups;       // Those rewound.
    std::vector<std::string> passed_over;  // Newer checkpoints passed over, each with why.
    // The checkpoint the daemon wrote after the rewind, so that a restart
    // restores the rewound job; empty with validate_only, or when it failed:
    // then not_written says why (checkpoint before stepping on).
    std::string written_checkpoint_id;
    std::string not_written;
  };
  // Rewinds one job, this tenant's groups named `prefix` + ..., to the
  // newest checkpoint of the daemon's --state_dir that holds them at one step
  // (`step` when given), while the daemon goes on stepping every other job
  // (docs/jobs.md). Each group is leased to this client's lease_holder
  // afterwards. FAILED_PRECONDITION without --state_dir, for a live group of
  // the job that the checkpoint lacks, or another holder's lease; NOT_FOUND
  // when no checkpoint holds the job so. Made once, never retried (a daemon
  // that is restarting is first waited for, up to reconnect_timeout).
  // `validate_only`: every check, and the result the rewind would have
  // (groups: those it would rewind), changing nothing.
  //
  // A client of several daemons validates on every one first, and rewinds
  // none unless all would: to `step`, or without it to the step of the
  // daemons' newest checkpoints holding the job, the oldest of them where
  // they differ (FAILED_PRECONDITION naming each daemon's when not every
  // daemon holds that one). Should a daemon still refuse after every one
  // validated, the error names the daemons already rewound.
  absl::StatusOr<RewindResult> RewindJob(const std::string& prefix,
                                         std::optional<uint64_t> step = std::nullopt,
                                         bool validate_only = false);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  // The same calls on a client of several daemons (client_members.cc).
  absl::Status StepMembers(absl::Span<const GroupStep> groups, uint64_t step,
                           const StepOptions& options, StepReport* report);
  absl::StatusOr<std::vector<GroupInfo>> ListMembers();
  absl::StatusOr<Stats> StatsOfMembers();
  absl::StatusOr<CheckpointResult> CheckpointMembers(const CheckpointRequestOptions& options);
  absl::StatusOr<RewindResult> RewindMembers(const std::string& prefix,
                                             std::optional<uint64_t> step, bool validate_only);
  // Step on a client of one daemon (client_step.cc).
  absl::Status StepOneDaemon(absl::Span<const GroupStep> groups, uint64_t step,
                             const StepOptions& options);
  // The member client that holds `group` (with several daemons), else null.
  Client* OwnerClient(const std::string& group) const;
  // `status`, an answer of `group`'s member, naming that daemon ("daemon 'ID'
  // (TARGET): ..."); OK as it is.
  absl::Status InOwner(const std::string& group, const absl::Status& status) const;
  // This daemon's facts and totals (GetStats' first page of one group at
  // most): its instance_id, whether it has a state_dir, ... One attempt,
  // ending by `deadline` at the latest (and by the attempt_timeout).
  absl::StatusOr<Stats> DaemonFacts(absl::Time deadline = absl::InfiniteFuture());
  // Before a call made once (DeleteGroup, Checkpoint, RewindJob): with
  // reconnect_timeout set, one small call retried as the read-only calls are
  // (DescribeGroup of `group`; without one, GetStats of one group), so that
  // a daemon that is restarting, or a connection that broke unnoticed (the
  // channel still says READY), is ridden out before the call that must not
  // be sent twice. OK once the daemon answered anything but a transient
  // failure.
  absl::Status RideOutRestart(const std::string& group = "");
  // ExportState with ExportStateRequest.moved_to (Rebalance).
  absl::StatusOr<GroupState> ExportStateForMove(const std::string& name,
                                                const std::string& moved_to);
  // ImportState into this daemon, with this client's lease (taking it on
  // the group) only when `take_lease`: Rebalance moves a group no one leases
  // (its job's lease ended with a restart) without leasing it to the caller.
  absl::Status ImportStateForMove(const GroupState& state, bool take_lease);
  std::unique_ptr<Impl> impl_;
};

}  // namespace optstate

#endif  // OPTSTATE_CLIENT_H_
