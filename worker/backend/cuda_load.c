/* Finding and loading libmega_cuda.so (cuda_module.h). */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/backend/cuda_devices.h"
#include "worker/backend/cuda_module.h"

#define MODULE_FILE "libmega_cuda.so"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const mega_cuda_module *module;
static char why[600];

static void *try_open(const char *path, char *tried, size_t cap) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    size_t n = strlen(tried);
    snprintf(tried + n, cap - n, "%s%.200s (%.120s)", n ? "; " : "", path, e ? e : "?");
  }
  return h;
}

static void load(void) {
  char tried[480] = "", path[PATH_MAX];
  void *h = NULL;
  const char *env = getenv("MEGA_CUDA_MODULE");
  if (env && *env) h = try_open(env, tried, sizeof tried);
  if (!h) { /* beside the program: the build tree and an install alike */
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n > 0) {
      path[n] = '\0';
      char *slash = strrchr(path, '/');
      if (slash && (size_t)(slash - path) + sizeof "/" MODULE_FILE < sizeof path) {
        strcpy(slash + 1, MODULE_FILE);
        h = try_open(path, tried, sizeof tried);
      }
    }
  }
  if (!h) h = try_open(MODULE_FILE, tried, sizeof tried);
  if (!h) {
    snprintf(why, sizeof why, "the cuda module is not there: tried %s", tried);
    return;
  }
  const mega_cuda_module *m = dlsym(h, MEGA_CUDA_MODULE_SYMBOL);
  if (!m || m->abi != MEGA_CUDA_MODULE_ABI || m->ops_bytes != sizeof(mega_backend_ops)) {
    snprintf(why, sizeof why, "%s has %s (want ABI %d, ops of %zu bytes); rebuild mega",
             MODULE_FILE,
             !m ? "no " MEGA_CUDA_MODULE_SYMBOL
                : m->abi != MEGA_CUDA_MODULE_ABI ? "another ABI" : "another backend.h",
             MEGA_CUDA_MODULE_ABI, sizeof(mega_backend_ops));
    dlclose(h);
    return;
  }
  module = m; /* never closed: CUDA's libraries keep threads */
}

mega_status mega_cuda_module_load(const mega_cuda_module **out, mega_err *err) {
  pthread_once(&once, load);
  *out = module;
  if (module) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_UNSUPPORTED, "%s", why);
}

mega_status mega_backend_cuda_create(int device, mega_backend **out, mega_err *err) {
  *out = NULL;
  const mega_cuda_module *m;
  mega_status st = mega_cuda_module_load(&m, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "no CUDA device");
    return st;
  }
  if (m->device_count(err) < 1) return MEGA_ERR_UNSUPPORTED; /* err says "no CUDA device: ..." */
  return m->backend_create(device, out, err);
}

int mega_cuda_devices_describe(char *name, size_t cap) {
  const mega_cuda_module *m;
  mega_err err = {0};
  if (cap) name[0] = '\0';
  if (mega_cuda_module_load(&m, &err) != MEGA_OK) return 0;
  int n = m->device_count(&err);
  mega_cuda_device dev;
  if (n > 0 && m->device_info(0, &dev, &err) == MEGA_OK)
    snprintf(name, cap, "%d x %s (%.0f GiB)", n, dev.name, (double)dev.memory_bytes / (1u << 30));
  return n > 0 ? n : 0;
}
