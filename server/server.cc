// Server assembly and shutdown order: gRPC first (no new chunks), then the
// pool (finish the ones in flight), then backend and store.
#include "server/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/support/server_interceptor.h"
#include "optstate/message_limits.h"
#include "server/base/log.h"
#include "server/base/memory_limit.h"
#include "server/durability/checkpointer.h"
#include "server/kernels/adamw_kernel.h"
#include "server/metrics/daemon_metrics.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/port_check.h"
#include "server/rpc/call_metrics.h"
#include "server/rpc/grpc_log.h"
#include "server/rpc/protobuf_log.h"
#include "server/rpc/service.h"
#include "server/rpc/step_stream_metrics.h"

namespace optstate {

struct Server::Parts {
  std::unique_ptr<HeapTrimmer> trimmer;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<StepBackend> backend;
  std::unique_ptr<StateStore> store;
  std::unique_ptr<StepEngine> engine;
  std::unique_ptr<Checkpointer> checkpointer;  // Null without a state_dir.
  std::unique_ptr<Authenticator> authenticator;
  std::unique_ptr<DataPlaneAssembly> data_plane;
  std::unique_ptr<OptimizerStateService> service;
  // With metrics_listen only: what the interceptor and the Step streams
  // record, and the endpoint that serves it.
  std::unique_ptr<CallMetrics> call_metrics;
  std::unique_ptr<StepStreamMetrics> step_metrics;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  std::unique_ptr<grpc::Server> grpc_server;
  // With TLS: the checked copies the server's credentials read.
  std::unique_ptr<CheckedTlsFiles> tls_files;
  std::string backend_name;
  absl::Mutex mu;
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  absl::Notification done;
  // The final checkpoint's failure (set before `done`); OK without one.
  absl::Status final_checkpoint;

  ~Parts() {
    // Destroyed in dependency order: nothing may outlive what it points to.
    metrics_endpoint.reset();  // No scrape reads what goes next.
    grpc_server.reset();
    pool.reset();
    service.reset();
    checkpointer.reset();
    data_plane.reset();
    engine.reset();
    store.reset();
    authenticator.reset();  // After the store, which asks it for quotas.
    backend.reset();
    trimmer.reset();
    tls_files.reset();  // After the server, whose certificate watcher reads them.
  }
};

namespace {

// 80% of what this process may use: the host's memory, or its cgroup's limit
// where lower (a container's --memory: past it the kernel kills the daemon,
// where past --max_host_bytes a registration is refused).
uint64_t DefaultMaxHostBytes() {
  const uint64_t may_use = MemoryThisProcessMayUse();
  if (may_use == 0) return 8ull << 30;
  return may_use / 10 * 8;
}

// A tenth of what this process may use, at least 1 GiB: with the default
// --max_host_bytes (80%), what gRPC holds in messages stays within the rest.
uint64_t DefaultGrpcBufferBytes() {
  return std::max<uint64_t>(MemoryThisProcessMayUse() / 10, 1ull << 30);
}

// A unix: listen socket gets the permission bits asked for (gRPC creates it
// with the umask's).
absl::Status ApplyListenSocketMode(const ServerOptions& options) {
  // Any mode, 0000 too (no one but root may connect), as the region socket's.
  if (!absl::StartsWith(options.listen, "unix:")) return absl::OkStatus();
  std::string path = options.listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  if (chmod(path.c_str(), options.listen_socket_mode) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot set the mode of listen socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Takes gRPC's reflection plugin out of one server's builder: linking
// grpc++_reflection registers it for every server the process builds.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return plugin->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

// The services whose methods the call metrics name (any other call is
// counted as "other").
std::vector<std::string> ServedServices() {
  return {std::string(v1::OptimizerState::service_full_name()),
          std::string(v1::DataPlane::service_full_name()), "grpc.health.v1.Health",
          "grpc.reflection.v1alpha.ServerReflection"};
}

}  // namespace

absl::Status Server::StartMetrics(const std::string& listen, Parts& parts) {
  parts.call_metrics =
      std::make_unique<CallMetrics>(CallMetrics::MethodsOfServices(ServedServices()));
  parts.step_metrics = std::make_unique<StepStreamMetrics>();
  MetricsSources sources;
  sources.engine = parts.engine.get();
  sources.checkpointer = parts.checkpointer.get();
  sources.regions = parts.data_plane->registry();
  sources.trimmer = parts.trimmer.get();
  sources.calls = parts.call_metrics.get();
  sources.step_streams = parts.step_metrics.get();
  sources.authenticator = parts.authenticator.get();
  sources.started = absl::Now();  // The daemon starts serving within moments.
  if (parts.tls_files != nullptr) {
    const CheckedTlsFiles* files = parts.tls_files.get();
    sources.tls = [files] {
      const CheckedTlsFiles::Served served = files->served();
      TlsReading reading;
      reading.certificate_not_after_unix = served.not_after_unix;
      reading.files_refused = served.files_refused;
      return reading;
    };
  }
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(listen, std::make_shared<DaemonMetrics>(sources));
  if (!endpoint.ok()) return endpoint.status();
  parts.metrics_endpoint = std::move(*endpoint);
  Log(LogLevel::kInfo, "serving metrics at /metrics on ", listen, " (port ",
      parts.metrics_endpoint->port(), ")");
  return absl::OkStatus();
}

namespace {
constexpr int kMaxThreads = 1024;
constexpr uint64_t kMaxPageElements = uint64_t{1} << 28;
}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (options.threads < 0 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be 0 (one per core) to ",
                                                   kMaxThreads, ", got ", options.threads));
  }
  if (options.page_elements == 0 || options.page_elements % 64 != 0 ||
      options.page_elements > kMaxPageElements) {
    // The upper bound keeps a page's bytes within a message (an int) and
    // every product of it within 64 bits.
    return absl::InvalidArgumentError(
        absl::StrCat("--page_elements must be a positive multiple of 64, at most ",
                     kMaxPageElements, ", got ", options.page_elements));
  }
  if (options.heap_trim_interval < absl::ZeroDuration() ||
      (options.heap_trim_interval > absl::ZeroDuration() &&
       options.heap_trim_interval < absl::Seconds(1))) {
    // Shorter, its thread would look at the heap in a loop (1ns: a whole core).
    return absl::InvalidArgumentError(
        absl::StrCat("--heap_trim_interval must be 0 (trim only after deletes) or at least 1s, "
                     "got ",
                     absl::FormatDuration(options.heap_trim_interval)));
  }
  if (options.stream_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--stream_idle_timeout must not be negative");
  }
  KernelIsa cpu_kernel = CpuKernelIsa();
  if (options.cpu_kernel != "auto") {
    if (!ParseKernelIsa(options.cpu_kernel, &cpu_kernel)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cpu_kernel must be auto, avx512, avx2 or scalar, got '", options.cpu_kernel, "'"));
    }
    if (cpu_kernel > CpuKernelIsa()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cpu_kernel=", options.cpu_kernel, ": this CPU runs at most ",
                       KernelIsaName(CpuKernelIsa()), " (auto takes the widest path it runs)"));
    }
  }
  // A message must carry one page of float32 and the other fields: the
  // least a client can send, and the reply to it; and never less than 1 MiB
  // (kMinMessageBytes with the default page).
  const uint64_t min_message_bytes =
      std::max<uint64_t>(1 << 20, options.page_elements * sizeof(float) + kMessageFieldRoomBytes);
  if (options.max_message_bytes < 0 ||
      static_cast<uint64_t>(options.max_message_bytes) < min_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes must be at least ", min_message_bytes,
                     " (one page of float32 and room for the other fields)"));
  }
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles
  // (a graph lookup per lock: 1.3% of daemon CPU while stepping). Our lock
  // order is fixed by construction (pages ascending), so skip the check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (!options.auth.spiffe_trust_domain.empty() && options.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_trust_domain needs --tls_client_ca (tenants from client certificates)");
  }
  if (options.tenant_max_streams < 0) {
    return absl::InvalidArgumentError("--tenant_max_streams must be >= 0 (0: no limit)");
  }
  absl::StatusOr<ListenSecurity> security = ListenCredentials(options.listen, options.tls);
  if (!security.ok()) return security.status();
  auto parts = std::make_unique<Parts>();
  parts->tls_files = std::move(security->tls_files);
  {
    absl::StatusOr<std::unique_ptr<Authenticator>> authenticator =
        Authenticator::Create(options.auth);
    if (!authenticator.ok()) return authenticator.status();
    parts->authenticator = std::move(*authenticator);
  }
  int threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  parts->pool = std::make_unique<ThreadPool>(threads);
  absl::StatusOr<std::unique_ptr<StepBackend>> backend =
      CreateBackend(options.backend, parts->pool.get());
  if (!backend.ok()) return backend.status();
  parts->backend = std::move(*backend);
  parts->backend_name = std::string(parts->backend->name());
  const uint64_t max_host_bytes =
      options.max_host_bytes != 0 ? options.max_host_bytes : DefaultMaxHostBytes();
  if (max_host_bytes < kStateBytesPerElement) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_host_bytes=", max_host_bytes, " holds no group: each element takes ",
                     kStateBytesPerElement, " bytes (0: 80% of the memory this process may use)"));
  }
  if (const uint64_t may_use = MemoryThisProcessMayUse();
      may_use != 0 && max_host_bytes > may_use) {
    Log(LogLevel::kWarning, "--max_host_bytes=", max_host_bytes, " is more than the ", may_use,
        " bytes of memory this process may use: groups past that are not refused, and the "
        "kernel's OOM killer ends the daemon instead");
  }
  const uint64_t grpc_buffer_bytes =
      options.grpc_buffer_bytes != 0 ? options.grpc_buffer_bytes : DefaultGrpcBufferBytes();
  if (grpc_buffer_bytes < 2 * static_cast<uint64_t>(options.max_message_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc_buffer_bytes=", grpc_buffer_bytes, " is less than two messages of ",
                     "--max_message_bytes=", options.max_message_bytes,
                     ": a step's request and its reply could not both be held"));
  }
  parts->trimmer =
      std::make_unique<HeapTrimmer>(options.heap_trim_interval, options.heap_trim_slack_bytes);
  parts->store = std::make_unique<StateStore>(parts->backend.get(), max_host_bytes,
                                              options.page_elements, parts->trimmer.get());
  parts->engine =
      std::make_unique<StepEngine>(parts->store.get(), parts->backend.get(), parts->pool.get());
  // What can be refused is refused before the restore, which can take
  // minutes: a daemon in a crash loop would otherwise restore each time.
  if (options.lease_term <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the lease term (--lease_seconds) must be positive");
  }
  if (!options.metrics_listen.empty()) {
    // Each is free alone; the metrics would take it first and gRPC's own bind
    // would fail after the restore, saying only "in use or not valid".
    const auto port_of = [](const std::string& listen) -> std::string {
      const size_t colon = listen.rfind(':');
      return absl::StartsWith(listen, "unix:") || colon == std::string::npos
                 ? ""
                 : listen.substr(colon + 1);
    };
    const std::string port = port_of(options.listen);
    if (!port.empty() && port != "0" && port == port_of(options.metrics_listen)) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics_listen=", options.metrics_listen,
                                                     " and --listen=", options.listen,
                                                     " name the same port: give each its own"));
    }
  }
  if (absl::Status s = CheckPortFree("--listen", options.listen); !s.ok()) return s;
  if (!options.metrics_listen.empty()) {
    if (absl::Status s = CheckPortFree("--metrics_listen", options.metrics_listen); !s.ok()) {
      return s;
    }
  }
  if (!options.state_dir.empty()) {
    CheckpointerOptions checkpoints;
    checkpoints.state_dir = options.state_dir;
    checkpoints.interval = options.checkpoint_interval;
    checkpoints.keep = options.checkpoints_to_keep;
    checkpoints.buffer_bytes = options.checkpoint_buffer_bytes;
    // Restored before the service exists: nothing is served half-restored.
    absl::StatusOr<std::unique_ptr<Checkpointer>> checkpointer =
        Checkpointer::OpenAndRestore(checkpoints, parts->store.get(), parts->backend.get(),
                                     options.require_state, parts->pool.get());
    if (!checkpointer.ok()) return checkpointer.status();
    parts->checkpointer = std::move(*checkpointer);
  } else if (options.require_state) {
    return absl::InvalidArgumentError("--require_state needs --state_dir");
  } else if (options.checkpoint_interval > absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--checkpoint_interval needs --state_dir (where the checkpoints go)");
  }
  // Quotas hold from here: a restore gives every tenant back what it had.
  parts->store->SetTenantQuotas(parts->authenticator.get());
  parts->store->SetLeaseTerm(options.lease_term);
  absl::flat_hash_map<std::string, uint64_t> restored_groups;
  for (const std::shared_ptr<Group>& group : parts->store->ListAll()) {
    ++restored_groups[group->key().tenant];
  }
  // The same for every tenant: no count of other tenants' groups in it
  // (GetStats gives each tenant its own).
  parts->store->SetNotFoundNote(absl::StrCat(
      ". This optstated started at ",
      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()),
      options.state_dir.empty()
          ? " without --state_dir: its groups do not survive a restart"
          : absl::StrCat(" with --state_dir, restoring ",
                         restored_groups.empty() ? "no group (no checkpoint held one)"
                                                 : "its newest checkpoint",
                         " at start (GetStats.restored_groups: how many of your groups)")));
  parts->data_plane =
      std::make_unique<DataPlaneAssembly>(options.data_plane, parts->authenticator.get());
  if (!options.metrics_listen.empty()) {
    if (absl::Status s = StartMetrics(options.metrics_listen, *parts); !s.ok()) return s;
  }
  parts->service = std::make_unique<OptimizerStateService>(
      parts->engine.get(), static_cast<size_t>(options.max_message_bytes),
      options.stream_idle_timeout, parts->checkpointer.get(), parts->data_plane->registry(),
      parts->trimmer.get(), parts->step_metrics.get(), parts->authenticator.get(),
      options.tenant_max_streams, grpc_buffer_bytes);
  parts->service->SetRestoredGroups(restored_groups);

  // Referencing the compiled health.proto keeps it linked in, which puts its
  // descriptors in the pool: reflection can then describe grpc.health.v1 and
  // grpcurl can call Health/Check (gRPC 1.51's own health service cannot).
  grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(options.listen, security->credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second daemon on a taken port
  // would start, and the kernel would split connections between two
  // daemons with different state. Refuse to start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping every 20 s while a call is open (client/call/channel.cc),
  // so a connection whose peer is gone fails its calls; take those pings
  // without counting them as abuse.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // gRPC 1.51 inflates a compressed message whole before it checks the
  // message's size or counts it in the quota below: 2 MB of gzip took 2.2 GB
  // of the daemon. Gradients do not compress; a compressed call is refused
  // (UNIMPLEMENTED, "Compression algorithm 'gzip' is disabled") before any
  // message of it is read.
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  // gRPC buffers a unary request whole before any handler (and so any token
  // check) sees it: without a bound, one client's half-sent 60 MiB requests
  // held 2.4 GB of the daemon's memory after 1.6 s (docs/decisions.md).
  grpc::ResourceQuota quota("optstated");
  quota.Resize(grpc_buffer_bytes);
  builder.SetResourceQuota(quota);
  builder.RegisterService(parts->service.get());
  builder.RegisterService(parts->data_plane->service());
  RouteProtobufLogToTheDaemonLog();  // A request's bad UTF-8: a line a second at most.
  RouteGrpcLogToTheDaemonLog();      // A failed handshake: the same.
  if (options.on_listener_failed) OnGrpcListenerFailed(options.on_listener_failed);
  if (parts->call_metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeCallMetricsInterceptorFactory(parts->call_metrics.get()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  if (options.before_serving) options.before_serving();
  parts->grpc_server = builder.BuildAndStart();
  if (parts->grpc_server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options.listen, " (address in use or not valid?)"));
  }
  if (absl::Status s = ApplyListenSocketMode(options); !s.ok()) return s;
  if (absl::Status s = parts->data_plane->StartSocket(options.listen, port); !s.ok()) return s;
  // Health answers for the services by name too, as load balancers and
  // probes that name it expect (gRPC sets it NOT_SERVING at shutdown).
  if (grpc::HealthCheckServiceInterface* health = parts->grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(v1::OptimizerState::service_full_name(), true);
    health->SetServingStatus(v1::DataPlane::service_full_name(), true);
  }
  // Only once nothing can fail: a refused start leaves the process's path as
  // it was. (A step that came in meanwhile took the other path: the same bits.)
  UseKernelIsa(cpu_kernel);  // Within CpuKernelIsa(): checked above.
  Log(LogLevel::kInfo, "listening on ", options.listen, " (port ", port, "), backend ",
      parts->backend_name, ", CPU kernel ", KernelIsaName(AdamWKernelIsa()), ", ", threads,
      " threads, max_host_bytes ", max_host_bytes);
  return std::unique_ptr<Server>(new Server(std::move(parts), port));
}

Server::Server(std::unique_ptr<Parts> parts, int port) : parts_(std::move(parts)), port_(port) {}

int Server::metrics_port() const {
  return parts_->metrics_endpoint != nullptr ? parts_->metrics_endpoint->port() : 0;
}

Server::~Server() { (void)Shutdown(absl::Seconds(5)); }

const StepEngine& Server::engine() const { return *parts_->engine; }

absl::Status Server::ReloadTokens() {
  absl::Status reloaded = parts_->authenticator->Reload();
  // A revoked token's region connections go too (its gRPC calls are refused
  // from now on; its regions would hold their room and memory).
  if (reloaded.ok() && parts_->data_plane != nullptr) {
    parts_->data_plane->RevalidateRegionConnections();
  }
  return reloaded;
}

absl::Status Server::Shutdown(absl::Duration grace) {
  bool first;
  {
    absl::MutexLock lock(&parts_->mu);
    first = !parts_->shut_down;
    parts_->shut_down = true;
  }
  if (!first) {
    parts_->done.WaitForNotification();  // Another caller is shutting down.
    return parts_->final_checkpoint;
  }
  // 1. Streams first: each ends (UNAVAILABLE, shutting down) once the
  //    messages on the workers are answered; new streams and new unary
  //    calls are refused. Idle streams end at once.
  // 2. Wait for them, up to `grace`; probes see NOT_SERVING meanwhile.
  // 3. No step comes any more: a Checkpoint waiting for one ends
  //    (UNAVAILABLE). Wait for the unary calls under way (a Checkpoint being
  //    written, a RewindJob, a DeleteGroup) to be answered, within `grace`.
  // 4. gRPC's Shutdown stops listening and waits for unary calls, and also
  //    for every client connection to go away (about 5 s with a connected
  //    client), so give it a short deadline: when it passes, gRPC cancels
  //    what is left and closes the connections.
  const absl::Time deadline = absl::Now() + grace;
  if (grpc::HealthCheckServiceInterface* health = parts_->grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  parts_->service->RefuseNewCalls();
  parts_->service->EndAllStreams();
  Log(LogLevel::kInfo, "shutdown: every stream told to end");
  if (!parts_->service->WaitForStreams(deadline)) {
    Log(LogLevel::kWarning, "shutdown: streams still open after the grace period; cutting them");
  } else {
    Log(LogLevel::kInfo, "shutdown: every stream has ended");
  }
  if (parts_->checkpointer != nullptr) parts_->checkpointer->EndWaitsForSteps();
  if (!parts_->service->WaitForCalls(deadline)) {
    Log(LogLevel::kWarning,
        "shutdown: calls still under way after the grace period; cancelling them");
  }
  constexpr absl::Duration kUnaryGrace = absl::Milliseconds(250);
  parts_->grpc_server->Shutdown(absl::ToChronoTime(std::min(deadline, absl::Now() + kUnaryGrace)));
  parts_->grpc_server->Wait();
  parts_->data_plane->StopSocket();
  parts_->pool.reset();  // Runs what is queued, then joins.
  if (parts_->checkpointer != nullptr) {
    // Nothing steps any more: the final checkpoint holds the last state.
    parts_->checkpointer->Stop();
    absl::StatusOr<CheckpointOutcome> last = parts_->checkpointer->Checkpoint(CheckpointCall());
    if (!last.ok()) {
      Log(LogLevel::kError, "final checkpoint at shutdown failed: ", last.status().ToString());
      parts_->final_checkpoint = absl::Status(
          last.status().code(),
          absl::StrCat("the final checkpoint at shutdown failed: ", last.status().message()));
    }
  }
  parts_->done.Notify();
  return parts_->final_checkpoint;
}

void Server::Wait() { parts_->done.WaitForNotification(); }

}  // namespace optstate
