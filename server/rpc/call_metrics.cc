#include "server/rpc/call_metrics.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/server_context.h"

namespace optstate {

CallMetrics::CallMetrics(const std::vector<std::string>& methods) {
  for (const std::string& name : methods) {
    if (by_path_.contains(absl::StrCat("/", name))) continue;
    by_path_.emplace(absl::StrCat("/", name), methods_.size());
    methods_.push_back(std::make_unique<Method>());
    methods_.back()->name = name;
  }
  methods_.push_back(std::make_unique<Method>());
  methods_.back()->name = std::string(kOtherMethod);
}

std::vector<std::string> CallMetrics::MethodsOfServices(const std::vector<std::string>& services) {
  std::vector<std::string> methods;
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const std::string& service : services) {
    const google::protobuf::ServiceDescriptor* descriptor = pool->FindServiceByName(service);
    if (descriptor == nullptr) continue;
    for (int i = 0; i < descriptor->method_count(); ++i) {
      methods.push_back(absl::StrCat(service, "/", descriptor->method(i)->name()));
    }
  }
  return methods;
}

size_t CallMetrics::MethodIndex(absl::string_view path) const {
  auto it = by_path_.find(path);
  if (it == by_path_.end() && !path.empty() && path.front() != '/') {
    it = by_path_.find(absl::StrCat("/", path));
  }
  return it == by_path_.end() ? methods_.size() - 1 : it->second;
}

void CallMetrics::Finished(size_t method, int code, absl::Duration duration) {
  if (code < 0 || code >= kStatusCodes) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  methods_[method]->durations[code].Observe(duration);
}

namespace {

class CallMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  CallMetricsInterceptor(CallMetrics* metrics, size_t method, grpc::ServerContextBase* context)
      : metrics_(metrics), method_(method), context_(context), started_(absl::Now()) {
    metrics_->Started(method_);
  }
  ~CallMetricsInterceptor() override {
    if (!finished_) {
      metrics_->Finished(method_, static_cast<int>(grpc::StatusCode::CANCELLED),
                         absl::Now() - started_);
    }
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS) &&
        !finished_) {
      finished_ = true;
      // A status sent after the client cancelled (or its deadline passed)
      // never reaches it: a reactor that ends a cancelled stream with OK, or
      // a health Watch its client ended, would count as OK or UNKNOWN.
      const int code = context_ != nullptr && context_->IsCancelled()
                           ? static_cast<int>(grpc::StatusCode::CANCELLED)
                           : static_cast<int>(methods->GetSendStatus().error_code());
      metrics_->Finished(method_, code, absl::Now() - started_);
    }
    methods->Proceed();
  }

 private:
  CallMetrics* const metrics_;
  const size_t method_;
  grpc::ServerContextBase* const context_;  // The call's; gRPC's, alive as long as the call.
  const absl::Time started_;
  // Written only at PRE_SEND_STATUS (once per call), read there and by the
  // destructor, which gRPC runs after every hook point of the call.
  bool finished_ = false;
};

class CallMetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallMetricsInterceptorFactory(CallMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallMetricsInterceptor(metrics_, metrics_->MethodIndex(info->method()),
                                      info->server_context());
  }

 private:
  CallMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeCallMetricsInterceptorFactory(CallMetrics* metrics) {
  return std::make_unique<CallMetricsInterceptorFactory>(metrics);
}

}  // namespace optstate
