/* Whether users other than a directory's owner, its group and root may make
 * or swap names in it: the rule megad holds its state directory and the
 * roots of what jobs touch to (daemon/base.c, daemon/model/roots.c). */
#ifndef MEGA_CORE_DIRPERM_H
#define MEGA_CORE_DIRPERM_H

/* Why anyone may make names in a directory of this mode (st_mode bits):
 * "sticky, like /tmp" when world-writable and sticky (others may add names
 * but not move or remove ones they do not own), "anyone may write" when
 * world-writable alone; NULL when only its owner and group may. */
const char *mega_dir_others_write(unsigned mode);

#endif
