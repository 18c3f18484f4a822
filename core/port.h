/* TCP ports as people write them after "HOST:". One rule for every flag and
 * address that takes one (--listen, --server, --peers, --web-listen, etcd
 * endpoints): decimal digits only, no sign or spaces, at most 65535. gRPC
 * would bind 99999 as a random port, and atoi would take "7070x". */
#ifndef MEGA_CORE_PORT_H
#define MEGA_CORE_PORT_H

#include <stdbool.h>
#include <stddef.h>

/* Parses the n bytes at s as a port (0..65535) into *out. */
bool mega_port_parse(const char *s, size_t n, unsigned *out);

/* The port after addr's last colon, as mega_port_parse reads it. */
bool mega_port_of(const char *addr, unsigned *out);

#endif
