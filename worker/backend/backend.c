/* What every backend shares. */
#include "worker/backend/backend.h"

void mega_backend_destroy(mega_backend *be) {
  if (be) be->ops->destroy(be);
}
