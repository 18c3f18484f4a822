/* megactl nodes: the cluster as the answering megad sees it; `nodes forget`
 * drops a node gone for good from every view. */
#include <string.h>

#include "client/commands.h"
#include "client/conn.h"
#include "client/tables.h"
#include "proto/pb_json.h"

static int takes_name(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  (void)cmd;
  (void)argc;
  const char **name = ctx;
  if (megactl_is_flag(argv[*i]) || *name) return 0;
  *name = argv[(*i)++];
  return 1;
}

static void print_list(const char *what, char **v, size_t n) {
  if (!n) return;
  printf("%s:", what);
  for (size_t i = 0; i < n; i++) printf(" %s%s", v[i], i + 1 < n ? "," : "");
  printf("\n");
}

/* megactl nodes forget NAME */
static int forget(int argc, char **argv) {
  megactl_common cf;
  const char *name = NULL;
  int rc = megactl_parse_common("nodes forget", argc, argv, false, true, &cf, takes_name, &name);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl nodes forget NAME [--json] [--server ADDR]\n\n"
           "Drops node NAME, dead or left and gone for good, from the view of every live\n"
           "node: it is no longer listed, nor heartbeated. Refused while the node answers\n"
           "heartbeats (stop its megad first) or has ranks of a job. A node forgotten joins\n"
           "again when its megad starts again. Exits 1 unless every live node forgot it;\n"
           "nodes that are down themselves are named, and keep listing it.\n");
    return 0;
  }
  if (!name) return megactl_usage("nodes forget", "which node? give its name (megactl nodes)");
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__ForgetNodeRequest req = MEGA__V1__FORGET_NODE_REQUEST__INIT;
  req.node_id = (char *)name;
  if (megactl_unary(cf.server, &mega_control_forget_node, &req.base, MEGACTL_TIMEOUT_MS, &out,
                    &err) != MEGA_OK)
    return megactl_fail("%s", err.msg);
  const Mega__V1__ForgetNodeResponse *r = (const void *)out;
  rc = r->n_kept_by || r->n_unanswered ? MEGACTL_EXIT_FAIL : 0;
  if (cf.json) {
    int jr = megactl_print_json(mega_pb_json(out), JSON_INDENT(2));
    if (jr) rc = jr;
  } else {
    printf("node %s forgotten by: ", name);
    for (size_t i = 0; i < r->n_forgotten_by; i++)
      printf("%s%s", r->forgotten_by[i], i + 1 < r->n_forgotten_by ? ", " : "\n");
    print_list("kept by (each says why)", r->kept_by, r->n_kept_by);
    print_list("no answer from (they may still list it)", r->unanswered, r->n_unanswered);
    print_list("not asked, being down", r->down, r->n_down);
  }
  protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}

int megactl_nodes(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "forget")) return forget(argc - 1, argv + 1);
  megactl_common cf;
  int rc = megactl_parse_common("nodes", argc, argv, false, true, &cf, NULL, NULL);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl nodes [--json] [--server ADDR]\n"
           "       megactl nodes forget NAME [--server ADDR]\n\n"
           "Lists the nodes of the cluster as the answering megad sees them: id ('*' marks\n"
           "the one that answered), address, state, backend, slots used/total, device, time\n"
           "since its last heartbeat, its build of mega (megad --version), and the jobs with\n"
           "ranks on it; a line under the table says when the live nodes run more than one\n"
           "build (a job's ranks run one: README \"Upgrading\"). --json prints the\n"
           "ListNodesResponse message as JSON (fields under their mega.proto names).\n"
           "A node that died stays listed as dead (and is asked now and then whether it is\n"
           "back) until 'megactl nodes forget NAME' drops it: see its --help.\n");
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
