// optstated: the daemon. Parses flags, starts the server, and shuts down
// gracefully on SIGTERM or SIGINT (stop accepting, finish in-flight chunks,
// exit 0).
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "optstate/message_limits.h"
#include "server/base/log.h"
#include "server/data_plane_flags.h"
#include "server/server.h"

namespace {

// What a flag is when not given: the option's own default, so each default
// is written once, in the option struct.
const optstate::ServerOptions& Default() {
  static const optstate::ServerOptions* const defaults = new optstate::ServerOptions();
  return *defaults;
}

}  // namespace

ABSL_FLAG(std::string, listen, Default().listen,
          "Address to serve on, host:port or unix:/path (a Unix socket; --socket_mode says who "
          "may connect). Use 0.0.0.0:50051 to accept remote trainers; port 0 picks a free port.");
ABSL_FLAG(bool, reflection, Default().reflection,
          "Serve gRPC server reflection (grpcurl list and describe without proto files); it "
          "needs no token, like health. --reflection=false: no reflection service.");
ABSL_FLAG(std::string, metrics_listen, Default().metrics_listen,
          "Serve Prometheus metrics on http://IP:PORT/metrics (127.0.0.1:9464 or 0.0.0.0:9464; "
          "an IPv6 [::1]:9464 only where civetweb has IPv6, which Debian's has not; port 0 "
          "picks a free one); empty: no metrics. A port that cannot be "
          "bound stops the start. docs/operations.md lists the metrics.");
ABSL_FLAG(std::string, tls_cert, Default().tls.cert_file,
          "Serve TLS on --listen with this PEM certificate chain (and --tls_key). The files "
          "are looked at every --tls_reload_interval: a replaced certificate is served to new "
          "connections, open streams keep theirs; files that do not parse or a key that is not "
          "the certificate's are not served (the previous ones stay, an ERROR says why). "
          "Without it --listen serves plaintext, which is refused on addresses other than "
          "loopback and unix: (docs/security.md).");
ABSL_FLAG(std::string, tls_key, Default().tls.key_file, "The PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, Default().tls.client_ca_file,
          "With --tls_cert: require client certificates signed by these PEM roots (mTLS); "
          "reloaded like the certificate.");
ABSL_FLAG(absl::Duration, tls_reload_interval, Default().tls.reload_interval,
          "How often the TLS files are checked for changes (at least 1s).");
ABSL_FLAG(bool, allow_insecure_remote, Default().tls.allow_insecure_remote,
          "Serve plaintext on an address other hosts can reach (a trusted network only; a "
          "warning is logged).");
ABSL_FLAG(std::string, tls_trust_domain, Default().auth.spiffe_trust_domain,
          "With --tls_client_ca: a client certificate whose URI SAN is exactly "
          "spiffe://TRUST_DOMAIN/tenant/NAME is tenant NAME when it sends no token.");
ABSL_FLAG(
    std::string, auth_tokens_file, Default().auth.tokens_file,
    "Tokens and tenants, one per line: TENANT SHA256HEX [max_host_bytes=N] "
    "[max_groups=N] [admin] ('#' comments; SHA256HEX: the lowercase hex SHA-256 of the "
    "token). Every call but health and reflection (--reflection) then needs 'authorization: Bearer "
    "TOKEN'; each tenant sees only its groups. Re-read on SIGHUP (a bad file keeps the "
    "previous one).");
ABSL_FLAG(uint64_t, tenant_max_host_bytes, Default().auth.tenant_max_host_bytes,
          "Host bytes of state one tenant may hold, for tokens-file tenants without "
          "max_host_bytes=; 0: no limit but --max_host_bytes.");
ABSL_FLAG(uint64_t, tenant_max_groups, Default().auth.tenant_max_groups,
          "Groups one tenant may hold, for tokens-file tenants without max_groups=; 0: no "
          "limit.");
ABSL_FLAG(int, tenant_max_streams, Default().tenant_max_streams,
          "Step streams one tenant may hold open at once, and ExportState streams apart from "
          "them; more get RESOURCE_EXHAUSTED; 0: no limit.");
ABSL_FLAG(int64_t, lease_seconds, absl::ToInt64Seconds(Default().lease_term),
          "A job's lease on the groups it steps lasts this long after its last call "
          "(docs/jobs.md); until then another job's Step, ImportState or DeleteGroup on them is "
          "refused (FAILED_PRECONDITION naming the holder), and after it only an explicit "
          "takeover breaks it. At least 1.");
ABSL_FLAG(std::string, backend, Default().backend.kind,
          "Where steps run: auto (cuda when built in and a device is usable, else cpu), cpu, "
          "or cuda (exit with an error when no device is usable).");
ABSL_FLAG(std::string, cpu_kernel, Default().cpu_kernel,
          "The CPU AdamW kernel's path: auto (the widest this CPU runs), avx512, avx2 or "
          "scalar. Every path gives the same bits; a narrower one where the wide one runs "
          "slower, or to compare them. GetStats reports the one in use.");
ABSL_FLAG(int, threads, Default().threads,
          "Worker threads for the step engine; 0 means one per CPU.");
ABSL_FLAG(uint64_t, max_host_bytes, Default().max_host_bytes,
          "Host memory all groups may take together (12 bytes per element); registrations "
          "past it get RESOURCE_EXHAUSTED. 0 means 80% of the memory this process may use: the "
          "host's, or its cgroup's limit (a container's --memory) where lower.");
ABSL_FLAG(uint64_t, grpc_buffer_bytes, Default().grpc_buffer_bytes,
          "Most memory gRPC may hold for messages on their way in and out (a memory quota): "
          "past it new streams get smaller windows, and when it is used up gRPC cancels "
          "streams (RESOURCE_EXHAUSTED \"Buffers full\"), so clients sending many large "
          "messages at once, or never finishing them, cannot take the daemon's memory. Step "
          "streams also read no further message while they hold this much between them in "
          "requests read and replies not yet sent (each one message each way beyond it), so "
          "clients that never read their replies cannot either. 0 means "
          "a tenth of the memory this process may use, at least 1 GiB; at least two "
          "--max_message_bytes.");
ABSL_FLAG(int, max_message_bytes, Default().max_message_bytes,
          absl::StrCat("Largest request or reply message, in bytes (chunks of step and values); "
                       "at least one page of float32 plus ",
                       optstate::kMessageFieldRoomBytes,
                       " bytes for the other fields, and at least 1 MiB (",
                       optstate::kMinMessageBytes,
                       " with the default pages). A Step message whose reply would be larger is "
                       "refused before it is applied."));
ABSL_FLAG(absl::Duration, stream_idle_timeout, Default().stream_idle_timeout,
          "A Step or RegisterGroup stream with nothing read, applied or written for this long "
          "is ended with UNAVAILABLE (optstate::Client opens a new one); 0 means never.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(30),
          "On SIGTERM or SIGINT: how long to wait for the chunks already being applied to be "
          "answered (streams end, UNAVAILABLE, as soon as they are); what is left then is cut.");
ABSL_FLAG(uint64_t, page_elements, Default().page_elements,
          "Elements per page: the unit of exactly-once stepping and of checkpoints; a positive "
          "multiple of 64. A checkpoint written with another page size is not restored.");
ABSL_FLAG(std::string, state_dir, Default().state_dir,
          "Directory for checkpoints (docs/durability.md); empty: none. At start the newest "
          "complete checkpoint there is restored before serving; on SIGTERM a final one is "
          "written.");
ABSL_FLAG(absl::Duration, checkpoint_interval, Default().checkpoint_interval,
          "With --state_dir: also write a checkpoint this often (for example 10m); 0 means "
          "only when asked (Checkpoint) and at shutdown.");
ABSL_FLAG(int, checkpoints_to_keep, Default().checkpoints_to_keep,
          "With --state_dir: complete checkpoints kept; older ones are removed once a newer "
          "one is durable. At least 1.");
ABSL_FLAG(bool, require_state, Default().require_state,
          "With --state_dir: exit non-zero when no usable checkpoint can be restored.");
ABSL_FLAG(uint64_t, checkpoint_buffer_bytes, Default().checkpoint_buffer_bytes,
          "With --state_dir: state copied per write while checkpointing; the writer holds two "
          "such runs (one being copied, one being written), at least one page each.");
ABSL_FLAG(absl::Duration, heap_trim_interval, Default().heap_trim_interval,
          "Look at the heap this often and return its free memory (receive buffers of past "
          "messages) to the system when it grew by more than --heap_trim_slack or its use fell "
          "(not under steady load); always soon after a group is deleted, and once the daemon "
          "has had no stream open for half of it (what a load left goes back within one "
          "interval of its end); 0 means only after deletes; else at least 1s.");
ABSL_FLAG(uint64_t, heap_trim_slack, Default().heap_trim_slack_bytes,
          "Bytes the heap may grow by, or its use fall by, before a periodic look trims it.");
ABSL_FLAG(int, malloc_arenas, 1,
          "glibc malloc arenas (M_ARENA_MAX). Each thread that allocates may get its own, and "
          "receive buffers freed into many arenas stayed resident (RSS grew under steady load "
          "and did not return after deletes); 1 kept RSS flat with no loss of step throughput "
          "on 2 cores. On hosts with many cores, measure bench/rss-soak and optstate-bench "
          "before raising it.");
ABSL_FLAG(std::string, log_level, "info", "One of debug, info, warning, error.");
ABSL_FLAG(std::string, paging, Default().backend.cuda.paging,
          "CUDA backend: none (state always in VRAM; refuse what does not fit), adaptive "
          "(resident while the budget allows, else paged), fully_paged (all state on the "
          "host, paged through the staging pool).");
ABSL_FLAG(uint64_t, vram_reserved_bytes, Default().backend.cuda.vram_reserved_bytes,
          "CUDA backend: VRAM kept free for the trainer or other processes.");
ABSL_FLAG(double, vram_target_utilization, Default().backend.cuda.vram_target_utilization,
          "CUDA backend: share of VRAM optstate may plan to use, clamped to [0.5, 0.95].");
ABSL_FLAG(uint64_t, vram_total_bytes, Default().backend.cuda.vram_total_bytes,
          "CUDA backend: overrides the device's total VRAM (to test tight budgets); 0 reads "
          "it from the device.");
ABSL_FLAG(int, staging_slots, Default().backend.cuda.staging_slots,
          "CUDA backend: device staging slots, allocated at start.");
ABSL_FLAG(uint64_t, staging_slot_bytes, Default().backend.cuda.staging_slot_bytes,
          "CUDA backend: bytes per staging slot (holds p, g, m and v of one piece of a chunk).");
ABSL_FLAG(int, cuda_device, Default().backend.cuda.device, "CUDA backend: device ordinal.");

int main(int argc, char** argv) {
  // --help lists the flags of this program's own files (absl's default
  // takes only a file named after the binary, and none when it is renamed).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server/optstated_main.") ||
           absl::StrContains(file, "server/data_plane_flags.");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "optstated keeps AdamW optimizer state for remote trainers and applies their steps.\n"
      "Usage: optstated [--listen=127.0.0.1:50051] [--backend=auto|cpu|cuda] [--threads=N] ...");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    optstate::Log(optstate::LogLevel::kError, "takes flags only (--name=value), got '",
                  positional[1], "'; see optstated --help");
    return 2;
  }
  if (absl::GetFlag(FLAGS_shutdown_grace) < absl::ZeroDuration()) {
    optstate::Log(optstate::LogLevel::kError, "--shutdown_grace must not be negative");
    return 2;
  }

  // Chunk buffers (about 1 MiB each) come and go for every message; serving
  // them from the heap instead of fresh mmaps avoids a page fault per page
  // per message (measured: 20-36% less daemon CPU per step, BENCHMARKS.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // What the heap keeps is then bounded by trimming (HeapTrimmer: after
  // deletes, once no stream has been open for half a --heap_trim_interval,
  // and when a look every interval finds it grew or its use fell) and by the
  // number of arenas:
  // malloc_trim did not give back what gRPC's threads freed into their own
  // arenas (bench/rss-soak: +15% in 24 s with the default 8 per core).
  if (absl::GetFlag(FLAGS_malloc_arenas) < 1) {
    optstate::Log(optstate::LogLevel::kError, "--malloc_arenas must be at least 1");
    return 2;
  }
  mallopt(M_ARENA_MAX, absl::GetFlag(FLAGS_malloc_arenas));

  optstate::LogLevel level;
  if (!optstate::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    optstate::Log(optstate::LogLevel::kError, "--log_level must be debug, info, warning or error");
    return 2;
  }
  optstate::SetLogLevel(level);

  // A log reader that went away (a collector restarted, `optstated | tee`
  // interrupted) makes writes to stdout and stderr fail with EPIPE; the
  // default SIGPIPE would kill the daemon before its final checkpoint.
  std::signal(SIGPIPE, SIG_IGN);

  // Each connection takes a descriptor, and gRPC 1.51 stops accepting for
  // good once the limit is reached: the soft limit goes up to the hard one.
  if (struct rlimit fds; getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    const rlim_t was = fds.rlim_cur;
    fds.rlim_cur = fds.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &fds) == 0) {
      optstate::Log(optstate::LogLevel::kInfo, "open descriptors: the limit raised from ", was,
                    " to ", fds.rlim_max, " (the hard limit)");
    }
  }

  // Signals are taken synchronously by one thread; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  optstate::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  options.tls.allow_insecure_remote = absl::GetFlag(FLAGS_allow_insecure_remote);
  options.auth.spiffe_trust_domain = absl::GetFlag(FLAGS_tls_trust_domain);
  options.auth.tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.auth.tenant_max_host_bytes = absl::GetFlag(FLAGS_tenant_max_host_bytes);
  options.auth.tenant_max_groups = absl::GetFlag(FLAGS_tenant_max_groups);
  options.tenant_max_streams = absl::GetFlag(FLAGS_tenant_max_streams);
  if (absl::GetFlag(FLAGS_lease_seconds) < 1) {
    optstate::Log(optstate::LogLevel::kError, "--lease_seconds must be at least 1, got ",
                  absl::GetFlag(FLAGS_lease_seconds));
    return 2;
  }
  options.lease_term = absl::Seconds(absl::GetFlag(FLAGS_lease_seconds));
  options.threads = absl::GetFlag(FLAGS_threads);
  options.max_host_bytes = absl::GetFlag(FLAGS_max_host_bytes);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.grpc_buffer_bytes = absl::GetFlag(FLAGS_grpc_buffer_bytes);
  options.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  options.page_elements = absl::GetFlag(FLAGS_page_elements);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.checkpoint_interval = absl::GetFlag(FLAGS_checkpoint_interval);
  options.checkpoints_to_keep = absl::GetFlag(FLAGS_checkpoints_to_keep);
  options.require_state = absl::GetFlag(FLAGS_require_state);
  options.checkpoint_buffer_bytes = absl::GetFlag(FLAGS_checkpoint_buffer_bytes);
  options.heap_trim_interval = absl::GetFlag(FLAGS_heap_trim_interval);
  options.heap_trim_slack_bytes = absl::GetFlag(FLAGS_heap_trim_slack);
  options.backend.kind = absl::GetFlag(FLAGS_backend);
  options.cpu_kernel = absl::GetFlag(FLAGS_cpu_kernel);
  options.backend.cuda.paging = absl::GetFlag(FLAGS_paging);
  options.backend.cuda.vram_reserved_bytes = absl::GetFlag(FLAGS_vram_reserved_bytes);
  options.backend.cuda.vram_target_utilization = absl::GetFlag(FLAGS_vram_target_utilization);
  options.backend.cuda.vram_total_bytes = absl::GetFlag(FLAGS_vram_total_bytes);
  options.backend.cuda.staging_slots = absl::GetFlag(FLAGS_staging_slots);
  options.backend.cuda.staging_slot_bytes = absl::GetFlag(FLAGS_staging_slot_bytes);
  options.backend.cuda.device = absl::GetFlag(FLAGS_cuda_device);
  if (absl::Status s = optstate::DataPlaneOptionsFromFlags(&options); !s.ok()) {
    optstate::Log(optstate::LogLevel::kError, s.ToString());
    return 2;
  }

  // A SIGTERM or SIGINT while the server starts (the restore of a large
  // state can take minutes) ends the process at once: nothing has been
  // served yet, and the start writes nothing that matters (the restore only
  // reads; unfinished checkpoint files it removes are removed again at the
  // next start), so there is nothing to save. Start-up ends right before the
  // server accepts its first call (ServerOptions::before_serving). A SIGHUP
  // then is kept, and the tokens file read again once serving.
  // Whoever clears `starting` first decides: this thread exits the process,
  // or main, once serving, shuts down for a signal taken too late.
  std::atomic<bool> starting{true};
  std::atomic<int> taken_after_start{0};
  std::atomic<bool> hup_during_start{false};
  std::thread start_signals([&] {
    const struct timespec poll = {0, 100 * 1000 * 1000};
    while (starting.load()) {
      const int taken = sigtimedwait(&signals, nullptr, &poll);
      if (taken == SIGHUP) hup_during_start.store(true);
      if (taken != SIGTERM && taken != SIGINT) continue;
      if (!starting.exchange(false)) {
        taken_after_start.store(taken);
        return;
      }
      optstate::Log(optstate::LogLevel::kInfo, "signal ", taken,
                    " during start-up: exiting; nothing was served or written");
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(0);
    }
  });
  auto end_start_up = [&] {
    if (!starting.exchange(false)) {
      // The signal thread is exiting the process.
      for (;;) pause();
    }
  };
  options.before_serving = end_start_up;
  // gRPC 1.51 does not recover a listener whose accept failed with EMFILE.
  // With --state_dir the daemon then stops as on SIGTERM (final checkpoint)
  // and exits 4, for its supervisor to restart it, which restores that
  // checkpoint; without one it keeps serving the connections it has (a
  // restart would lose the state).
  std::atomic<bool> listener_failed{false};
  const bool restart_restores = !absl::GetFlag(FLAGS_state_dir).empty();
  options.on_listener_failed = [&listener_failed, restart_restores](const std::string& reason) {
    listener_failed.store(true);
    if (restart_restores) {
      optstate::Log(optstate::LogLevel::kError, "gRPC stopped accepting connections (", reason,
                    "; the descriptor limit was reached, and gRPC does not accept again after "
                    "that): shutting down with a final checkpoint, to exit with status 4 for a "
                    "restart; raise the limit (ulimit -n) if trainers need that many "
                    "connections");
      kill(getpid(), SIGTERM);
    } else {
      optstate::Log(optstate::LogLevel::kError, "gRPC stopped accepting connections (", reason,
                    "; the descriptor limit was reached, and gRPC does not accept again after "
                    "that): only the connections already made are served. Without --state_dir a "
                    "restart would lose the state: save it (ExportState) and restart, with a "
                    "higher limit (ulimit -n)");
    }
  };
  absl::StatusOr<std::unique_ptr<optstate::Server>> server = optstate::Server::Start(options);
  if (starting.load()) end_start_up();  // Start refused before serving.
  start_signals.join();
  if (!server.ok()) {
    optstate::Log(optstate::LogLevel::kError, server.status().ToString());
    return 1;
  }
  // Tests and scripts read this line to learn the port.
  std::printf("optstated listening on port %d\n", (*server)->port());
  if ((*server)->metrics_port() != 0) {
    std::printf("optstated serving metrics on port %d\n", (*server)->metrics_port());
  }
  std::fflush(stdout);

  if (hup_during_start.load() && !absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
    if (absl::Status s = (*server)->ReloadTokens(); s.ok()) {
      optstate::Log(optstate::LogLevel::kInfo, "SIGHUP during start-up: tokens file reloaded");
    } else {
      optstate::Log(optstate::LogLevel::kError,
                    "SIGHUP during start-up: tokens file not reloaded, the previous one stays: ",
                    s.message());
    }
  }
  int signal = taken_after_start.load();
  while (signal == 0) {
    sigwait(&signals, &signal);
    if (signal != SIGHUP) break;
    if (absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
      optstate::Log(optstate::LogLevel::kInfo, "SIGHUP: no --auth_tokens_file to reload");
    } else if (absl::Status s = (*server)->ReloadTokens(); s.ok()) {
      optstate::Log(optstate::LogLevel::kInfo, "SIGHUP: tokens file reloaded");
    } else {
      optstate::Log(optstate::LogLevel::kError,
                    "SIGHUP: tokens file not reloaded, the previous one stays: ", s.message());
    }
    signal = 0;
  }
  optstate::Log(optstate::LogLevel::kInfo, "signal ", signal,
                ": shutting down, finishing in-flight chunks");
  // Signals during the shutdown are answered, not left pending in silence:
  // the shutdown goes on (its final checkpoint is what a restart restores).
  std::atomic<bool> stopping{true};
  std::thread shutdown_signals([&] {
    auto answer = [](int taken) {
      if (taken != SIGTERM && taken != SIGINT && taken != SIGHUP) return;
      optstate::Log(optstate::LogLevel::kWarning, "signal ", taken,
                    " during the shutdown: the shutdown goes on (in-flight chunks, then the "
                    "final checkpoint with --state_dir, at most --shutdown_grace=",
                    absl::FormatDuration(absl::GetFlag(FLAGS_shutdown_grace)),
                    " for the chunks); SIGKILL stops at once, and a restart then restores the "
                    "last complete checkpoint");
    };
    const struct timespec poll = {0, 100 * 1000 * 1000};
    while (stopping.load()) answer(sigtimedwait(&signals, nullptr, &poll));
    // Those still pending came during the shutdown too (before this thread
    // waited, or as it ended).
    const struct timespec now = {0, 0};
    for (int taken; (taken = sigtimedwait(&signals, nullptr, &now)) > 0;) answer(taken);
  });
  const absl::Status stopped = (*server)->Shutdown(absl::GetFlag(FLAGS_shutdown_grace));
  stopping.store(false);
  shutdown_signals.join();
  if (!stopped.ok()) {
    // Exit non-zero: what supervises the daemon (compose, Kubernetes, a
    // script) must be able to tell that the last state was not saved.
    optstate::Log(optstate::LogLevel::kError, "stopped, but ", stopped.message(),
                  "; exiting with status 3");
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(3);
  }
  if (listener_failed.load() && restart_restores) {
    optstate::Log(optstate::LogLevel::kError,
                  "stopped because gRPC stopped accepting connections; exiting with status 4 "
                  "(a restart restores the final checkpoint)");
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(4);
  }
  optstate::Log(optstate::LogLevel::kInfo, "stopped");
  // Every stream and call has ended and the worker pool has drained. Exit
  // without destroying the server: ~grpc::Server runs gRPC's library
  // shutdown, which joins an executor thread that may sit in a poll for up
  // to 10 s (seen in shutdown_test after large replies), holding the exit.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}
