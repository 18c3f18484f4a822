/* Opening the files of a checkpoint or a cache without following a
 * symbolic link anywhere on the way. Workers write and read them as megad's
 * user; whoever may write a directory on the way could swap a name for a
 * link between megad's check and the worker's open. The directory a job
 * names may be a link on purpose: megaw resolves it once, at start
 * (realpath), and from then on every component must be a real directory or
 * a plain file. Paths are walked one component at a time from "/" (or from
 * the working directory), each opened with O_NOFOLLOW relative to the one
 * before. A link found on the way fails with errno ELOOP and its path in
 * link (cap bytes; may be NULL). */
#ifndef MEGA_CORE_NOFOLLOW_H
#define MEGA_CORE_NOFOLLOW_H

#include <stddef.h>
#include <sys/types.h>

/* openat(dir of path, last name, flags | O_NOFOLLOW | O_CLOEXEC, mode). */
int mega_nf_open(const char *path, int flags, mode_t mode, char *link, size_t cap);
/* A plain file for reading (O_RDONLY): a link is ELOOP, anything but a
 * regular file (a directory, a FIFO, a device) EINVAL, not opened
 * blocking. */
int mega_nf_open_file(const char *path, char *link, size_t cap);
/* The directory holding path's last name, as an O_PATH fd for *at calls;
 * that name (what follows the last '/', "." when none) goes to name. */
int mega_nf_parent(const char *path, char *name, size_t namecap, char *link, size_t cap);
/* A new file for writing (O_WRONLY): whatever stood at the name (an
 * older copy, a link) is unlinked first, then made with O_CREAT | O_EXCL,
 * so nothing is written through a link or into another name's inode. */
int mega_nf_create(const char *path, mode_t mode, char *link, size_t cap);
/* fsync(2) of path, a file or a directory, opened as mega_nf_open does:
 * what makes a rename durable is the directory's fsync after it. 0, or -1
 * and errno. */
int mega_nf_fsync(const char *path, char *link, size_t cap);
/* mkdir -p, without following a link; an existing directory is fine. */
int mega_nf_mkdirs(const char *path, mode_t mode, char *link, size_t cap);
/* The directory a job names, resolved once (realpath: the links the user
 * gave are followed here, and only here); one still to be made resolves
 * through its nearest existing parent. malloc'd; NULL and errno when it
 * cannot be resolved. */
char *mega_nf_resolve(const char *path);
/* Why a mega_nf_ call failed with errno e, into buf: "PATH is a symbolic
 * link", "not a plain file" or strerror(e). */
const char *mega_nf_why(int e, const char *link, char *buf, size_t cap);

#endif
