// simpleKernel: the one kernel of simpleIPC.
//
// Every thread of a grid-stride loop writes `val` into the bytes of `ptr` it visits, so after a launch all
// `sz` bytes of the buffer hold `val`. Each child launches it on another process's buffer, through the
// mapping opened from that buffer's IPC handle.
//
// `extern "C"` keeps the symbol name unmangled: the host loads it by the name `simpleKernel`.
extern "C" __global__ void simpleKernel(char *ptr, int sz, char val)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    for (; idx < sz; idx += (gridDim.x * blockDim.x)) {
        ptr[idx] = val;
    }
}
