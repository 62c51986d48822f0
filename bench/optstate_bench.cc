// optstate-bench: end-to-end step throughput of an optstated daemon through
// the C++ client, against same-run baselines (a plain gRPC echo of the same
// bytes in the same chunks; the same echo with no payload copies in user code,
// gRPC's own ceiling; that echo plus only the work any AdamW service must do,
// then with optstate's guarantees; and a raw TCP loopback stream), plus the
// daemon's resident memory per registered element.
//
// Every configuration (shape x wire dtype x clients) is measured `--reps`
// times, interleaved with its baselines, and the best repetition is reported:
// the machine is shared, so noise only ever makes a run slower.
// Each result is printed as a line "RESULT {json}" for bench/run.sh.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/child_process.h"
#include "bench/echo_baseline.h"
#include "bench/raw_adamw.h"
#include "bench/raw_echo.h"
#include "bench/tcp_loopback.h"
#include "optstate/client.h"
#include "server/kernels/adamw_kernel.h"
#include "server/state/host_allocator.h"

ABSL_FLAG(std::string, target, "",
          "host:port of a running optstated (127.0.0.1 only); empty starts one. Server CPU "
          "time and memory are measured only for a daemon this program started.");
ABSL_FLAG(std::string, daemon, "",
          "Path of optstated; default: ../server/optstated next to "
          "this binary.");
ABSL_FLAG(std::vector<std::string>, daemon_args, {}, "Extra flags for the started daemon.");
ABSL_FLAG(std::vector<std::string>, shape, {"lora7b"},
          "Model shapes: lora7b (256 tensors of 65,536 elements), dense:N (one tensor) or "
          "groups:CxN (C tensors of N elements each).");
ABSL_FLAG(std::vector<std::string>, wire, {"fp32"},
          "Wire dtypes (gradient and returned params): fp32, bf16 (from and into float "
          "buffers), bf16-native (from and into bf16 buffers: GroupStep's gradient and "
          "params_out made by Of16Bit).");
ABSL_FLAG(std::vector<std::string>, clients, {"1"},
          "Concurrent clients, each with its own Client and its own groups.");
ABSL_FLAG(std::vector<std::string>, data_plane, {"wire"},
          "Data planes to measure optstate's step on (ClientOptions::data_plane): wire, "
          "shared_memory (the caller's buffers copied through the client's region), "
          "shared_buffer (shared memory with gradients and params kept in a SharedBuffer: "
          "nothing copied), shared_buffer_checked (the same with StepOptions::gradients_checked: "
          "the caller vouches, the daemon checks each group as it applies it); several are "
          "measured interleaved, and each shared one over the "
          "wire printed, with the kernel alone and torch's fused AdamW on the same elements.");
ABSL_FLAG(int, kernel_threads, 0,
          "Threads of the kernel-alone and torch fused baselines (measured when a shared "
          "data plane is): 0 means one per CPU, as optstated's --threads.");
ABSL_FLAG(std::string, torch_python, "",
          "Python with torch for the torch fused AdamW baseline; empty: .torch-venv/bin/python3 "
          "under the current directory or the source tree when it exists, else skipped.");
ABSL_FLAG(uint64_t, chunk_bytes, 1 << 20, "Client chunk size (ClientOptions::chunk_bytes).");
ABSL_FLAG(int, window, 8, "Chunks in flight per stream (ClientOptions::max_chunks_in_flight).");
ABSL_FLAG(double, seconds, 2.0, "Seconds per measurement (at least --min_steps steps).");
ABSL_FLAG(int, min_steps, 3, "Least steps per client per measurement.");
ABSL_FLAG(int, reps, 3, "Repetitions of every measurement, interleaved.");
ABSL_FLAG(bool, echo, true, "Measure the gRPC echo baselines.");
ABSL_FLAG(bool, raw_adamw, true,
          "Measure the minimal AdamW service (bench/raw_adamw.h): the raw echo plus only the "
          "work any AdamW service over gRPC must do.");
ABSL_FLAG(bool, tcp, true, "Measure the raw TCP loopback baseline.");
ABSL_FLAG(uint64_t, memory_elements, 0,
          "When > 0: only measure the daemon's resident memory after registering a group of "
          "this many elements (with initial values) and stepping it once.");
ABSL_FLAG(bool, serve_echo, false, "Internal: run the echo server (used as a child process).");
ABSL_FLAG(bool, serve_raw_adamw, false,
          "Internal: run the minimal AdamW server (used as a child process).");

namespace optstate::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Shape {
  std::string name;
  std::vector<uint64_t> tensors;  // Elements of each tensor.
  uint64_t elements() const {
    uint64_t n = 0;
    for (uint64_t t : tensors) n += t;
    return n;
  }
};

// "CxN" (C tensors of N elements, both positive) into *count and *elements.
bool ParseGroups(absl::string_view text, uint64_t* count, uint64_t* elements) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], count) && *count > 0 &&
         absl::SimpleAtoi(parts[1], elements) && *elements > 0;
}

Shape ParseShape(const std::string& text) {
  Shape shape{text, {}};
  uint64_t n = 0, count = 0;
  if (text == "lora7b") {
    shape.tensors.assign(256, 65536);
  } else if (absl::StartsWith(text, "dense:") && absl::SimpleAtoi(text.substr(6), &n) && n > 0) {
    shape.tensors.push_back(n);
  } else if (absl::StartsWith(text, "groups:") && ParseGroups(text.substr(7), &count, &n)) {
    shape.tensors.assign(count, n);
  } else {
    std::fprintf(stderr, "optstate-bench: unknown shape '%s'\n", text.c_str());
    std::exit(2);
  }
  return shape;
}

WireType ParseWire(const std::string& text) {
  if (text == "fp32") return WireType::kFloat32;
  if (text == "bf16" || text == "bf16-native") return WireType::kBFloat16;
  std::fprintf(stderr, "optstate-bench: --wire must be fp32, bf16 or bf16-native, got '%s'\n",
               text.c_str());
  std::exit(2);
}

void Check(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "optstate-bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t at = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size()))) - 1;
  return values[std::min(at, values.size() - 1)];
}

// One client's tensors on the daemon, with its gradient and params buffers.
struct ClientState {
  std::unique_ptr<Client> client;
  std::unique_ptr<EchoClient> echo;
  std::unique_ptr<RawEchoClient> raw_echo;
  std::unique_ptr<RawAdamWClient> raw_adamw, raw_adamw_guarded;
  uint64_t raw_adamw_step = 1;
  std::vector<std::string> names;
  std::vector<float> gradient;  // All tensors back to back.
  std::vector<float> params;
  std::vector<uint16_t> gradient16, params16;  // The same, for bf16-native.
  // shared_buffer: the gradient and params live in it instead (the same
  // values), and these point there, else at the vectors above.
  std::unique_ptr<SharedBuffer> shared;
  const float* gradient_at = nullptr;
  float* params_at = nullptr;
  const uint16_t* gradient16_at = nullptr;
  uint16_t* params16_at = nullptr;
  std::vector<size_t> chunk_bytes;  // The messages Client::Step sends, in order, in wire bytes.
  std::vector<char> echo_in, echo_out;
  uint64_t next_step = 1;
};

struct Config {
  Shape shape;
  std::string wire_name;
  WireType wire;
  bool native16;  // The client's buffers are bf16 (Of16Bit views).
  int clients;
  std::string plane_name;  // --data_plane's word.
  DataPlane plane;
  bool shared_buffer;  // Buffers in a SharedBuffer (--data_plane=shared_buffer...).
  // StepOptions::gradients_checked (--data_plane=shared_buffer_checked): the
  // caller vouches for its gradients, as after a finite clip_grad_norm_.
  bool gradients_checked;
  std::vector<std::unique_ptr<ClientState>> states;
};

struct Measurement {
  double seconds = 0;
  uint64_t steps = 0;  // Over all clients.
  double elements = 0;
  double wire_bytes = 0;  // Sent plus received payload bytes.
  double server_cpu_seconds = 0;
  double client_cpu_seconds = 0;  // This process: the clients' side of the work.
  std::vector<double> latencies_ms;
};

ClientOptions MakeClientOptions(DataPlane plane = DataPlane::kWire) {
  ClientOptions options;
  options.data_plane = plane;
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.max_chunks_in_flight = absl::GetFlag(FLAGS_window);
  return options;
}

// Steps a fresh state of the minimal AdamW service three times and compares
// every param of the third step with optstate's kernel run here from the same
// non-uniform start: the baseline must do the real work (state kept per
// element, bias corrections per step, m and v carried).
void VerifyRawAdamW(const Config& config, const ClientState& state, uint64_t id, bool guarded,
                    const std::string& raw_adamw_target) {
  const ClientOptions options = MakeClientOptions();
  const void* gradient_wire = nullptr;  // bf16 from floats: narrowed at every step.
  if (config.native16) gradient_wire = state.gradient16.data();
  if (config.wire == WireType::kFloat32) gradient_wire = state.gradient.data();
  RawAdamWClient client(raw_adamw_target, options.max_message_bytes, options.max_chunks_in_flight,
                        id, state.chunk_bytes, config.wire, !config.native16, guarded,
                        state.gradient.data(), gradient_wire);
  const size_t n = state.gradient.size();
  std::vector<char> got(n * (config.native16 ? WireTypeSize(config.wire) : sizeof(float)));
  constexpr uint64_t kSteps = 3;
  for (uint64_t step = 1; step <= kSteps; ++step) {
    Check(client.Step(step, got.data()), "raw adamw verification step");
  }
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), wire_params(n);
  for (size_t i = 0; i < n; ++i) p[i] = RawAdamWInitialParam(i);
  std::vector<char> gradient(n * WireTypeSize(config.wire));
  EncodeFromFloat(config.wire, state.gradient.data(), gradient.data(), n);
  std::vector<char> expected(n * WireTypeSize(config.wire));
  for (uint64_t step = 1; step <= kSteps; ++step) {
    AdamWStepInputs inputs;
    inputs.step = step;
    AdamWUpdateAndEncode(ComputeAdamWConstants(inputs), p.data(), m.data(), v.data(),
                         gradient.data(), config.wire, n, expected.data(), config.wire);
  }
  if (!config.native16) {
    DecodeToFloat(config.wire, expected.data(), wire_params.data(), n);
    expected.assign(reinterpret_cast<const char*>(wire_params.data()),
                    reinterpret_cast<const char*>(wire_params.data() + n));
  }
  if (got != expected) {
    std::fprintf(stderr, "optstate-bench: the minimal AdamW service returned wrong params\n");
    std::exit(1);
  }
}

void Setup(Config& config, int index, const std::string& target, const std::string& echo_target,
           const std::string& raw_adamw_target) {
  const ClientOptions options = MakeClientOptions(config.plane);
  for (int c = 0; c < config.clients; ++c) {
    auto state = std::make_unique<ClientState>();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
    Check(client.status(), "connect");
    state->client = std::move(*client);
    if (!echo_target.empty()) {
      state->echo = std::make_unique<EchoClient>(echo_target, options.max_message_bytes,
                                                 options.max_chunks_in_flight);
    }
    const uint64_t n = config.shape.elements();
    state->gradient.resize(n);
    state->params.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      state->gradient[i] = static_cast<float>(static_cast<int>((i * 7919) % 2001) - 1000) * 1e-4f;
    }
    if (config.native16) {
      state->gradient16.resize(n);
      state->params16.resize(n);
      EncodeFromFloat(WireType::kBFloat16, state->gradient.data(), state->gradient16.data(), n);
    }
    state->gradient_at = state->gradient.data();
    state->params_at = state->params.data();
    state->gradient16_at = state->gradient16.data();
    state->params16_at = state->params16.data();
    if (config.shared_buffer) {
      const size_t element = config.native16 ? 2 : 4;
      absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer =
          state->client->AllocateSharedBuffer(2 * n * element);
      Check(buffer.status(), "allocate the shared buffer");
      state->shared = std::move(*buffer);
      char* base = static_cast<char*>(state->shared->data());
      if (config.native16) {
        uint16_t* g = reinterpret_cast<uint16_t*>(base);
        std::copy(state->gradient16.begin(), state->gradient16.end(), g);
        state->gradient16_at = g;
        state->params16_at = g + n;
      } else {
        float* g = reinterpret_cast<float*>(base);
        std::copy(state->gradient.begin(), state->gradient.end(), g);
        state->gradient_at = g;
        state->params_at = g + n;
      }
    }
    const size_t wire_size = WireTypeSize(config.wire);
    for (size_t t = 0; t < config.shape.tensors.size(); ++t) {
      std::string name = absl::StrCat("bench", index, "/c", c, "/t", t);
      absl::StatusOr<GroupInfo> info = state->client->RegisterGroup(name, config.shape.tensors[t]);
      Check(info.status(), "register");
      // The same messages as Client::Step: chunks of whole pages, about
      // chunk_bytes, and consecutive chunks packed into one message while it
      // stays within chunk_bytes.
      const uint64_t page_bytes = info->page_elements * wire_size;
      const uint64_t chunk_elements =
          std::max<uint64_t>(1, options.chunk_bytes / page_bytes) * info->page_elements;
      for (uint64_t at = 0; at < info->num_elements; at += chunk_elements) {
        const size_t bytes = std::min(chunk_elements, info->num_elements - at) * wire_size;
        if (!state->chunk_bytes.empty() &&
            state->chunk_bytes.back() + bytes <= options.chunk_bytes) {
          state->chunk_bytes.back() += bytes;
        } else {
          state->chunk_bytes.push_back(bytes);
        }
      }
      state->names.push_back(std::move(name));
    }
    if (!echo_target.empty()) {
      state->raw_echo = std::make_unique<RawEchoClient>(
          echo_target, options.max_message_bytes, options.max_chunks_in_flight, state->chunk_bytes);
    }
    if (!raw_adamw_target.empty()) {
      const void* gradient_wire = nullptr;  // bf16 from floats: narrowed at every step.
      if (config.native16) gradient_wire = state->gradient16.data();
      if (config.wire == WireType::kFloat32) gradient_wire = state->gradient.data();
      // Configurations run one after the other, so client c of each shares
      // one state on the server (each run starts it afresh at step 1).
      const uint64_t id = static_cast<uint64_t>(c);
      if (c == 0) {
        for (bool guarded : {false, true}) {
          VerifyRawAdamW(config, *state, id, guarded, raw_adamw_target);
        }
      }
      for (bool guarded : {false, true}) {
        (guarded ? state->raw_adamw_guarded : state->raw_adamw) = std::make_unique<RawAdamWClient>(
            raw_adamw_target, options.max_message_bytes, options.max_chunks_in_flight, id,
            state->chunk_bytes, config.wire, !config.native16, guarded, state->gradient.data(),
            gradient_wire);
      }
    }
    state->echo_in.assign(n * wire_size, 1);
    state->echo_out.assign(n * wire_size, 0);
    config.states.push_back(std::move(state));
  }
}

// Runs steps on every client concurrently until `seconds` have passed and
// each client has done `min_steps`; `step_fn(state)` does one step.
template <typename StepFn>
Measurement RunClients(Config& config, pid_t server_pid, StepFn step_fn) {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int min_steps = absl::GetFlag(FLAGS_min_steps);
  // One warm-up step per client, not timed (connections, first-touch).
  for (auto& state : config.states) step_fn(*state);
  Measurement m;
  std::vector<std::vector<double>> latencies(config.states.size());
  std::vector<uint64_t> steps(config.states.size(), 0);
  const double cpu_before = server_pid > 0 ? ProcessCpuSeconds(server_pid) : 0;
  const double client_cpu_before = ProcessCpuSeconds(getpid());
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (size_t c = 0; c < config.states.size(); ++c) {
    threads.emplace_back([&, c] {
      ClientState& state = *config.states[c];
      while (steps[c] < static_cast<uint64_t>(min_steps) || Since(start) < seconds) {
        const Clock::time_point t = Clock::now();
        step_fn(state);
        latencies[c].push_back(Since(t) * 1e3);
        ++steps[c];
      }
    });
  }
  for (auto& t : threads) t.join();
  m.seconds = Since(start);
  m.server_cpu_seconds = server_pid > 0 ? ProcessCpuSeconds(server_pid) - cpu_before : 0;
  m.client_cpu_seconds = ProcessCpuSeconds(getpid()) - client_cpu_before;
  const double wire_per_step =
      2.0 * static_cast<double>(config.shape.elements() * WireTypeSize(config.wire));
  for (size_t c = 0; c < config.states.size(); ++c) {
    m.steps += steps[c];
    m.latencies_ms.insert(m.latencies_ms.end(), latencies[c].begin(), latencies[c].end());
  }
  m.elements = static_cast<double>(m.steps) * static_cast<double>(config.shape.elements());
  m.wire_bytes = static_cast<double>(m.steps) * wire_per_step;
  return m;
}

Measurement MeasureOptstate(Config& config, pid_t server_pid) {
  StepOptions options;
  options.gradient_dtype = config.wire;
  options.param_dtype = config.wire;
  options.gradients_checked = config.gradients_checked;
  return RunClients(config, server_pid, [&](ClientState& state) {
    std::vector<GroupStep> groups;
    uint64_t at = 0;
    for (size_t t = 0; t < state.names.size(); ++t) {
      const uint64_t n = config.shape.tensors[t];
      if (config.native16) {
        groups.push_back(
            {state.names[t],
             ConstBufferView::Of16Bit(absl::MakeConstSpan(state.gradient16_at + at, n),
                                      WireType::kBFloat16),
             BufferView::Of16Bit(absl::MakeSpan(state.params16_at + at, n), WireType::kBFloat16)});
      } else {
        groups.push_back({state.names[t], absl::MakeConstSpan(state.gradient_at + at, n),
                          absl::MakeSpan(state.params_at + at, n)});
      }
      at += n;
    }
    Check(state.client->Step(groups, state.next_step++, options), "step");
  });
}

Measurement MeasureEcho(Config& config, pid_t echo_pid) {
  return RunClients(config, echo_pid, [&](ClientState& state) {
    Check(state.echo->Step(state.chunk_bytes, state.echo_in.data(), state.echo_out.data()), "echo");
  });
}

Measurement MeasureRawEcho(Config& config, pid_t echo_pid) {
  return RunClients(config, echo_pid,
                    [&](ClientState& state) { Check(state.raw_echo->Step(), "raw echo"); });
}

// A state's plain and guarded clients share one id, so they step one
// server-side state in turn, counting steps together.
Measurement MeasureRawAdamW(Config& config, pid_t raw_adamw_pid, bool guarded) {
  return RunClients(config, raw_adamw_pid, [&](ClientState& state) {
    void* params_out = config.native16 ? static_cast<void*>(state.params16.data())
                                       : static_cast<void*>(state.params.data());
    RawAdamWClient& client = guarded ? *state.raw_adamw_guarded : *state.raw_adamw;
    Check(client.Step(state.raw_adamw_step++, params_out), "raw adamw");
  });
}

int BaselineThreads() {
  const int flag = absl::GetFlag(FLAGS_kernel_threads);
  if (flag > 0) return flag;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// `n` floats of group state from the daemon's own allocator
// (AlignedHostAllocator: a 2 MiB-aligned mapping advised for huge pages),
// laid out as the daemon lays out a group's arrays. Not adjacent mappings of
// exactly n floats: arrays a power of two apart in memory ran the kernel at
// a third of its speed here (BENCHMARKS.md), a layout the daemon never has.
struct StateArray {
  StateArray(uint64_t n, float value) : bytes(n * sizeof(float)) {
    data = static_cast<float*>(AlignedHostAllocator()->Allocate(bytes));
    if (data == nullptr) {
      std::fprintf(stderr, "optstate-bench: cannot allocate %llu bytes\n",
                   static_cast<unsigned long long>(bytes));
      std::exit(1);
    }
    std::fill(data, data + n, value);
  }
  ~StateArray() { AlignedHostAllocator()->Free(data, bytes); }
  StateArray(const StateArray&) = delete;
  StateArray& operator=(const StateArray&) = delete;
  const uint64_t bytes;
  float* data;
};

// `bytes` of shared memory, as a client's region is (shmem pages).
struct SharedBytes {
  explicit SharedBytes(uint64_t size) : bytes(std::max<uint64_t>(size, 4096)) {
    void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) {
      std::fprintf(stderr, "optstate-bench: cannot map %llu bytes\n",
                   static_cast<unsigned long long>(bytes));
      std::exit(1);
    }
    data = static_cast<char*>(at);
  }
  ~SharedBytes() { munmap(data, bytes); }
  SharedBytes(const SharedBytes&) = delete;
  SharedBytes& operator=(const SharedBytes&) = delete;
  const uint64_t bytes;
  char* data;
};

// The AdamW kernel alone on `n` elements, gradient and params in `wire`, split
// into `threads` contiguous shards as the daemon's ParallelFor splits a run of
// pages: no gRPC, no checks, no copies. The state from the daemon's
// allocator, gradient and params in shared memory (as a region's), the
// params written with streaming stores (as the daemon writes a region's).
// Elements per second over --seconds.
double MeasureKernel(uint64_t n, WireType wire, int threads) {
  StateArray p_array(n, 0.5f), m_array(n, 0.0f), v_array(n, 0.0f);
  float* const p = p_array.data;
  float* const m = m_array.data;
  float* const v = v_array.data;
  std::vector<float> g(n);
  for (uint64_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(static_cast<int>((i * 7919) % 2001) - 1000) * 1e-4f;
  }
  const size_t size = WireTypeSize(wire);
  SharedBytes grad(n * size), out(n * size);
  EncodeFromFloat(wire, g.data(), grad.data, n);
  std::memset(out.data, 0, n * size);
  uint64_t step = 1;
  auto one_step = [&] {
    AdamWStepInputs inputs;
    inputs.step = step++;
    const AdamWConstants c = ComputeAdamWConstants(inputs);
    std::vector<std::thread> workers;
    const uint64_t shard = (n + static_cast<uint64_t>(threads) - 1) / threads;
    for (int t = 0; t < threads; ++t) {
      const uint64_t begin = std::min(n, shard * t), count = std::min(n, begin + shard) - begin;
      workers.emplace_back([&, begin, count] {
        AdamWUpdateAndEncode(c, p + begin, m + begin, v + begin, grad.data + begin * size, wire,
                             count, out.data + begin * size, wire, ParamsStore::kStreaming);
      });
    }
    for (std::thread& w : workers) w.join();
  };
  one_step();  // First touch, not timed.
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const Clock::time_point start = Clock::now();
  uint64_t steps = 0;
  while (steps < 3 || Since(start) < seconds) {
    one_step();
    ++steps;
  }
  return static_cast<double>(steps * n) / Since(start);
}

// The kernel-alone baseline's name: the shape and wire, and for more than
// one client the number of clients whose elements it steps at once.
std::string KernelKey(const Config& config, int clients) {
  std::string key = absl::StrCat(config.shape.name, " ", config.wire_name);
  if (clients > 1) absl::StrAppend(&key, " x", clients);
  return key;
}

// The Python with torch for the fused baseline, or "" when there is none.
std::string TorchPython() {
  const std::string flag = absl::GetFlag(FLAGS_torch_python);
  if (!flag.empty()) return flag;
  for (const std::string& candidate :
       {std::string(".torch-venv/bin/python3"),
        std::string(OPTSTATE_SOURCE_DIR) + "/.torch-venv/bin/python3"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Elements per second of torch's fused step: over all its steps (as every
// other figure here), and of its fastest step alone.
struct TorchRate {
  double mean = 0;
  double best_step = 0;
};

// A local torch.optim.AdamW(fused=True) step on the shape's tensors (fp32,
// BaselineThreads() threads), bench/torch_fused_step.py in a child process;
// zeros when it cannot run.
TorchRate MeasureTorchFused(const Shape& shape, int threads, const std::string& python) {
  const std::string command =
      absl::StrCat(python, " ", OPTSTATE_SOURCE_DIR,
                   "/bench/torch_fused_step.py --tensors=", shape.tensors.size(),
                   " --elements=", shape.tensors.front(), " --threads=", threads,
                   " --seconds=", absl::GetFlag(FLAGS_seconds));
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {};
  char line[256];
  TorchRate rate;
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::sscanf(line, "elem_per_s %lf", &rate.mean);
    std::sscanf(line, "best_step_elem_per_s %lf", &rate.best_step);
  }
  if (pclose(pipe) != 0) return {};
  return rate;
}

struct Best {
  Measurement best;           // The repetition with the highest throughput.
  std::vector<double> rates;  // elements/s of every repetition.
  void Add(const Measurement& m) {
    rates.push_back(m.elements / m.seconds);
    if (best.seconds == 0 || m.elements / m.seconds > best.elements / best.seconds) best = m;
  }
};

std::string Json(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", "\"", fields[i].first, "\": ", fields[i].second);
  }
  return out + "}";
}
std::string Q(const std::string& s) { return absl::StrCat("\"", s, "\""); }
std::string N(double v) { return absl::StrFormat("%.10g", v); }
std::string Rates(const std::vector<double>& rates) {
  std::string out = "[";
  for (size_t i = 0; i < rates.size(); ++i) absl::StrAppend(&out, i ? ", " : "", N(rates[i]));
  return out + "]";
}

std::unique_ptr<ChildProcess> StartDaemon() {
  std::string path = absl::GetFlag(FLAGS_daemon);
  if (path.empty()) path = ExecutableDir() + "/../server/optstated";
  std::vector<std::string> argv = {path, "--listen=127.0.0.1:0", "--log_level=warning",
                                   "--backend=cpu"};
  for (const std::string& a : absl::GetFlag(FLAGS_daemon_args)) argv.push_back(a);
  absl::StatusOr<std::unique_ptr<ChildProcess>> daemon = ChildProcess::Start(argv);
  Check(daemon.status(), "start optstated");
  return std::move(*daemon);
}

int MeasureMemory(uint64_t n) {
  std::unique_ptr<ChildProcess> daemon = StartDaemon();
  const std::string target = absl::StrCat("127.0.0.1:", daemon->port());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, MakeClientOptions());
  Check(client.status(), "connect");
  Check((*client)->ListGroups().status(), "list groups");  // Channel and server warm.
  const uint64_t idle = ProcessResidentBytes(daemon->pid());
  std::vector<float> values(n, 0.25f);
  Check((*client)->RegisterGroup("memory", values).status(), "register");
  const uint64_t registered = ProcessResidentBytes(daemon->pid());
  std::vector<float> params(n);
  Check((*client)->Step("memory", 1, values, absl::MakeSpan(params)), "step");
  const uint64_t stepped = ProcessResidentBytes(daemon->pid());
  const double limit = 12.5 * static_cast<double>(n) + 64.0 * (1 << 20);
  std::printf(
      "memory: %llu elements: idle %.1f MiB, after registration %.1f MiB "
      "(%.3f B/elem total, %.3f B/elem over idle), after one step %.1f MiB "
      "(%.3f B/elem); limit 12.5 B/elem + 64 MiB = %.1f MiB\n",
      static_cast<unsigned long long>(n), idle / 1048576.0, registered / 1048576.0,
      static_cast<double>(registered) / n, static_cast<double>(registered - idle) / n,
      stepped / 1048576.0, static_cast<double>(stepped) / n, limit / 1048576.0);
  std::printf("RESULT %s\n", Json({{"kind", Q("memory")},
                                   {"elements", N(static_cast<double>(n))},
                                   {"idle_bytes", N(static_cast<double>(idle))},
                                   {"registered_bytes", N(static_cast<double>(registered))},
                                   {"stepped_bytes", N(static_cast<double>(stepped))},
                                   {"limit_bytes", N(limit)}})
                                 .c_str());
  return 0;
}

int Main() {
  if (absl::GetFlag(FLAGS_memory_elements) > 0) {
    return MeasureMemory(absl::GetFlag(FLAGS_memory_elements));
  }
  std::unique_ptr<ChildProcess> daemon;
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    daemon = StartDaemon();
    target = absl::StrCat("127.0.0.1:", daemon->port());
  }
  std::unique_ptr<ChildProcess> echo_server;
  std::string echo_target;
  if (absl::GetFlag(FLAGS_echo)) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> started =
        ChildProcess::Start({"/proc/self/exe", "--serve_echo"});
    Check(started.status(), "start echo server");
    echo_server = std::move(*started);
    echo_target = absl::StrCat("127.0.0.1:", echo_server->port());
  }
  std::unique_ptr<ChildProcess> raw_adamw_server;
  std::string raw_adamw_target;
  if (absl::GetFlag(FLAGS_raw_adamw)) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> started =
        ChildProcess::Start({"/proc/self/exe", "--serve_raw_adamw"});
    Check(started.status(), "start raw adamw server");
    raw_adamw_server = std::move(*started);
    raw_adamw_target = absl::StrCat("127.0.0.1:", raw_adamw_server->port());
  }
  const pid_t daemon_pid = daemon ? daemon->pid() : 0;
  const pid_t echo_pid = echo_server ? echo_server->pid() : 0;
  const pid_t raw_adamw_pid = raw_adamw_server ? raw_adamw_server->pid() : 0;

  std::vector<Config> configs;
  for (const std::string& shape : absl::GetFlag(FLAGS_shape)) {
    for (const std::string& wire : absl::GetFlag(FLAGS_wire)) {
      for (const std::string& clients : absl::GetFlag(FLAGS_clients)) {
        int n = 0;
        if (!absl::SimpleAtoi(clients, &n) || n < 1) {
          std::fprintf(stderr, "optstate-bench: bad --clients '%s'\n", clients.c_str());
          return 2;
        }
        for (const std::string& plane : absl::GetFlag(FLAGS_data_plane)) {
          if (plane != "wire" && plane != "shared_memory" && plane != "shared_buffer" &&
              plane != "shared_buffer_checked") {
            std::fprintf(stderr, "optstate-bench: bad --data_plane '%s'\n", plane.c_str());
            return 2;
          }
          configs.push_back(Config{ParseShape(shape),
                                   wire,
                                   ParseWire(wire),
                                   wire == "bf16-native",
                                   n,
                                   plane,
                                   plane == "wire" ? DataPlane::kWire : DataPlane::kSharedMemory,
                                   plane.rfind("shared_buffer", 0) == 0,
                                   plane == "shared_buffer_checked",
                                   {}});
        }
      }
    }
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    Setup(configs[i], static_cast<int>(i), target, echo_target, raw_adamw_target);
  }

  const size_t chunk = absl::GetFlag(FLAGS_chunk_bytes);
  const absl::Duration tcp_time = absl::Seconds(std::min(1.0, absl::GetFlag(FLAGS_seconds)));
  std::vector<Best> optstate(configs.size()), echo(configs.size()), raw_echo(configs.size()),
      raw_adamw(configs.size()), raw_adamw_guarded(configs.size());
  std::vector<double> tcp_one_way, tcp_echo;
  // Same-run baselines of the shared data planes: the kernel alone per
  // (shape, wire), and for several clients also over all their elements at
  // once (the state the daemon holds for them, which is larger than one
  // client's and so less of it in cache), and torch's fused AdamW per shape;
  // best of the reps.
  const bool any_shared = std::any_of(configs.begin(), configs.end(),
                                      [](const Config& c) { return c.plane != DataPlane::kWire; });
  const int baseline_threads = BaselineThreads();
  const std::string torch_python = any_shared ? TorchPython() : "";
  std::map<std::string, double> kernel_rate, torch_rate;  // Best rep's elem/s.
  std::map<std::string, double> torch_best_step;          // Torch's fastest step.
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    std::set<std::string> measured;  // This rep's kernel keys.
    for (const Config& config : configs) {
      if (!any_shared) break;
      for (const int clients : {1, config.clients}) {
        const std::string key = KernelKey(config, clients);
        if (!measured.insert(key).second) continue;
        const double rate =
            MeasureKernel(config.shape.elements() * clients, config.wire, baseline_threads);
        std::fprintf(stderr, "rep %d kernel alone %s, %d threads: %.1f M elem/s\n", rep,
                     key.c_str(), baseline_threads, rate / 1e6);
        kernel_rate[key] = std::max(rate, kernel_rate[key]);
      }
      if (!torch_python.empty()) torch_rate.emplace(config.shape.name, 0.0);
    }
    for (auto& [shape_name, rate] : torch_rate) {
      const Config& any = *std::find_if(configs.begin(), configs.end(), [&](const Config& c) {
        return c.shape.name == shape_name;
      });
      const TorchRate r = MeasureTorchFused(any.shape, baseline_threads, torch_python);
      std::fprintf(stderr,
                   "rep %d torch fused AdamW %s, %d threads: %.1f M elem/s (fastest step %.1f)\n",
                   rep, shape_name.c_str(), baseline_threads, r.mean / 1e6, r.best_step / 1e6);
      rate = std::max(rate, r.mean);
      torch_best_step[shape_name] = std::max(torch_best_step[shape_name], r.best_step);
    }
    if (absl::GetFlag(FLAGS_tcp)) {
      tcp_one_way.push_back(MeasureTcpOneWay(chunk, tcp_time).bytes_per_second);
      tcp_echo.push_back(MeasureTcpEcho(chunk, tcp_time).bytes_per_second);
      std::fprintf(stderr, "rep %d tcp: one-way %.2f GB/s, echo (both ways) %.2f GB/s\n", rep,
                   tcp_one_way.back() / 1e9, tcp_echo.back() / 1e9);
    }
    for (size_t i = 0; i < configs.size(); ++i) {
      Config& config = configs[i];
      const Measurement m = MeasureOptstate(config, daemon_pid);
      optstate[i].Add(m);
      std::fprintf(stderr, "rep %d %s %s x%d %s: optstate %.1f M elem/s, %.2f GB/s wire", rep,
                   config.shape.name.c_str(), config.wire_name.c_str(), config.clients,
                   config.plane_name.c_str(), m.elements / m.seconds / 1e6,
                   m.wire_bytes / m.seconds / 1e9);
      if (config.states.front()->echo) {
        const Measurement e = MeasureEcho(config, echo_pid);
        echo[i].Add(e);
        std::fprintf(stderr, "; echo %.2f GB/s", e.wire_bytes / e.seconds / 1e9);
        const Measurement r = MeasureRawEcho(config, echo_pid);
        raw_echo[i].Add(r);
        std::fprintf(stderr, "; raw echo %.2f GB/s", r.wire_bytes / r.seconds / 1e9);
      }
      if (config.states.front()->raw_adamw) {
        const Measurement a = MeasureRawAdamW(config, raw_adamw_pid, false);
        raw_adamw[i].Add(a);
        std::fprintf(stderr, "; raw adamw %.2f GB/s", a.wire_bytes / a.seconds / 1e9);
        const Measurement g = MeasureRawAdamW(config, raw_adamw_pid, true);
        raw_adamw_guarded[i].Add(g);
        std::fprintf(stderr, "; guarded %.2f GB/s", g.wire_bytes / g.seconds / 1e9);
      }
      std::fprintf(stderr, "\n");
    }
  }

  const double tcp1 =
      tcp_one_way.empty() ? 0 : *std::max_element(tcp_one_way.begin(), tcp_one_way.end());
  const double tcp2 = tcp_echo.empty() ? 0 : *std::max_element(tcp_echo.begin(), tcp_echo.end());
  if (!tcp_one_way.empty()) {
    std::printf(
        "tcp loopback (%zu B writes): one-way %.2f GB/s, echo (both directions) "
        "%.2f GB/s\n",
        chunk, tcp1 / 1e9, tcp2 / 1e9);
    std::printf("RESULT %s\n", Json({{"kind", Q("tcp")},
                                     {"chunk_bytes", N(chunk)},
                                     {"one_way_Bps", N(tcp1)},
                                     {"echo_Bps", N(tcp2)},
                                     {"one_way_reps", Rates(tcp_one_way)},
                                     {"echo_reps", Rates(tcp_echo)}})
                                   .c_str());
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& config = configs[i];
    const Measurement& m = optstate[i].best;
    std::vector<double> all_latencies = m.latencies_ms;
    const double eps = m.elements / m.seconds;
    const double wire = m.wire_bytes / m.seconds;
    const double cpu_ms = m.server_cpu_seconds / static_cast<double>(m.steps) * 1e3;
    const double client_cpu_ms = m.client_cpu_seconds / static_cast<double>(m.steps) * 1e3;
    std::printf(
        "%s %s clients=%d data_plane=%s: %.2f steps/s, %.1f M elem/s, wire %.2f GB/s, step p50 "
        "%.1f ms p99 %.1f ms, CPU ms/step: server %.1f, client %.1f",
        config.shape.name.c_str(), config.wire_name.c_str(), config.clients,
        config.plane_name.c_str(), m.steps / m.seconds, eps / 1e6, wire / 1e9,
        Percentile(all_latencies, 0.5), Percentile(all_latencies, 0.99), cpu_ms, client_cpu_ms);
    std::vector<std::pair<std::string, std::string>> fields = {
        {"kind", Q("e2e")},
        {"shape", Q(config.shape.name)},
        {"elements_per_step", N(static_cast<double>(config.shape.elements()))},
        {"wire", Q(config.wire_name)},
        {"clients", N(config.clients)},
        {"data_plane", Q(config.plane_name)},
        {"chunk_bytes", N(chunk)},
        {"steps_per_s", N(m.steps / m.seconds)},
        {"elem_per_s", N(eps)},
        {"wire_Bps", N(wire)},
        {"p50_ms", N(Percentile(all_latencies, 0.5))},
        {"p99_ms", N(Percentile(all_latencies, 0.99))},
        {"server_cpu_ms_per_step", N(daemon_pid > 0 ? cpu_ms : -1)},
        {"client_cpu_ms_per_step", N(client_cpu_ms)},
        {"elem_per_s_reps", Rates(optstate[i].rates)}};
    if (!echo[i].rates.empty()) {
      const Measurement& e = echo[i].best;
      const double echo_wire = e.wire_bytes / e.seconds;
      const double echo_cpu_ms = e.server_cpu_seconds / static_cast<double>(e.steps) * 1e3;
      const double echo_client_cpu_ms = e.client_cpu_seconds / static_cast<double>(e.steps) * 1e3;
      std::printf("; echo %.2f GB/s (CPU ms/step: server %.1f, client %.1f), optstate/echo %.2f",
                  echo_wire / 1e9, echo_cpu_ms, echo_client_cpu_ms, wire / echo_wire);
      fields.push_back({"echo_Bps", N(echo_wire)});
      fields.push_back({"echo_server_cpu_ms_per_step", N(echo_cpu_ms)});
      fields.push_back({"echo_client_cpu_ms_per_step", N(echo_client_cpu_ms)});
      fields.push_back({"echo_p50_ms", N(Percentile(e.latencies_ms, 0.5))});
      fields.push_back({"echo_elem_per_s_reps", Rates(echo[i].rates)});
    }
    if (!raw_echo[i].rates.empty()) {
      const Measurement& r = raw_echo[i].best;
      const double raw_wire = r.wire_bytes / r.seconds;
      const double raw_cpu_ms = r.server_cpu_seconds / static_cast<double>(r.steps) * 1e3;
      const double raw_client_cpu_ms = r.client_cpu_seconds / static_cast<double>(r.steps) * 1e3;
      std::printf(
          "; raw echo %.2f GB/s (CPU ms/step: server %.1f, client %.1f), "
          "optstate/raw echo %.2f",
          raw_wire / 1e9, raw_cpu_ms, raw_client_cpu_ms, wire / raw_wire);
      fields.push_back({"raw_echo_Bps", N(raw_wire)});
      fields.push_back({"raw_echo_server_cpu_ms_per_step", N(raw_cpu_ms)});
      fields.push_back({"raw_echo_client_cpu_ms_per_step", N(raw_client_cpu_ms)});
      fields.push_back({"raw_echo_elem_per_s_reps", Rates(raw_echo[i].rates)});
    }
    for (bool guarded : {false, true}) {
      const Best& floor = guarded ? raw_adamw_guarded[i] : raw_adamw[i];
      if (floor.rates.empty()) continue;
      const Measurement& a = floor.best;
      const std::string key = guarded ? "raw_adamw_guarded" : "raw_adamw";
      const double floor_wire = a.wire_bytes / a.seconds;
      const double floor_cpu_ms = a.server_cpu_seconds / static_cast<double>(a.steps) * 1e3;
      const double floor_client_cpu_ms = a.client_cpu_seconds / static_cast<double>(a.steps) * 1e3;
      std::printf("; %s %.2f GB/s (CPU ms/step: server %.1f, client %.1f), optstate/%s %.2f",
                  guarded ? "guarded raw adamw" : "raw adamw", floor_wire / 1e9, floor_cpu_ms,
                  floor_client_cpu_ms, guarded ? "guarded" : "raw adamw", wire / floor_wire);
      fields.push_back({key + "_Bps", N(floor_wire)});
      fields.push_back({key + "_server_cpu_ms_per_step", N(floor_cpu_ms)});
      fields.push_back({key + "_client_cpu_ms_per_step", N(floor_client_cpu_ms)});
      fields.push_back({key + "_p50_ms", N(Percentile(a.latencies_ms, 0.5))});
      fields.push_back({key + "_elem_per_s_reps", Rates(floor.rates)});
    }
    if (tcp2 > 0) {
      std::printf("; wire/tcp-echo %.2f, wire/tcp-one-way %.2f", wire / tcp2, wire / tcp1);
      fields.push_back({"tcp_echo_Bps", N(tcp2)});
      fields.push_back({"tcp_one_way_Bps", N(tcp1)});
    }
    std::printf("\nRESULT %s\n", Json(fields).c_str());
  }
  for (const auto& [key, rate] : kernel_rate) {
    std::printf("kernel alone %s, %d threads: %.1f M elem/s\n", key.c_str(), baseline_threads,
                rate / 1e6);
    std::printf("RESULT %s\n", Json({{"kind", Q("kernel_alone")},
                                     {"key", Q(key)},
                                     {"threads", N(baseline_threads)},
                                     {"elem_per_s", N(rate)}})
                                   .c_str());
  }
  for (const auto& [shape_name, rate] : torch_rate) {
    std::printf("torch fused AdamW %s, %d threads: %.1f M elem/s (its fastest step: %.1f)\n",
                shape_name.c_str(), baseline_threads, rate / 1e6,
                torch_best_step[shape_name] / 1e6);
    std::printf("RESULT %s\n", Json({{"kind", Q("torch_fused")},
                                     {"shape", Q(shape_name)},
                                     {"threads", N(baseline_threads)},
                                     {"elem_per_s", N(rate)},
                                     {"best_step_elem_per_s", N(torch_best_step[shape_name])}})
                                   .c_str());
  }
  // Each shared data plane against the wire (same shape, dtype and clients,
  // measured interleaved in the same reps), the kernel alone and torch.
  for (size_t i = 0; i < configs.size(); ++i) {
    if (configs[i].plane != DataPlane::kSharedMemory) continue;
    {
      const Config& a = configs[i];
      const Measurement& s = optstate[i].best;
      const double rate = s.elements / s.seconds;
      const double kernel = kernel_rate[KernelKey(a, 1)];
      const double kernel_all = kernel_rate[KernelKey(a, a.clients)];
      const double torch = torch_rate.count(a.shape.name) ? torch_rate[a.shape.name] : 0;
      std::printf(
          "%s %s clients=%d %s: %.1f M elem/s = %.2f x the kernel alone (%.1f), %.2f x torch "
          "fused (%.1f M elem/s, %d threads; 0 = not measured); CPU ms/step daemon %.1f + client "
          "%.1f\n",
          a.shape.name.c_str(), a.wire_name.c_str(), a.clients, a.plane_name.c_str(), rate / 1e6,
          kernel > 0 ? rate / kernel : 0, kernel / 1e6, torch > 0 ? rate / torch : 0, torch / 1e6,
          baseline_threads, s.server_cpu_seconds / static_cast<double>(s.steps) * 1e3,
          s.client_cpu_seconds / static_cast<double>(s.steps) * 1e3);
      if (a.clients > 1) {
        std::printf(
            "%s %s clients=%d %s: %.2f x the kernel alone over all %d clients' elements "
            "(%.1f M elem/s)\n",
            a.shape.name.c_str(), a.wire_name.c_str(), a.clients, a.plane_name.c_str(),
            kernel_all > 0 ? rate / kernel_all : 0, a.clients, kernel_all / 1e6);
      }
      std::printf(
          "RESULT %s\n",
          Json({{"kind", Q("shared_vs_local")},
                {"shape", Q(a.shape.name)},
                {"wire", Q(a.wire_name)},
                {"clients", N(a.clients)},
                {"data_plane", Q(a.plane_name)},
                {"elem_per_s", N(rate)},
                {"over_kernel_alone", N(kernel > 0 ? rate / kernel : 0)},
                {"over_kernel_alone_all_clients", N(kernel_all > 0 ? rate / kernel_all : 0)},
                {"over_torch_fused", N(torch > 0 ? rate / torch : 0)}})
              .c_str());
    }
    for (size_t j = 0; j < configs.size(); ++j) {
      const Config& a = configs[i];
      const Config& b = configs[j];
      if (b.plane != DataPlane::kWire || a.shape.name != b.shape.name ||
          a.wire_name != b.wire_name || a.clients != b.clients) {
        continue;
      }
      const Measurement& s = optstate[i].best;
      const Measurement& w = optstate[j].best;
      const double ratio = (s.elements / s.seconds) / (w.elements / w.seconds);
      const double steps_s = static_cast<double>(s.steps), steps_w = static_cast<double>(w.steps);
      std::printf(
          "%s %s clients=%d: %s/wire %.2f (CPU ms/step %s: server %.1f, "
          "client %.1f; wire: server %.1f, client %.1f)\n",
          a.shape.name.c_str(), a.wire_name.c_str(), a.clients, a.plane_name.c_str(), ratio,
          a.plane_name.c_str(), s.server_cpu_seconds / steps_s * 1e3,
          s.client_cpu_seconds / steps_s * 1e3, w.server_cpu_seconds / steps_w * 1e3,
          w.client_cpu_seconds / steps_w * 1e3);
      std::printf("RESULT %s\n", Json({{"kind", Q("data_plane_ratio")},
                                       {"shape", Q(a.shape.name)},
                                       {"wire", Q(a.wire_name)},
                                       {"clients", N(a.clients)},
                                       {"data_plane", Q(a.plane_name)},
                                       {"shared_memory_over_wire", N(ratio)}})
                                     .c_str());
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace optstate::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "optstate-bench: end-to-end step throughput against gRPC echo and raw TCP baselines.\n"
      "Usage: optstate-bench [--shape=lora7b,dense:N] [--wire=fp32,bf16] [--clients=1,8] ...");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_serve_echo)) return optstate::bench::ServeEcho();
  if (absl::GetFlag(FLAGS_serve_raw_adamw)) return optstate::bench::ServeRawAdamW();
  return optstate::bench::Main();
}
