// ipc-floor.cu: the floor that scripts/compare.sh measures simple-ipc against: the least program doing the
// IPC work of simple-ipc's default run, in C with the CUDA runtime, without any of its robustness (no
// watchdog, no guardian, no checks of the shared segment, no messages but a failure's).
//
//   ipc-floor N     N processes over the visible GPUs (N a multiple of their count), process k on GPU
//                   k / (N / count), as `simple-ipc --procs-per-device N/count` places them.
//
// The same work as simple-ipc (and NVIDIA's simpleIPC): the parent forks the N children before it touches
// CUDA, then allocates one 64 MiB buffer and one interprocess event per process, exports their IPC handles
// into shared memory, and enables peer access between the GPUs. Each child, meanwhile, starts CUDA on its
// GPU, makes a non-blocking stream and pins a host buffer; once the handles are there it opens every buffer
// and event; at step i it writes buffer (i + id) % N with simpleKernel (the project's own, from kernels/),
// after its stream waited on that buffer's event, records the event, and meets the others at a
// sense-reversal barrier; at the end it waits on its own buffer's event, copies its buffer back and checks
// that every byte is (id + 1) % N. The parent waits for the children, then synchronizes, destroys and frees.
// Exit 0 when every child verified its buffer, 1 otherwise.
//
// As simple-ipc does, it asks for one hardware work queue per process (CUDA_DEVICE_MAX_CONNECTIONS=1 unless
// it is set). A failed CUDA call in a child stops every process (a flag in the shared memory), and a child
// dies with the parent (PR_SET_PDEATHSIG), so that a comparison never hangs. The driver's files of its
// events are removed, as simple-ipc removes its own (below).
//
// Build (scripts/compare.sh does it): nvcc -O2 -arch=native -o ipc-floor scripts/floor/ipc-floor.cu
// It is not part of the cargo or CMake build.
#include <cuda_runtime.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kernels/simple_kernel.cu"

#define MAX_PROCESSES 32
#define DATA_SIZE (64 << 20)
#define THREADS_PER_BLOCK 128

// The shared memory of the run, mapped before the fork.
struct Shared {
    int ready;   // 1 once the parent exported every handle
    int failed;  // 1 once any process failed: everyone stops
    int count;   // the barrier's counter
    int sense;   // the barrier's sense
    cudaIpcMemHandle_t memory[MAX_PROCESSES];
    cudaIpcEventHandle_t event[MAX_PROCESSES];
};

static struct Shared *shared;
static pid_t parent;

// The driver backs each interprocess event with a file /dev/shm/cuda.shm.<n>.<exporter's pid, hex>.<m>,
// which it leaves behind (NVIDIA's sample leaves one at every run); simple-ipc removes its own, and so does
// this program: the files named with its pid.
static void remove_event_files(void) {
    char mine[32];
    snprintf(mine, sizeof mine, ".%x.", (unsigned)getpid());
    DIR *dir = opendir("/dev/shm");
    if (!dir) return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        const char *name = entry->d_name;
        if (strncmp(name, "cuda.shm.", 9) != 0) continue;
        const char *pid = strchr(name + 9, '.');
        if (pid && strncmp(pid, mine, strlen(mine)) == 0) unlinkat(dirfd(dir), name, 0);
    }
    closedir(dir);
}

static void fail(const char *what) {
    fprintf(stderr, "ipc-floor (pid %d): %s\n", (int)getpid(), what);
    if (shared) __atomic_store_n(&shared->failed, 1, __ATOMIC_RELEASE);
    if (getpid() == parent) remove_event_files();
    _exit(1);
}

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            char what_[512];                                                                         \
            snprintf(what_, sizeof what_, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                \
                     cudaGetErrorString(e_));                                                        \
            fail(what_);                                                                             \
        }                                                                                            \
    } while (0)

// Waits until *flag is value; leaves if another process failed.
static void wait_for(int *flag, int value) {
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != value) {
        if (__atomic_load_n(&shared->failed, __ATOMIC_ACQUIRE)) _exit(1);
        sched_yield();
    }
}

// The sample's barrier: check in (the last sets the sense), check out (the last clears it).
static void barrier(int n) {
    if (__atomic_add_fetch(&shared->count, 1, __ATOMIC_ACQ_REL) == n)
        __atomic_store_n(&shared->sense, 1, __ATOMIC_RELEASE);
    wait_for(&shared->sense, 1);
    if (__atomic_sub_fetch(&shared->count, 1, __ATOMIC_ACQ_REL) == 0)
        __atomic_store_n(&shared->sense, 0, __ATOMIC_RELEASE);
    wait_for(&shared->sense, 0);
}

// The GPU of process k: processes grouped by GPU, as simple-ipc plans them.
static int device_of(int k, int n) {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count < 1 || n % count != 0) fail("N must be a multiple of the number of visible GPUs");
    return k / (n / count);
}

static int child(int id, int n) {
    int device = device_of(id, n);
    CHECK(cudaSetDevice(device));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int per_sm = 0, multiprocessors = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, simpleKernel, THREADS_PER_BLOCK, 0));
    CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    int blocks = per_sm * multiprocessors;
    uint64_t *host;
    CHECK(cudaMallocHost((void **)&host, DATA_SIZE));

    wait_for(&shared->ready, 1);
    char *buffers[MAX_PROCESSES];
    cudaEvent_t events[MAX_PROCESSES];
    for (int j = 0; j < n; j++) {
        CHECK(cudaIpcOpenMemHandle((void **)&buffers[j], shared->memory[j], cudaIpcMemLazyEnablePeerAccess));
        CHECK(cudaIpcOpenEventHandle(&events[j], shared->event[j]));
    }

    for (int i = 0; i < n; i++) {
        int buffer = (i + id) % n;
        CHECK(cudaStreamWaitEvent(stream, events[buffer], 0));
        simpleKernel<<<blocks, THREADS_PER_BLOCK, 0, stream>>>(buffers[buffer], DATA_SIZE, (char)id);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(events[buffer], stream));
        barrier(n);
    }

    CHECK(cudaStreamWaitEvent(stream, events[id], 0));
    CHECK(cudaMemcpyAsync(host, buffers[id], DATA_SIZE, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    uint64_t expected = 0x0101010101010101ULL * (uint64_t)((id + 1) % n), differ = 0;
    for (size_t w = 0; w < DATA_SIZE / sizeof(uint64_t); w++) differ |= host[w] ^ expected;
    if (differ) fail("verification failed: the buffer does not hold the last writer's value");

    for (int j = 0; j < n; j++) {
        CHECK(cudaIpcCloseMemHandle(buffers[j]));
        CHECK(cudaEventDestroy(events[j]));
    }
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(host));
    return 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    if (n < 1 || n > MAX_PROCESSES) {
        fprintf(stderr, "usage: ipc-floor N (1 to %d processes over the visible GPUs)\n", MAX_PROCESSES);
        return 1;
    }
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 0);
    shared = (struct Shared *)mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("ipc-floor: mmap");
        return 1;
    }
    memset(shared, 0, sizeof *shared);

    // The children first, before this process touches CUDA (a forked child cannot use a parent's CUDA).
    parent = getpid();
    pid_t children[MAX_PROCESSES];
    for (int k = 0; k < n; k++) {
        pid_t pid = fork();
        if (pid < 0) fail("fork failed");
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            _exit(child(k, n));
        }
        children[k] = pid;
    }

    char *buffers[MAX_PROCESSES];
    cudaEvent_t events[MAX_PROCESSES];
    for (int k = 0; k < n; k++) {
        CHECK(cudaSetDevice(device_of(k, n)));
        CHECK(cudaMalloc((void **)&buffers[k], DATA_SIZE));
        CHECK(cudaIpcGetMemHandle(&shared->memory[k], buffers[k]));
        CHECK(cudaEventCreateWithFlags(&events[k], cudaEventDisableTiming | cudaEventInterprocess));
        CHECK(cudaIpcGetEventHandle(&shared->event[k], events[k]));
    }
    __atomic_store_n(&shared->ready, 1, __ATOMIC_RELEASE);

    // Peer access between the GPUs, as simple-ipc and the sample set it up (the children open their
    // handles with lazy peer access, so this is off their path).
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    for (int a = 0; a < count; a++) {
        for (int b = 0; b < count; b++) {
            int can = 0;
            if (a == b) continue;
            CHECK(cudaDeviceCanAccessPeer(&can, a, b));
            if (!can) fail("the GPUs are not peer capable with each other");
            CHECK(cudaSetDevice(a));
            cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
            else CHECK(e);
        }
    }

    int failed = 0;
    for (int k = 0; k < n; k++) {
        int status = 0;
        if (waitpid(children[k], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed = 1;
            __atomic_store_n(&shared->failed, 1, __ATOMIC_RELEASE);
        }
    }
    for (int k = 0; k < n; k++) {
        CHECK(cudaSetDevice(device_of(k, n)));
        CHECK(cudaEventSynchronize(events[k]));
        CHECK(cudaEventDestroy(events[k]));
        CHECK(cudaFree(buffers[k]));
    }
    remove_event_files();
    if (failed) fprintf(stderr, "ipc-floor: a process failed\n");
    return failed;
}
