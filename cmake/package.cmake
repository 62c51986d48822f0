# Debian packages, written by `cpack` in the build folder (make package):
#   optstated_<version>_<arch>.deb        the daemon and optstate-probe (component daemon)
#   liboptstate-dev_<version>_<arch>.deb  the client's static libraries, headers,
#                                         CMake package and pkg-config file (component dev)
# Installed under /usr. Their dependencies are declared here, Debian 12's
# package names: tests/container/run.sh installs both into a clean debian:12
# image with apt, which brings only what is declared, and runs the daemon and
# a program built against the client there.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME optstate)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "AdamW optimizer state held and stepped for remote trainers")
set(CPACK_PACKAGE_CONTACT "optstate developers")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME optstated)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_COMPONENT_DAEMON_DESCRIPTION
  "optstated keeps AdamW optimizer state (m, v, fp32 master weights) in host memory and\n\
applies optimizer steps for remote trainers over gRPC; optstate-probe asks its\n\
grpc.health.v1 service whether it serves.")
# What optstated and optstate-probe load: gRPC 1.51 (libgrpc++, libgrpc,
# which bring their own dependencies), protobuf 3.21, Abseil 20220623,
# prometheus-cpp 1.0 (core and pull, which brings civetweb), OpenSSL 3, and the
# C and C++ runtimes; as dpkg-shlibdeps computes them for the two binaries on
# Debian 12.
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS
  "libabsl20220623 (>= 0~20220623.0-1), libc6 (>= 2.34), libgcc-s1 (>= 3.0), libgrpc++1.51 (>= 1.51.1), libgrpc29 (>= 1.51.1), libprometheus-cpp-core1.0 (>= 1.0.1), libprometheus-cpp-pull1.0 (>= 1.0.1), libprotobuf32 (>= 3.21.12), libssl3 (>= 3.0.0), libstdc++6 (>= 11)")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME liboptstate-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "The optstate C++ client as static libraries, with its headers, a CMake package\n\
(find_package(optstate CONFIG) gives optstate::client) and a pkg-config file.")
# What the client's headers include and its static libraries link, and the
# files find_package and pkg-config then look for. protobuf-compiler-grpc:
# Debian's gRPCConfig.cmake imports grpc_cpp_plugin and fails when it is
# missing, so find_package(optstate) would too.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "libgrpc++-dev (>= 1.51), libprotobuf-dev (>= 3.21), libabsl-dev (>= 0~20220623), libssl-dev (>= 3.0), protobuf-compiler-grpc")

include(CPack)
