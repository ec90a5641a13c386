/* NCCL loaded at run time: mlxcel links no NCCL, so that the build and the one-GPU runtime are
 * the same with and without it; a run that asks for more than one rank loads it here. */
#include "backend/backend.h"
#include "backend/nccl_abi.h"

#include <dlfcn.h>
#include <stdlib.h>

#define NCCL_SONAME "libnccl.so.2"

/* The entry point `name` into *slot; an error names it. */
static int need(be_nccl *n, const char *name, void **slot, base_err *err) {
    *slot = dlsym(n->lib, name);
    if (!*slot) return base_fail(err, "%s: no symbol %s", NCCL_SONAME, name);
    return 0;
}

int be_nccl_open(be_nccl **out, base_err *err) {
    *out = NULL;
    be_nccl *n = base_xcalloc(1, sizeof *n);
    n->lib = dlopen(NCCL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        free(n);
        return base_fail(err,
                         "NCCL not found (%s): install it, or put PyTorch's "
                         "site-packages/nvidia/nccl/lib on LD_LIBRARY_PATH",
                         NCCL_SONAME);
    }
    nccl_get_version_fn get_version;
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"ncclGetVersion", (void **)&get_version},
        {"ncclGetErrorString", (void **)&n->get_error_string},
        {"ncclCommInitAll", (void **)&n->comm_init_all},
        {"ncclCommDestroy", (void **)&n->comm_destroy},
        {"ncclCommAbort", (void **)&n->comm_abort},
        {"ncclCommGetAsyncError", (void **)&n->comm_get_async_error},
        {"ncclAllReduce", (void **)&n->all_reduce},
        {"ncclAllGather", (void **)&n->all_gather},
        {"ncclGroupStart", (void **)&n->group_start},
        {"ncclGroupEnd", (void **)&n->group_end},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (need(n, syms[i].name, syms[i].slot, err)) {
            be_nccl_close(n);
            return -1;
        }
    if (get_version(&n->version) != ncclSuccess || n->version < NCCL_ABI_MIN_VERSION) {
        int v = n->version;
        be_nccl_close(n);
        return base_fail(err, "%s: version %d is older than 2.10.3, whose interface mlxcel calls",
                         NCCL_SONAME, v);
    }
    *out = n;
    return 0;
}

void be_nccl_close(be_nccl *n) {
    if (!n) return;
    dlclose(n->lib);
    free(n);
}

int be_nccl_version(const be_nccl *n) {
    return n->version;
}
