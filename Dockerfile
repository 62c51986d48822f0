# optstated image: built from Debian 12's gRPC/protobuf/Abseil packages.
# The CPU backend only: Debian ships no CUDA 13 toolkit (see docs/cuda.md for
# building the CUDA backend on a host with the toolkit).
FROM debian:12 AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN apt-get update -qq && bash scripts/install-deps.sh
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DOPTSTATE_WITH_CUDA=OFF \
      -DOPTSTATE_BUILD_BENCH=OFF \
 && cmake --build build -j "$(nproc)" --target optstated

FROM debian:12-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libgrpc++1.51 libprotobuf32 \
      libabsl20220623 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 optstate
COPY --from=build /src/build/server/optstated /usr/local/bin/optstated
USER optstate
EXPOSE 50051
# Listens on every interface inside the container; publish the port with care.
ENTRYPOINT ["/usr/local/bin/optstated", "--listen=0.0.0.0:50051"]
