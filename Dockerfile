# optstated image, from Debian 12's gRPC/protobuf/Abseil packages: the CPU
# backend (Debian ships no CUDA 13 toolkit; Dockerfile.cuda builds the CUDA
# one). Built as `make` builds: scripts/install-deps.sh, then `make
# install-daemon`, which configures as every make target does and puts the
# daemon in place with cmake --install.
#   docker build -t optstate/optstated:latest .                    the daemon
#   docker build --target trainer -t optstate/example-trainer .    the example trainer
FROM debian:12 AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN apt-get update -qq && bash scripts/install-deps.sh
COPY . .
RUN make install-daemon BUILD_DIR=/src/build CMAKE_ARGS=-DOPTSTATE_WITH_CUDA=OFF \
      PREFIX=/usr/local DESTDIR=/stage

# The runtime: the shared libraries the daemon links (gRPC, protobuf,
# Abseil, prometheus-cpp for --metrics_listen), and its user and group
# (10001:10001, which compose and Kubernetes name). State lives in
# /var/lib/optstate, owned by that user (a named volume mounted there takes
# the ownership on first use).
FROM debian:12-slim AS runtime
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libgrpc++1.51 libprotobuf32 \
      libabsl20220623 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 optstate \
 && useradd --system --uid 10001 --gid optstate --home-dir /var/lib/optstate --no-create-home \
      optstate \
 && install -d -o optstate -g optstate -m 0750 /var/lib/optstate

# The example trainer (examples/train_linear_regression.cc), for
# deploy/docker-compose.yml's trainer service.
FROM runtime AS trainer
COPY --from=build /stage/usr/local/bin/train_linear_regression /usr/local/bin/
RUN install -d -o optstate -g optstate -m 0750 /var/lib/trainer
USER optstate
ENTRYPOINT ["/usr/local/bin/train_linear_regression"]

FROM runtime
COPY --from=build /stage/usr/local/bin/optstated /stage/usr/local/bin/optstate-probe \
     /usr/local/bin/
USER optstate
VOLUME /var/lib/optstate
EXPOSE 50051
# SIGTERM: optstated stops taking steps, answers the ones in flight, writes a
# final checkpoint and exits 0; give it the time that takes (compose:
# stop_grace_period, Kubernetes: terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["/usr/local/bin/optstate-probe", "--addr=127.0.0.1:50051", "--service=optstate.v1.OptimizerState"]
# Listens on every interface inside the container; publish the port with care.
# Plaintext on the container's network (--allow_insecure_remote): give
# --tls_cert/--tls_key (docs/security.md) where that network is not trusted.
ENTRYPOINT ["/usr/local/bin/optstated", "--listen=0.0.0.0:50051", "--allow_insecure_remote", \
            "--state_dir=/var/lib/optstate"]
