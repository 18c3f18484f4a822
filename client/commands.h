/* megactl's command groups, one file each. Each takes the arguments after
 * its name and returns the process exit status. */
#ifndef MEGA_CLIENT_COMMANDS_H
#define MEGA_CLIENT_COMMANDS_H


#endif
