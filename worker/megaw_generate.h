/* megaw generate (megaw_generate.c). */
#ifndef MEGA_WORKER_MEGAW_GENERATE_H
#define MEGA_WORKER_MEGAW_GENERATE_H

/* argv[0] is "generate"; returns megaw's exit status (2: a bad flag). */
int megaw_generate(int argc, char **argv);

#endif
