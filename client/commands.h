/* megactl's command groups, one file each. Each takes the arguments after
 * its name and returns the process exit status. */
#ifndef MEGA_CLIENT_COMMANDS_H
#define MEGA_CLIENT_COMMANDS_H

int megactl_plan(int argc, char **argv);

/* The cluster commands (client/jobs.c, watch.c, nodes.c, trace_cmd.c,
 * version.c): they talk to megad; client/conn.h has what they share. */
int megactl_submit(int argc, char **argv);
int megactl_status(int argc, char **argv);
int megactl_ls(int argc, char **argv);
int megactl_cancel(int argc, char **argv);
int megactl_resume(int argc, char **argv);
int megactl_rescale(int argc, char **argv);
int megactl_watch(int argc, char **argv);
int megactl_nodes(int argc, char **argv);
int megactl_trace(int argc, char **argv);
/* client/version.c: megactl's build and the answering megad's */
int megactl_version(int argc, char **argv);
/* client/etcd_dump.c: etcd, not megad */
int megactl_etcd_dump(int argc, char **argv);

#endif
