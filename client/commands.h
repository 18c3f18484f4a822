/* megactl's command groups, one file each. Each takes the arguments after
 * its name and returns the process exit status. */
#ifndef MEGA_CLIENT_COMMANDS_H
#define MEGA_CLIENT_COMMANDS_H

int megactl_plan(int argc, char **argv);

#endif
