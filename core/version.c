/* mega_version for a program that does not name its commit (version.h). */
#include "core/version.h"

__attribute__((weak)) const char *mega_version(void) { return MEGA_VERSION; }
