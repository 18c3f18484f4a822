/* megactl nodes: the cluster as the answering megad sees it. */
#include <string.h>

#include "client/commands.h"
#include "client/conn.h"
#include "client/tables.h"
#include "proto/pb_json.h"

int megactl_nodes(int argc, char **argv) {
  megactl_common cf;
  int rc = megactl_parse_common("nodes", argc, argv, false, true, &cf, NULL, NULL);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl nodes [--json] [--server ADDR]\n\n"
           "Lists the nodes of the cluster as the answering megad sees them: id ('*' marks\n"
           "the one that answered), address, state, backend, slots used/total, device, time\n"
           "since its last heartbeat, and the jobs with ranks on it. --json prints the\n"
           "ListNodesResponse message as JSON (fields under their mega.proto names).\n");
    return 0;
  }
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  if (megactl_unary(cf.server, &mega_control_list_nodes, &req.base, MEGACTL_TIMEOUT_MS, &out, &err) != MEGA_OK) {
    rc = megactl_fail("%s", err.msg);
  } else {
    const Mega__V1__ListNodesResponse *r = (const void *)out;
    if (cf.json)
      rc = megactl_print_json(mega_pb_json(out), JSON_INDENT(2));
    else
      tables_nodes(stdout, r->nodes, r->n_nodes, r->self_node_id, megactl_now_ms());
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}
