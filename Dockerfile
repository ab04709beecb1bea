# simple-ipc in an image:   docker build -t simple-ipc .   then   docker run --rm --gpus all simple-ipc
# The image itself is not built in CI (no container engine runs there); tests/docs.rs checks what can be
# checked without one: the glibc the binary needs against the base image's, and that the commands here and in
# README's docker examples are the program's own.

# The build: the Rust of Cargo.toml's rust-version, on Debian bookworm.
FROM rust:1.88-bookworm AS build
# glibc: 2.36
WORKDIR /src
# The crates it uses first, in a layer that only Cargo.toml and Cargo.lock decide, so that a change to anything
# else (a doc, the source) builds this crate again and none of the others: a stand-in of the package (the same
# manifest, empty sources, and the bench the manifest names) is built, and its own artifacts removed, so that
# the real one below is built whole. BuildKit's RUN --mount=type=cache would keep target/ too, but needs
# BuildKit; this works with any builder.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs benches/barrier.rs \
    && cargo build --release --locked \
    && cargo clean --release --package simple-ipc \
    && rm -r src benches
COPY . .
# The git revision for --version, where the context has no .git: --build-arg SIMPLE_IPC_REVISION=$(git
# rev-parse --short HEAD). No nvcc here, so the committed PTX of the kernel is embedded: it needs an NVIDIA
# driver of CUDA 13.0 (580) or newer on the host.
ARG SIMPLE_IPC_REVISION=
RUN NVCC=none cargo build --release --locked \
    && install -m 0755 target/release/simple-ipc /usr/local/bin/simple-ipc

# The run: an NVIDIA CUDA base image (Ubuntu 24.04), whose glibc is newer than the build's. `--gpus` (the
# NVIDIA Container Toolkit) mounts the host's driver, libcuda.so, into the container; the program loads it at
# run time.
FROM nvidia/cuda:13.0.0-base-ubuntu24.04
# glibc: 2.39
LABEL org.opencontainers.image.title="simple-ipc" \
      org.opencontainers.image.description="CUDA inter-process communication on one node: NVIDIA's simpleIPC, as a smoke test" \
      simple-ipc.base-glibc="2.39"
COPY --from=build /usr/local/bin/simple-ipc /usr/local/bin/simple-ipc
# It runs as root, the base image's user: the check needs no root (it runs as any user, with `docker run --user`
# or Kubernetes' runAsUser, the same on both sides of a served run), but the socket directory of a hostPath
# that the kubelet makes is root's, a capability a pod adds (SYS_PTRACE, for --fds pidfd) reaches root only, and
# --isolate makes namespaces (README, "An image").
ENTRYPOINT ["simple-ipc"]
# Every mechanism, each in a run of its own, then the table; other arguments run otherwise.
CMD ["--ipc", "all"]
